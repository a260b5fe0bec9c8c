"""The records of a partition checkpoint (harness.log.kafka.checkpoint_format, pure):
what one checkpoint writes stays bounded however many sessions the partition ever had."""

from __future__ import annotations

import itertools
import json

from harness.codec import default_codec
from harness.log.base import Checkpoint
from harness.log.kafka import checkpoint_format as fmt
from harness.records import LogEntry, StepResult

CODEC = default_codec()


def entry(seq: int, session: str) -> LogEntry:
    return LogEntry(seq, StepResult(session, 0, "call", f"s{seq}", seq))


def part_ids():
    counter = itertools.count()
    return lambda: f"p{next(counter)}"


def store(partition: int, plan: fmt.Plan, values: dict, offset: int, cid: str, covers: int,
          directory: tuple = ()) -> tuple[dict, tuple, int]:
    """Lay a plan's records out at offsets as a broker would: (values, directory, next offset)."""
    new_parts = []
    for part_id, key, value in plan.parts:
        values[(key, offset)] = value
        new_parts.append((part_id, offset))
        offset += 1
    first = offset
    for key, value in plan.chunks:
        values[(key, offset)] = value
        offset += 1
    directory = (*directory, *new_parts)
    header = json.loads(fmt.header_value(cid, covers, len(plan.chunks), first, directory))
    return header, directory, offset


def sizes(plan: fmt.Plan) -> tuple[int, int]:
    return sum(len(v) for _, _, v in plan.parts), sum(len(v) for _, v in plan.chunks)


def test_a_checkpoint_reads_back_as_written() -> None:
    cp = Checkpoint(covers=100, sessions={"live": [entry(40, "live"), entry(90, "live")]},
                    ended={"a": 7, "b": 12})
    plan = fmt.plan(0, cp, "c1", lambda e: CODEC.encode(e.record), part_ids())
    assert plan.parts == [] and plan.sealed == 0  # a few ended sessions stay in the chunks
    values: dict = {}
    header, _, _ = store(0, plan, values, 0, "c1", 100)
    back = fmt.decode(0, header, values, CODEC.decode)
    assert back is not None
    assert back.covers == 100 and back.sessions == cp.sessions and back.ended == cp.ended
    assert back.directory == () and back.unsealed == (("a", 7), ("b", 12))


def test_ended_sessions_are_sealed_into_parts_written_once_and_later_checkpoints_stay_small() -> None:
    ended = {f"session-{i:06d}": i * 10 + 1 for i in range(30_000)}
    cp = Checkpoint(covers=400_000, sessions={"live": [entry(399_990, "live")]}, ended=ended)
    plan = fmt.plan(3, cp, "c1", lambda e: CODEC.encode(e.record), part_ids())
    assert plan.sealed == len(ended) and len(plan.parts) >= 2
    assert all(len(v) <= fmt.CHUNK_BYTES for _, _, v in plan.parts)
    values: dict = {}
    header, directory, offset = store(3, plan, values, 0, "c1", 400_000)
    assert fmt.decode(3, header, values, CODEC.decode).ended == ended  # type: ignore[union-attr]
    first_parts, first_chunks = sizes(plan)

    # The next checkpoint: 50 more ended. It names the parts and rewrites only the new ones.
    more = {f"later-{i}": 400_000 + i for i in range(50)}
    nxt = Checkpoint(covers=401_000, sessions={}, ended={**ended, **more}, directory=directory,
                     unsealed=tuple(more.items()))
    plan2 = fmt.plan(3, nxt, "c2", lambda e: CODEC.encode(e.record), part_ids())
    assert plan2.parts == [] and plan2.sealed == 0
    parts2, chunks2 = sizes(plan2)
    assert parts2 == 0 and chunks2 < first_parts / 100  # what changed, not everything ever
    header2, _, _ = store(3, plan2, values, offset, "c2", 401_000, directory)
    back = fmt.decode(3, header2, values, CODEC.decode)
    assert back is not None and back.ended == {**ended, **more} and back.directory == directory
    assert back.unsealed == tuple(more.items())
    assert first_chunks > 0


def test_a_reader_holding_some_parts_gets_only_the_rest() -> None:
    ended = {f"s{i:06d}": i + 1 for i in range(20_000)}
    plan = fmt.plan(0, Checkpoint(covers=30_000, sessions={}, ended=ended), "c", lambda e: b"", part_ids())
    values: dict = {}
    header, directory, _ = store(0, plan, values, 100, "c", 30_000)
    held = frozenset(part_id for part_id, _ in directory[:-1])
    back = fmt.decode(0, header, values, CODEC.decode, have=held)
    assert back is not None and back.directory == directory
    last_part = json.loads(values[(fmt.part_key(0, directory[-1][0]), directory[-1][1])])["ended"]
    assert back.ended == {sid: first for sid, first in last_part}


def test_a_checkpoint_missing_a_part_or_a_chunk_is_not_taken() -> None:
    ended = {f"s{i:06d}": i + 1 for i in range(20_000)}
    plan = fmt.plan(0, Checkpoint(covers=30_000, sessions={}, ended=ended), "c", lambda e: b"", part_ids())
    values: dict = {}
    header, directory, _ = store(0, plan, values, 0, "c", 30_000)
    without_part = {k: v for k, v in values.items() if k != (fmt.part_key(0, directory[0][0]), directory[0][1])}
    assert fmt.decode(0, header, without_part, CODEC.decode) is None
    without_chunk = {k: v for k, v in values.items() if not k[0].startswith(b"checkpoint/0/")}
    assert fmt.decode(0, header, without_chunk, CODEC.decode) is None


def test_a_version_1_checkpoint_is_still_read() -> None:
    chunk = {"v": 1, "id": "old", "i": 0, "sessions": {}, "ended": [["x", 5], ["y", 9]]}
    values = {(fmt.chunk_key(2, 0), 40): json.dumps(chunk).encode()}
    header = {"v": 1, "id": "old", "covers": 50, "chunks": 1, "first": 40}
    back = fmt.decode(2, header, values, CODEC.decode)
    assert back is not None and back.ended == {"x": 5, "y": 9} and back.unsealed == (("x", 5), ("y", 9))
    assert fmt.decode(2, {**header, "v": 9}, values, CODEC.decode) is None


def test_the_sessions_to_read_again_read_back_and_an_older_header_has_none() -> None:
    """``reread``: parked sessions whose verdicts are not all written (a new owner reads
    them whole); a header without it (written before it existed) names none."""
    cp = Checkpoint(covers=100, sessions={}, ended={"bad": 7, "b": 12}, reread=("bad",))
    plan = fmt.plan(0, cp, "c1", lambda e: CODEC.encode(e.record), part_ids())
    values: dict = {}
    store(0, plan, values, 0, "c1", 100)
    header = json.loads(fmt.header_value("c1", 100, len(plan.chunks), 0, (), cp.reread))
    back = fmt.decode(0, header, values, CODEC.decode)
    assert back is not None and back.reread == ("bad",) and back.ended == cp.ended
    header.pop("reread")
    assert fmt.decode(0, header, values, CODEC.decode).reread == ()
