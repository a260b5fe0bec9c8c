"""``harness sessions`` on a long-lived SQLite file: the listing that reads a few record
types against the one that reads every record, side by side.

    python bench/sqlite_listing.py [--sessions 15000] [--live 200] [--rounds 3] [--path /tmp/listing.db]

The file is ``bench/sqlite_restart.py``'s (~13.5 records a session; ``--live`` parked on
an open ``step.ask``). Each round times a first listing (``SessionIndex``, as
``list_sessions`` and a gateway's first ``GET /v1/sessions`` make it) both ways, in
alternation (this machine's speed moves), and checks that both list the same JSON.
Last line: ``records=<n> sessions=<n> full_s=<best> quick_s=<best> same=<bool>``.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import table
from bench.sqlite_restart import build


class _FullRead:
    """The log without ``scan_listing``: the index reads every record (the path before)."""

    def __init__(self, log: Any) -> None:
        self._log = log

    async def scan(self, *args: Any, **kwargs: Any) -> Any:
        return await self._log.scan(*args, **kwargs)


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
    parser.add_argument("--path", default="/tmp/harness-bench-listing.db")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)
    records = build(args.path, args.sessions, args.live)
    print(f"{records:,} records of {args.sessions + args.live:,} sessions ({os.path.getsize(args.path) / 1e6:.0f} MB)",
          flush=True)
    now = int(time.time() * 1000)
    full: list[float] = []
    quick: list[float] = []
    same = True
    for _ in range(args.rounds):
        took_full, listed_full = asyncio.run(_listing(args.path, True, now))
        took_quick, listed_quick = asyncio.run(_listing(args.path, False, now))
        full.append(took_full)
        quick.append(took_quick)
        same = same and listed_full == listed_quick
    print(table(("listing", "best (s)", "each round (s)"), [
        ("every record read and folded", f"{min(full):.2f}", " ".join(f"{t:.2f}" for t in full)),
        ("a few types read, busy sessions whole", f"{min(quick):.2f}", " ".join(f"{t:.2f}" for t in quick)),
    ]))
    print(f"records={records} sessions={args.sessions + args.live} full_s={min(full):.2f} "
          f"quick_s={min(quick):.2f} same={same}")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
