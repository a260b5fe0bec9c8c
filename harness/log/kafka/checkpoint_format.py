"""The records of a partition checkpoint in ``<prefix>.snapshots`` (pure: no Kafka here).

Snapshots partition p holds, for sessions partition p:

* DIRECTORY PARTS, key ``directory/<p>/<part id>``: ``{"v": 2, "part": id, "ended":
  [[session id, first position], ...]}``. A part is written once and never again: a
  session's first position never changes, so what a part says stays true, and its key
  (a new id each time) is never overwritten, so compaction keeps it.
* CHUNKS, key ``checkpoint/<p>/<i>``: ``{"v": 2, "id": <checkpoint id>, "i": i,
  "sessions": {id: [[seq, base64 record], ...]}, "ended": [[id, first], ...]}``: the
  live sessions' records and the ended sessions in no part yet (the unsealed ones).
  Rewritten by every checkpoint; compaction keeps the latest of each key.
* the HEADER, key ``checkpoint/<p>``, written last: ``{"v": 2, "id", "covers",
  "chunks": n, "first": <offset of chunk 0>, "directory": [[part id, offset], ...]}``,
  and ``"reread": [session id, ...]`` when there are any (``Checkpoint.reread``: parked
  sessions whose verdicts are not all written; a new owner reads them whole).

A checkpoint thus costs the live sessions and the unsealed entries (at most about
``SEAL_BYTES``) plus, now and then, one new part: not every session the partition ever
had, as version 1 did (its chunks held the whole ended map; still read).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from harness.log.base import Checkpoint
from harness.records import LogEntry

__all__ = [
    "CHUNK_BYTES",
    "SEAL_BYTES",
    "VERSION",
    "Plan",
    "chunk_key",
    "decode",
    "header_key",
    "header_value",
    "part_key",
    "plan",
]

VERSION = 2
CHUNK_BYTES = 512 * 1024
"""Largest chunk or part value: well under the broker's default message.max.bytes (1 MiB)."""
SEAL_BYTES = 256 * 1024
"""The unsealed entries become a new directory part once they take this much room, so a
checkpoint rewrites at most about this much of the ended sessions."""
_ENTRY_OVERHEAD = 16  # JSON punctuation and the position of one [id, first] pair


def header_key(partition: int) -> bytes:
    return f"checkpoint/{partition}".encode()


def chunk_key(partition: int, i: int) -> bytes:
    return f"checkpoint/{partition}/{i}".encode()


def part_key(partition: int, part_id: str) -> bytes:
    return f"directory/{partition}/{part_id}".encode()


def _dumps(value: Mapping[str, Any]) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def _entry_bytes(sid: str) -> int:
    return len(sid) + _ENTRY_OVERHEAD


@dataclass(frozen=True, slots=True)
class Plan:
    """What one checkpoint writes, in this order: ``parts`` (new directory parts: id,
    key, value, entries), then ``chunks`` (key, value), then the header."""

    parts: list[tuple[str, bytes, bytes]]
    chunks: list[tuple[bytes, bytes]]
    sealed: int
    """How many of the checkpoint's unsealed entries the new parts hold."""


