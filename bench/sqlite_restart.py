"""A worker's restart and ``harness sessions`` on a long-lived SQLite file.

    python bench/sqlite_restart.py [--sessions 15000] [--live 200] [--path /tmp/restart.db]

Builds a file like a soak's (``--sessions`` sessions, ~13.5 records each: half of them
one finished turn, half two; ``--live`` of them parked on an open ``step.ask``), then:

* ``restart (no checkpoint)``: a ``Worker`` on the file until it is ready (its first
  start reads the whole file, and writes a checkpoint, if this harness has them);
* ``restart (checkpoint)``: a second ``Worker`` on the same file until it is ready, plus
  ``--tail`` (2,000) new records written meanwhile that it reads after the checkpoint;
* ``harness sessions``: ``list_sessions`` on the file opened read-only, as the CLI does.

Both restarts must drive the same live sessions. Last line:
``records=<n> sessions=<n> restart_full_s=<s> restart_checkpoint_s=<s> listing_s=<s>``.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sqlite3
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import HARNESS_NAME, ended_session, open_ask_session, table
from harness.records import InputMessage, InputSettled, TurnFinished, TurnStarted


def session_records(sid: str, i: int, ts: int) -> list:
    records = ended_session(sid, ts)
    if i % 2:  # a second turn
        second = ended_session(sid, ts + 1000)
        input_id = f"in2-{sid}"
        for k, record in enumerate(second):
            if isinstance(record, InputMessage):
                second[k] = InputMessage(sid, ts + 1000, input_id, "steps=1", HARNESS_NAME)
            elif isinstance(record, TurnStarted):
                second[k] = TurnStarted(sid, ts + 1000, input_id, 2)
            elif isinstance(record, TurnFinished):
                second[k] = TurnFinished(sid, ts + 1000, input_id, 2, "completed", "done")
            elif isinstance(record, InputSettled):
                second[k] = InputSettled(sid, ts + 1000, input_id, "completed")
        records += second
    return records


def build(path: str, sessions: int, live: int) -> int:
    """The file, written in one transaction as a worker would have written it over time."""
    from harness.codec import default_codec
    from harness.log import _encode_batch
    from harness.log.sqlite import SqliteLog
    from harness.log.sqlite_schema import append_rows

    for suffix in ("", "-wal", "-shm"):
        Path(path + suffix).unlink(missing_ok=True)
    SqliteLog(path)  # its tables and namespace (closed with the process)
    codec = default_codec()
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("BEGIN IMMEDIATE")
    ts = int(time.time() * 1000) - 3_600_000
    every = max(1, sessions // max(1, live))
    count = 0
    for i in range(sessions):
        if i % every == 0 and i // every < live:
            sid, records = f"live-{i // every}", open_ask_session(f"live-{i // every}", ts + i)
            count += len(records)
            append_rows(db, sid, _encode_batch(codec, sid, records))
        sid = f"done-{i}"
        records = session_records(sid, i, ts + i)
        count += len(records)
        append_rows(db, sid, _encode_batch(codec, sid, records))
    db.execute("COMMIT")
    db.close()
    return count


async def restart(path: str) -> tuple[float, int]:
    """Seconds from a ``Worker``'s start to ready, and the sessions it drives."""
    from bench.apps import bench
    from harness import Worker, open_log

    log = open_log(f"sqlite:///{path}")
    worker = Worker(log=log, harnesses=[bench], drain_timeout=0)
    stop = asyncio.Event()
    started = time.perf_counter()
    run = asyncio.create_task(worker.run(stop))
    await worker.ready.wait()
    took = time.perf_counter() - started
    driven = len(worker.runtime(0).sessions)
    await asyncio.sleep(0.5)  # its sessions park on their asks again
    stop.set()
    await run
    await log.close()
    return took, driven


async def tail(path: str, records: int) -> None:
    """``records`` more records (new sessions' inputs) after the checkpoint."""
    from harness import open_log

    log = open_log(f"sqlite:///{path}")
    ts = int(time.time() * 1000)
    for k in range(records // 9):
        sid = f"tail-{k}"
        writer = await log.claim(sid, owner="bench", lease=__import__("datetime").timedelta(seconds=30))
        await writer.append(session_records(sid, 0, ts))
        await writer.release()
    await log.close()


async def listing(path: str) -> tuple[float, int]:
    from harness.cli.common import open_log_for
    from harness.runtime.catalog import list_sessions

    log = await open_log_for(f"sqlite:///{path}", role="reader")
    started = time.perf_counter()
    listed = await list_sessions(log)
    took = time.perf_counter() - started
    await log.close()
    return took, len(listed)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=15_000)
    parser.add_argument("--live", type=int, default=200)
    parser.add_argument("--tail", type=int, default=2_000)
    parser.add_argument("--path", default="/tmp/harness-bench-restart.db")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    t0 = time.perf_counter()
    records = build(args.path, args.sessions, args.live)
    print(f"{records:,} records of {args.sessions + args.live:,} sessions written in "
          f"{time.perf_counter() - t0:.0f} s ({os.path.getsize(args.path) / 1e6:.0f} MB)", flush=True)
    full_s, full_driven = asyncio.run(restart(args.path))
    asyncio.run(tail(args.path, args.tail))
    ckpt_s, ckpt_driven = asyncio.run(restart(args.path))
    list_s, listed = asyncio.run(listing(args.path))
    print(table(("what", "seconds", "sessions"), [
        ("restart (no checkpoint)", f"{full_s:.2f}", f"{full_driven} driven"),
        ("restart (checkpoint + tail)", f"{ckpt_s:.2f}", f"{ckpt_driven} driven"),
        ("harness sessions", f"{list_s:.2f}", f"{listed} listed"),
    ]))
    if full_driven != ckpt_driven:
        print(f"MISMATCH: {full_driven} sessions driven after a full read, {ckpt_driven} after the checkpoint")
        return 1
    print(f"records={records} sessions={args.sessions + args.live} restart_full_s={full_s:.2f} "
          f"restart_checkpoint_s={ckpt_s:.2f} listing_s={list_s:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
