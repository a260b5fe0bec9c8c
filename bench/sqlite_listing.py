"""``harness sessions`` on a long-lived SQLite file: the listing that reads a few record
types, and the one that uses stored summaries, against the one that reads every record.

    python bench/sqlite_listing.py [--sessions 15000] [--live 200] [--rounds 3] [--path /tmp/listing.db]

The file is ``bench/sqlite_restart.py``'s (~13.5 records a session; ``--live`` parked on
an open ``step.ask``). A copy of it gets the stored summaries of its quiet sessions
through the worker's own path (``SummaryWriter``, a batch at a time, the live sessions
left out: timed as ``store_s``), then ``--stale`` of them get a new input (their rows no
longer used). Each round times a first listing (``SessionIndex``, as ``list_sessions``
and a gateway's first ``GET /v1/sessions`` make it) the three ways, in alternation (this
machine's speed moves), and checks that all list the same JSON. Last line:
``records=<n> sessions=<n> full_s=<best> quick_s=<best> stored_s=<best> store_s=<s> same=<bool>``.
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
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import HARNESS_NAME, table
from bench.sqlite_restart import build


class _FullRead:
    """The log without ``scan_listing``: the index reads every record (the path before)."""

    def __init__(self, log: Any) -> None:
        self._log = log

    async def scan(self, *args: Any, **kwargs: Any) -> Any:
        return await self._log.scan(*args, **kwargs)


async def _store(path: str, live: set[str], stale: int, ts: int) -> tuple[float, int, int]:
    """Stored summaries for the quiet sessions, as a worker writes them (``live`` left out);
    then ``stale`` of them get a new input. (seconds, batches, rows)."""
    from harness.log.sqlite import SqliteLog
    from harness.runtime.stored_summaries import SummaryWriter

    log = SqliteLog(path)
    try:
        writer = SummaryWriter(log)
        batches = 0
        started = time.perf_counter()
        while writer.more:
            await writer.batch(live)
            batches += 1
        took = time.perf_counter() - started
    finally:
        await log.close()
    await _stale(path, stale, ts)
    return took, batches, writer.written


async def _stale(path: str, stale: int, ts: int) -> None:
    """A new input for ``stale`` of the ended sessions."""
    from harness.log.sqlite import SqliteLog
    from harness.records import InputMessage

    log = SqliteLog(path)
    try:
        for k in range(stale):
            sid = f"done-{k * 7}"
            handle = await log.claim(sid, owner="bench", lease=60)
            await handle.append([InputMessage(sid, ts, f"again-{k}", "more", HARNESS_NAME)])
            await handle.release()
    finally:
        await log.close()


async def _listing(path: str, full: bool, now: int) -> tuple[float, list[dict[str, Any]]]:
    from harness.cli.common import open_log_for
    from harness.runtime.catalog import SessionIndex, sort_summaries

    log = await open_log_for(f"sqlite:///{path}", role="reader")
    try:
        index = SessionIndex(_FullRead(log) if full else log)  # type: ignore[arg-type]
        started = time.perf_counter()
        listed = sort_summaries(await index.summaries(now_ms=now))
        took = time.perf_counter() - started
    finally:
        await log.close()
    return took, [s.to_json() for s in listed]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=15_000)
    parser.add_argument("--live", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--stale", type=int, default=150, help="sessions given a new input after their row")
    parser.add_argument("--path", default="/tmp/harness-bench-listing.db")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)
    records = build(args.path, args.sessions, args.live)
    print(f"{records:,} records of {args.sessions + args.live:,} sessions ({os.path.getsize(args.path) / 1e6:.0f} MB)",
          flush=True)
    stored_path = args.path + ".stored.db"
    for suffix in ("", "-wal", "-shm"):
        Path(stored_path + suffix).unlink(missing_ok=True)
    source, copy = sqlite3.connect(args.path), sqlite3.connect(stored_path)
    source.backup(copy)  # (with what its WAL holds)
    source.close()
    copy.close()
    live = {f"live-{k}" for k in range(args.live)}
    now = int(time.time() * 1000)
    store_s, batches, rows = asyncio.run(_store(stored_path, live, args.stale, now - 1000))
    print(f"{rows:,} stored summaries written in {batches} batches, {store_s:.2f} s "
          f"({1000 * store_s / max(1, batches):.0f} ms a batch); {args.stale} of them stale", flush=True)
    if args.stale:  # the same new inputs in the file without rows
        asyncio.run(_stale(args.path, args.stale, now - 1000))
    full: list[float] = []
    quick: list[float] = []
    stored: list[float] = []
    same = True
    for _ in range(args.rounds):
        took_full, listed_full = asyncio.run(_listing(args.path, True, now))
        took_quick, listed_quick = asyncio.run(_listing(args.path, False, now))
        took_stored, listed_stored = asyncio.run(_listing(stored_path, False, now))
        full.append(took_full)
        quick.append(took_quick)
        stored.append(took_stored)
        same = same and listed_full == listed_quick == listed_stored
    print(table(("listing", "best (s)", "each round (s)"), [
        ("every record read and folded", f"{min(full):.2f}", " ".join(f"{t:.2f}" for t in full)),
        ("a few types read, busy sessions whole", f"{min(quick):.2f}", " ".join(f"{t:.2f}" for t in quick)),
        ("stored summaries, the others as above", f"{min(stored):.2f}", " ".join(f"{t:.2f}" for t in stored)),
    ]))
    print(f"records={records} sessions={args.sessions + args.live} full_s={min(full):.2f} "
          f"quick_s={min(quick):.2f} stored_s={min(stored):.2f} store_s={store_s:.2f} same={same}")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