def plan(
    partition: int,
    checkpoint: Checkpoint,
    checkpoint_id: str,
    encode_entry: Callable[[LogEntry], bytes],
    new_part_id: Callable[[], str],
) -> Plan:
    """The parts and chunks of ``checkpoint`` (``encode_entry``: a record's bytes)."""
    unsealed: Sequence[tuple[str, int]] = (
        list(checkpoint.ended.items()) if checkpoint.unsealed is None else checkpoint.unsealed
    )
    parts: list[tuple[str, bytes, bytes]] = []
    sealed = 0
    if sum(_entry_bytes(sid) for sid, _ in unsealed) >= SEAL_BYTES:
        for group in _groups(unsealed, CHUNK_BYTES):
            part_id = new_part_id()
            parts.append((part_id, part_key(partition, part_id),
                          _dumps({"v": VERSION, "part": part_id, "ended": [list(e) for e in group]})))
        sealed, unsealed = len(unsealed), ()
    chunks: list[dict[str, Any]] = []
    current: dict[str, Any] = {"sessions": {}, "ended": []}
    size = 0
    for sid, entries in checkpoint.sessions.items():
        items = [(e.seq, base64.b64encode(encode_entry(e)).decode("ascii")) for e in entries]
        cost = sum(len(text) + 16 for _, text in items) + len(sid) + 8
        if size and size + cost > CHUNK_BYTES:
            chunks.append(current)
            current, size = {"sessions": {}, "ended": []}, 0
        current["sessions"][sid] = items
        size += cost
    for sid, first in unsealed:
        if size + _entry_bytes(sid) > CHUNK_BYTES:
            chunks.append(current)
            current, size = {"sessions": {}, "ended": []}, 0
        current["ended"].append([sid, first])
        size += _entry_bytes(sid)
    chunks.append(current)
    return Plan(
        parts=parts,
        chunks=[
            (chunk_key(partition, i), _dumps({"v": VERSION, "id": checkpoint_id, "i": i, **chunk}))
            for i, chunk in enumerate(chunks)
        ],
        sealed=sealed,
    )


def _groups(entries: Sequence[tuple[str, int]], limit: int) -> Iterable[Sequence[tuple[str, int]]]:
    start, size = 0, 0
    for i, (sid, _) in enumerate(entries):
        cost = _entry_bytes(sid)
        if size and size + cost > limit:
            yield entries[start:i]
            start, size = i, 0
        size += cost
    if start < len(entries):
        yield entries[start:]


def header_value(
    checkpoint_id: str, covers: int, chunks: int, first: int, directory: Sequence[tuple[str, int]],
    reread: Sequence[str] = (),
) -> bytes:
    value: dict[str, Any] = {
        "v": VERSION, "id": checkpoint_id, "covers": covers, "chunks": chunks, "first": first,
        "directory": [list(part) for part in directory],
    }
    if reread:  # (absent: none; a reader that predates it reads none, as before)
        value["reread"] = list(reread)
    return _dumps(value)


def decode(
    partition: int,
    header: Mapping[str, Any],
    values: Mapping[tuple[bytes, int], bytes],
    decode_record: Callable[[bytes], Any],
    have: frozenset[str] = frozenset(),
) -> Checkpoint | None:
    """The checkpoint ``header`` names, from ``values`` ((key, offset) -> value: the
    records read); None if something it names is missing (written by half, compacted
    away) or it is of another version.

    ``have``: ids of directory parts the caller holds already; their entries are left
    out of ``ended`` (the checkpoint's ``directory`` still names them).
    """
    version = header.get("v")
    if version not in (1, VERSION):
        return None
    cid, count = header["id"], header["chunks"]
    mine: dict[int, Mapping[str, Any]] = {}
    chunk_prefix = f"checkpoint/{partition}/".encode()
    for (key, _offset), value in values.items():
        if key.startswith(chunk_prefix):
            chunk = json.loads(value)
            if chunk.get("id") == cid and chunk.get("v", 1) == version:
                mine[chunk["i"]] = chunk
    if sorted(mine) != list(range(count)):
        return None
    ended: dict[str, int] = {}
    directory: list[tuple[str, int]] = []
    for part_id, offset in header.get("directory", ()):
        directory.append((part_id, int(offset)))
        if part_id in have:
            continue
        raw = values.get((part_key(partition, part_id), int(offset)))
        if raw is None:
            return None
        ended.update((sid, int(first)) for sid, first in json.loads(raw)["ended"])
    sessions: dict[str, list[LogEntry]] = {}
    unsealed: list[tuple[str, int]] = []
    for i in range(count):
        chunk = mine[i]
        for sid, items in chunk["sessions"].items():
            sessions[sid] = [LogEntry(seq, decode_record(base64.b64decode(b))) for seq, b in items]
        unsealed.extend((sid, int(first)) for sid, first in chunk["ended"])
    ended.update(unsealed)
    return Checkpoint(
        covers=int(header["covers"]), sessions=sessions, ended=ended,
        directory=tuple(directory), unsealed=tuple(unsealed),
        reread=tuple(str(sid) for sid in header.get("reread", ())),
    )
