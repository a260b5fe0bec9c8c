"""Where a session's history starts in its partition, so a whole-history read never
starts at the partition's first offset.

A partition's checkpoint (``<prefix>.snapshots``, written by the worker that owns it)
accounts for every session with a record at or below its ``covers`` position: a live
session with all its records, an ended one with the position of its first record. A
:class:`PartitionIndex` starts from the latest checkpoint and grows with every read of the
partition that starts inside what it accounts for: such a read sees every record's key
(reads filter by key on the client), so the first offset of each new session is learned
for free, and the index then accounts for everything up to where the read stopped. A
shared tail of the process that follows the partition teaches it the same way as it
reads (``follow``): a session it has not seen then starts where the tail is, at the
partition's end, so a read of a new session fetches nothing.

``history(session_id)`` answers ``(records, start)``: the session's records held by the
checkpoint and the offset to read the rest from. A session it has never seen has no
record below ``position``, so its history starts there. :class:`Indexes` keeps one per
partition, each loaded once (however many readers ask at once) and given the latest
checkpoint again every ``INDEX_REFRESH_S``. No Kafka here: the checkpoint reader is
passed in.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence

from harness.log.base import Checkpoint, LogEntry

__all__ = ["INDEX_REFRESH_S", "Indexes", "KeyObserver", "PartitionIndex"]

log = logging.getLogger("harness.log.kafka")

INDEX_REFRESH_S = 60.0
"""An index takes in the partition's latest checkpoint again when older than this (a
shorter read for sessions it has not seen since)."""


class KeyObserver:
    """Filled by a read (``read_range(observe=...)``): the first offset of each key it saw
    and the offset it covered up to (every committed record below ``stop`` was seen)."""

    __slots__ = ("first", "start", "stop")

    def __init__(self, start: int) -> None:
        self.start = start
        self.stop = start
        self.first: dict[bytes, int] = {}

    def saw(self, key: bytes | None, offset: int) -> None:
        if key is not None and key not in self.first:
            self.first[key] = offset


class PartitionIndex:
    """First positions of one partition's sessions, as far as this process knows them."""

    def __init__(self, checkpoint: Checkpoint | None, *, loaded_at: float) -> None:
        self.loaded_at = loaded_at
        self.covers = 0  # offset: the checkpoint's records are those below it
        self.position = 0  # offset: every session with a record below it is in ``first`` or ``live``
        self.live: Mapping[str, Sequence[LogEntry]] = {}
        self.first: dict[str, int] = {}
        self.parts: set[str] = set()  # the checkpoints' directory parts taken in (not read again)
        if checkpoint is not None:
            self.merge(checkpoint, loaded_at=loaded_at)

    def merge(self, checkpoint: Checkpoint, *, loaded_at: float) -> None:
        """Take a (newer) checkpoint in; an older one changes nothing."""
        self.loaded_at = loaded_at
        if checkpoint.covers <= self.covers:
            return
        self.covers = checkpoint.covers  # a seq covers offsets below it: the same number
        self.live = dict(checkpoint.sessions)
        for sid, entries in checkpoint.sessions.items():
            if entries:
                self._learn(sid, entries[0].seq - 1)
        for sid, first in checkpoint.ended.items():
            # 0 = a session the checkpoint's writer held no records of: from the start.
            self._learn(sid, max(0, first - 1))
        # (a part read before is left out of ended: Indexes passes self.parts as ``have``)
        self.parts.update(part_id for part_id, _ in checkpoint.directory)
        self.position = max(self.position, self.covers)

    def _learn(self, sid: str, offset: int) -> None:
        known = self.first.get(sid)
        if known is None or offset < known:
            self.first[sid] = offset

    def history(self, session_id: str) -> tuple[list[LogEntry], int]:
        """``(records held here, offset to read the rest from)`` of the session's whole history."""
        live = self.live.get(session_id)
        if live is not None:
            return list(live), self.covers
        first = self.first.get(session_id)
        return [], self.position if first is None else first

    def follow(self, covered: int, complete_from: int, newest_first: Iterable[tuple[bytes | None, int]]) -> None:
        """Learn from a tail that saw every committed record below ``covered``: the keys and
        offsets of those from ``complete_from`` on, newest first (a tail's ring of recent
        records). A tail whose ring no longer reaches back to ``position`` teaches nothing."""
        if covered <= self.position or self.position < complete_from:
            return
        observed = KeyObserver(self.position)
        for key, offset in newest_first:
            if offset < observed.start:
                break
            if key is not None:
                observed.first[key] = offset  # newest first: the last one written is the first
        observed.stop = covered
        self.observe(observed)

    def observe(self, observed: KeyObserver) -> None:
        """Learn from a read of ``[observed.start, observed.stop)``; a read that starts
        beyond ``position`` would leave a hole, so it teaches nothing."""
        if observed.start > self.position or observed.stop <= self.position:
            return
        for key, offset in observed.first.items():
            if offset >= self.position:  # below it, every session is known already
                self._learn(key.decode("utf-8", "replace"), offset)
        self.position = observed.stop


class Indexes:
    """The :class:`PartitionIndex` of each partition read, loaded on first use.

    Args:
        checkpoint: reads a partition's latest checkpoint (None if there is none),
            leaving out the directory parts named (those the index took in already).
    """

    def __init__(self, checkpoint: Callable[[int, frozenset[str]], Awaitable[Checkpoint | None]]) -> None:
        self._checkpoint = checkpoint
        self._indexes: dict[int, PartitionIndex] = {}
        self._loading: dict[int, asyncio.Task[PartitionIndex]] = {}

    def known(self, partition: int) -> PartitionIndex | None:
        """The partition's index if it was loaded (reads teach it), else None."""
        return self._indexes.get(partition)

    async def get(self, partition: int) -> PartitionIndex:
        index = self._indexes.get(partition)
        if index is not None and time.monotonic() - index.loaded_at < INDEX_REFRESH_S:
            return index
        loop = asyncio.get_running_loop()
        loading = self._loading.get(partition)
        if loading is None or loading.get_loop() is not loop or loading.done():
            # One checkpoint read per partition, however many readers ask at once.
            loading = self._loading[partition] = loop.create_task(self._load(partition))
        return await asyncio.shield(loading)

    async def _load(self, partition: int) -> PartitionIndex:
        now = time.monotonic()
        index = self._indexes.get(partition)
        try:
            checkpoint = await self._checkpoint(partition, frozenset(index.parts) if index is not None else frozenset())
        except Exception as exc:  # noqa: BLE001 - an optimisation only: read more instead
            log.warning("checkpoint of partition %s unreadable (%s); reading from what is known", partition, exc)
            checkpoint = None
        index = self._indexes.get(partition)
        if index is None:
            index = self._indexes[partition] = PartitionIndex(checkpoint, loaded_at=now)
        elif checkpoint is not None:
            index.merge(checkpoint, loaded_at=now)
        else:
            index.loaded_at = now
        return index
