"""Corrupt bytes in a SQLite log (issue 7): every stored record is verified when read.

A random bit flip anywhere in the file is either detected (a ``CorruptRecord`` at its
position, or the file refused as ``LogUnavailable``) or harmless (every read gives the
very same records): never a silently changed value, such as a recovered charge of 900
instead of 100.
"""

from __future__ import annotations

import random
import sqlite3
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from harness import HarnessHost, define_harness, durable_tool, tool_definition
from harness.codec import default_codec
from harness.errors import CorruptRecord, LogUnavailable
from harness.log.sqlite import SqliteLog
from harness.records import InputMessage, StepResult

from .conftest import Args, call, script

FLIPS = 160


async def _build(path: Path) -> None:
    async def checkout(args: Args, ctx: Any) -> Any:
        charge = await ctx.step.do(f"charge:{args.order_id}", lambda: {"amount": 100, "id": f"ch_{args.order_id}"})
        await ctx.step.do("invoice", lambda: {"sent": True, "to": "a@example.com"})
        ctx.append([{"type": "order.paid", "order": args.order_id, "amount": 100}])
        return charge

    t = durable_tool(tool_definition(name="checkout", description="d", input_schema=Args), checkout)
    async with HarnessHost(log=SqliteLog(path)) as host:
        for i in range(6):
            model = script([call(f"c{i}", "checkout", order_id=str(100 + i))], f"paid {i}")
            session = await host.open(define_harness(name="shop", model=model, tools=[t]), session_id=f"s-{i}")
            assert (await session.send(f"check out {i}", input_id="in-1")).outcome == "completed"
        await host.log.close()


async def _read_everything(path: Path) -> tuple[str, list[Any], list[Any]]:
    log = SqliteLog(path, busy_timeout=1)
    try:
        sessions = [[(e.seq, e.record) for e in await log.read(f"s-{i}")] for i in range(6)]
        everything = [(e.seq, e.record) for e in await log.read_all()]
        return log.namespace, sessions, everything
    finally:
        await log.close()


async def test_every_random_bit_flip_is_detected_or_harmless(tmp_path):
    original = tmp_path / "shop.db"
    await _build(original)
    assert not Path(str(original) + "-wal").exists() or Path(str(original) + "-wal").stat().st_size == 0
    baseline = await _read_everything(original)
    assert sum(len(s) for s in baseline[1]) > 50
    data = original.read_bytes()
    rng = random.Random(20261130)
    outcomes = {"detected": 0, "harmless": 0}
    for n in range(FLIPS):
        offset = rng.randrange(len(data))
        bit = 1 << rng.randrange(8)
        copy = tmp_path / f"flip-{n}.db"
        copy.write_bytes(data[:offset] + bytes([data[offset] ^ bit]) + data[offset + 1 :])
        try:
            got = await _read_everything(copy)
        except (CorruptRecord, LogUnavailable):
            outcomes["detected"] += 1
        else:
            assert got == baseline, f"a flip of bit {bit} at byte {offset} changed what was read"
            outcomes["harmless"] += 1
        for suffix in ("", "-wal", "-shm"):
            Path(str(copy) + suffix).unlink(missing_ok=True)
    assert outcomes["detected"] > 0, outcomes


async def test_a_flipped_value_names_its_position(tmp_path):
    path = tmp_path / "one.db"
    log = SqliteLog(path)
    writer = await log.claim("A", owner="w", lease=timedelta(seconds=30))
    [entry] = await writer.append([StepResult("A", 1, "c1", "charge", {"amount": 100})])
    await log.close()
    raw = path.read_bytes()
    text = b'"amount":100'
    at = raw.index(text) + len(b'"amount":')
    path.write_bytes(raw[:at] + b"9" + raw[at + 1 :])  # 100 -> 900
    log = SqliteLog(path)
    try:
        with pytest.raises(CorruptRecord) as caught:
            await log.read("A")
        assert caught.value.seq == entry.seq and caught.value.session_id == "A"
        assert "checksum" in str(caught.value)
    finally:
        await log.close()


async def test_a_record_missing_from_a_sessions_chain_is_detected(tmp_path):
    path = tmp_path / "chain.db"
    log = SqliteLog(path)
    for i in range(3):
        await log.submit(InputMessage("A", i, f"in-{i}", "hi"))
    await log.close()
    with sqlite3.connect(path) as raw:  # as if an index entry no longer found the middle row
        raw.execute("UPDATE records SET session_id = 'Z' WHERE seq = 2")
    log = SqliteLog(path)
    try:
        with pytest.raises(CorruptRecord) as caught:
            await log.read("A")
        assert caught.value.seq in (2, 3)
    finally:
        await log.close()


async def test_a_schema_1_file_is_upgraded_with_checksums(tmp_path):
    path = tmp_path / "v1.db"
    codec = default_codec()
    with sqlite3.connect(path) as raw:
        raw.executescript(
            """
            CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
            CREATE TABLE records (seq INTEGER PRIMARY KEY AUTOINCREMENT, session_id TEXT NOT NULL,
                                  type TEXT NOT NULL, value BLOB NOT NULL);
            CREATE INDEX records_session_seq ON records (session_id, seq);
            CREATE TABLE owners (session_id TEXT PRIMARY KEY, owner TEXT, epoch INTEGER NOT NULL, lease_until REAL);
            INSERT INTO meta VALUES ('namespace', 'ns-old'), ('schema_version', '1');
            """
        )
        for sid, text in [("A", "one"), ("B", "two"), ("A", "three")]:
            record = InputMessage(sid, 0, f"in-{text}", text)
            raw.execute("INSERT INTO records (session_id, type, value) VALUES (?, ?, ?)", (sid, record.TYPE, codec.encode(record)))
    log = SqliteLog(path)
    try:
        assert log.namespace == "ns-old"
        assert [e.record.text for e in await log.read("A")] == ["one", "three"]
        await log.submit(InputMessage("A", 0, "in-four", "four"))
        assert [e.record.text for e in await log.read("A")] == ["one", "three", "four"]
    finally:
        await log.close()
    with sqlite3.connect(path) as raw:
        raw.execute("UPDATE records SET value = ? WHERE seq = 3", (codec.encode(InputMessage("A", 0, "in-three", "THREE")),))
    log = SqliteLog(path)
    try:
        with pytest.raises(CorruptRecord):
            await log.read("A")
    finally:
        await log.close()


@pytest.mark.parametrize("value", [3.5, 7])
async def test_a_value_that_is_no_longer_a_blob_is_a_corrupt_record(tmp_path, value):
    """A changed byte in a row's header can make its BLOB a number or NULL: that row is
    unreadable at its position (it was a TypeError out of the read, which stopped it)."""
    path = tmp_path / "one.db"
    log = SqliteLog(path)
    writer = await log.claim("A", owner="w", lease=timedelta(seconds=30))
    [entry] = await writer.append([StepResult("A", 1, "c1", "charge", {"amount": 100})])
    await log.close()
    with sqlite3.connect(path) as raw:
        raw.execute("UPDATE records SET value = ? WHERE seq = ?", (value, entry.seq))
    log = SqliteLog(path)
    try:
        with pytest.raises(CorruptRecord) as caught:
            await log.read("A")
        assert caught.value.seq == entry.seq and "not a blob" in str(caught.value)
    finally:
        await log.close()
