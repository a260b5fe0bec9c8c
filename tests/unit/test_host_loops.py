"""A host made at module level and used from several ``asyncio.run`` calls (a script that
runs one turn per ``asyncio.run``): each run ends by cancelling the tasks it left, among
them the host's release of the idle session; closing the host afterwards raised
``CancelledError`` from inside the library (awaiting that cancelled release). It must
close quietly and give the session up.

The script runs in a child process: under pytest the idle release happened to finish
before ``asyncio.run`` ended, hiding the defect.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
from datetime import timedelta
from pathlib import Path
from typing import Any

from harness.clock import SystemClock
from harness.runtime.ownership import Ownership

SCRIPT = textwrap.dedent(
    """
    import asyncio, sys
    from harness import HarnessHost, define_harness
    from harness.errors import SessionBusy
    from harness.log.sqlite import SqliteLog
    from harness.models import ModelResponse, ScriptedModel

    path = sys.argv[1]
    host = HarnessHost(log=f"sqlite:///{path}")
    harness = define_harness(name="t/loops", model=ScriptedModel(lambda m: ModelResponse(text="hi")), tools=[])

    async def turn(i):
        session = await host.open(harness, session_id="s-1")
        return (await asyncio.wait_for(session.send("hi", input_id=f"in-{i}"), 30)).outcome

    print([asyncio.run(turn(i)) for i in range(2)])
    asyncio.run(host.close())

    async def claim():
        other = SqliteLog(path)
        try:
            writer = await other.claim("s-1", owner="next", lease=host.lease)
            await writer.release()
        finally:
            await other.close()

    try:
        asyncio.run(claim())
        print("freed")
    except SessionBusy as exc:
        print("busy:", exc)
    """
)


def test_a_host_used_from_several_asyncio_runs_closes_cleanly_and_frees_its_session(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path / "h.db")], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert done.stdout.splitlines() == ["['completed', 'completed']", "freed"], done.stdout


class _Writer:
    def __init__(self, released: list[str]) -> None:
        self._released = released

    async def release(self) -> None:
        await asyncio.sleep(0)
        self._released.append("released")


class _Log:
    has_leases = True

    def __init__(self, released: list[str]) -> None:
        self.writer = _Writer(released)

    async def claim(self, session_id: str, *, owner: str, lease: Any) -> Any:
        return self.writer


def test_a_release_cancelled_with_its_loop_is_done_again_by_the_next_release() -> None:
    """The same, deterministic: a release whose task the end of ``asyncio.run`` cancelled
    before it ran is done again by the next ``release()`` (on the next loop), which
    neither raises ``CancelledError`` nor leaves the session held."""
    released: list[str] = []
    ownership = Ownership(
        log=_Log(released),  # type: ignore[arg-type]
        session_id="s-1", owner_id="me", lease=timedelta(seconds=30), clock=SystemClock(), renewals=None,
    )

    async def first_loop() -> None:
        await ownership.acquire()
        asyncio.get_running_loop().create_task(ownership.release())  # the idle release, left running
        await asyncio.sleep(0)  # it starts the writer's release as a task, then the run ends

    asyncio.run(first_loop())
    assert released == []  # (cancelled before it ran)
    asyncio.run(ownership.release())
    assert released == ["released"]
