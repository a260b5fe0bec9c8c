"""SessionIndex: the sessions of a SQLite log, kept up to date by reading only what is new."""

from __future__ import annotations

import asyncio
import re
from datetime import timedelta
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from harness import HarnessHost, define_harness, durable_tool, open_log, tool_definition
from harness.models import ModelResponse, ScriptedModel, ToolCall
from harness.runtime.catalog import SessionIndex, list_sessions, sort_summaries


class Nothing(BaseModel):
    pass


class Approval(BaseModel):
    ok: bool


async def nap(args: Nothing, ctx: Any) -> str:
    await ctx.step.sleep("nap", timedelta(hours=1))
    return "rested"


async def approve(args: Nothing, ctx: Any) -> bool:
    answer = await ctx.step.ask("approve", message="ok?", schema=Approval)
    return bool(answer.ok)


def script(messages: list[dict[str, Any]]) -> ModelResponse:
    last_user = max(i for i, m in enumerate(messages) if m["role"] == "user")
    if any(m.get("role") == "tool" for m in messages[last_user:]):
        return ModelResponse(text="done")
    text = messages[last_user]["content"]
    calls = [ToolCall(id=f"{name}-{last_user}", name=name, arguments={}) for name in re.findall(r"nap|approve", text)]
    return ModelResponse(text="on it", tool_calls=calls)


HARNESS = define_harness(
    name="index-test",
    model=ScriptedModel(script),
    tools=[
        durable_tool(tool_definition(name="nap", description="sleep an hour", input_schema=Nothing), nap),
        durable_tool(tool_definition(name="approve", description="ask", input_schema=Nothing), approve),
    ],
)


class CountingLog:
    """A log that counts the records its whole-log scans return (reads of one session apart)."""

    def __init__(self, log: Any) -> None:
        self._log = log
        self.whole = 0
        self.by_id = 0

    async def scan(self, session_id: str | None = None, **kwargs: Any) -> Any:
        items = await self._log.scan(session_id, **kwargs)
        if session_id is None:
            self.whole += len(items)
        else:
            self.by_id += len(items)
        return items


def _json(summaries: list[Any]) -> list[dict[str, Any]]:
    return [s.to_json() for s in sort_summaries(summaries)]


async def test_an_index_lists_what_a_fresh_listing_lists_and_reads_only_what_is_new(tmp_path: Path) -> None:
    log = open_log(f"sqlite:///{tmp_path / 'h.db'}")
    counting = CountingLog(log)
    index = SessionIndex(counting)  # type: ignore[arg-type]
    try:
        async with HarnessHost(log=log) as host:
            done = await host.open(HARNESS, session_id="done")
            assert (await done.send("hello", input_id="m1")).outcome == "completed"
            waiting = await host.open(HARNESS, session_id="waiting")
            await waiting.send("approve", input_id="m1")
            sleeping = await host.open(HARNESS, session_id="sleeping")
            napping = asyncio.create_task(sleeping.send("nap", input_id="m1"))  # sleeps an hour
            while not [e for e in await log.read("sleeping") if e.record_type == "harness.sleep.scheduled"]:
                await asyncio.sleep(0.01)

            now = 1_000_000_000_000_000  # far after every wake time: the sleep is due
            first = await index.summaries()
            assert _json(first) == _json(await list_sessions(log))
            assert {s.session_id: s.state for s in first} == {"done": "idle", "waiting": "waiting", "sleeping": "sleeping"}
            assert _json(await index.summaries(now_ms=now)) == _json(await list_sessions(log, now_ms=now))
            read_once = counting.whole
            assert read_once > 0

            assert _json(await index.summaries()) == _json(first)
            assert counting.whole == read_once  # nothing new: nothing read

            # New records: a quiet session gets a message (read again by its id), an ask is
            # answered, a new session starts.
            assert (await done.send("again", input_id="m2")).outcome == "completed"
            await waiting.answer("approve-0", "approve", {"ok": True})
            fresh = await host.open(HARNESS, session_id="fresh")
            await fresh.send("hi", input_id="m1")
            appended = len(await log.read_all(after=await _end(log, read_once)))
            later = await index.summaries()
            assert _json(later) == _json(await list_sessions(log))
            assert {s.session_id: s.state for s in later}["waiting"] == "idle"
            assert {s.session_id: s.turns for s in later}["done"] == 2
            assert counting.whole == read_once + appended  # only the new records
            assert counting.by_id > 0  # the quiet sessions that came back were read by id
            napping.cancel()
    finally:
        await log.close()


async def _end(log: Any, count: int) -> int:
    """The position of the ``count``-th record of the log."""
    entries = await log.read_all(limit=count)
    return int(entries[-1].seq)


async def test_a_listing_whose_caller_goes_away_still_finishes(tmp_path: Path) -> None:
    """A gateway request that times out leaves its listing to finish: a quiet session that
    came back is read whole even if the caller is gone meanwhile, never lost or half folded."""

    class HeldLog(CountingLog):
        def __init__(self, log: Any) -> None:
            super().__init__(log)
            self.hold = False
            self.entered = asyncio.Event()
            self.release = asyncio.Event()

        async def scan(self, session_id: str | None = None, **kwargs: Any) -> Any:
            if session_id is not None and self.hold:
                self.entered.set()
                await self.release.wait()
            return await super().scan(session_id, **kwargs)

    log = open_log(f"sqlite:///{tmp_path / 'h.db'}")
    held = HeldLog(log)
    index = SessionIndex(held)  # type: ignore[arg-type]
    try:
        async with HarnessHost(log=log) as host:
            done = await host.open(HARNESS, session_id="done")
            assert (await done.send("hello", input_id="m1")).outcome == "completed"
            assert {s.session_id: s.turns for s in await index.summaries()} == {"done": 1}
            assert (await done.send("again", input_id="m2")).outcome == "completed"

            held.hold = True  # the next listing reads "done" whole, and waits there
            caller = asyncio.create_task(index.summaries())
            await held.entered.wait()
            caller.cancel()
            held.release.set()
            held.hold = False

            after = await index.summaries()
            assert _json(after) == _json(await list_sessions(log))
            assert {s.session_id: s.turns for s in after} == {"done": 2}
            assert caller.cancelled()
    finally:
        await log.close()


async def test_a_listing_that_fails_after_its_caller_went_away_leaves_no_unretrieved_error() -> None:
    """A gateway request that timed out while the broker was down: its listing fails later,
    with nobody awaiting it; asyncio must not print 'Task exception was never retrieved'."""
    import gc

    class DownLog:
        def __init__(self) -> None:
            self.entered = asyncio.Event()
            self.release = asyncio.Event()

        async def scan(self, session_id: str | None = None, **kwargs: Any) -> Any:
            self.entered.set()
            await self.release.wait()
            raise RuntimeError("the broker is down")

    loop = asyncio.get_running_loop()
    reported: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _loop, context: reported.append(context))
    try:
        down = DownLog()
        index = SessionIndex(down)  # type: ignore[arg-type]
        caller = asyncio.create_task(index.summaries())
        await down.entered.wait()
        caller.cancel()
        down.release.set()
        for _ in range(5):  # let the listing fail
            await asyncio.sleep(0)
        assert caller.cancelled()
        del caller, index  # (the cancelled caller's traceback holds the listing's task)
        gc.collect()
        assert not [c for c in reported if "never retrieved" in str(c.get("message"))]
    finally:
        loop.set_exception_handler(None)


async def test_quiet_sessions_share_their_repeated_words(tmp_path: Path) -> None:
    """A long-running reader keeps a summary per session: the harness name and outcome of
    each (decoded afresh from every record) are one shared string, not a copy each."""
    log = open_log(f"sqlite:///{tmp_path / 'h.db'}")
    index = SessionIndex(log)
    try:
        async with HarnessHost(log=log) as host:
            for sid in ("a", "b"):
                session = await host.open(HARNESS, session_id=sid)
                assert (await session.send("hello", input_id="m1")).outcome == "completed"
        by_id = {s.session_id: s for s in await index.summaries()}
        assert by_id["a"].harness == by_id["b"].harness == "index-test"
        assert by_id["a"].harness is by_id["b"].harness
        assert by_id["a"].last_outcome is by_id["b"].last_outcome
        assert _json(list(by_id.values())) == _json(await list_sessions(log))
    finally:
        await log.close()


async def test_a_first_listing_of_a_big_log_keeps_a_bounded_number_of_sessions_folded_whole(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """Catching up by reading every record (a memory log; on SQLite the catch-ups after
    the first listing), the sessions with no turn in progress are summarized chunk by chunk once
    more than BUSY_KEPT are folded: a first listing of a big log (a gateway's start) used to
    fold every session whole before summarizing any (~8.6 KB a session at its peak)."""
    from harness.runtime import session_index

    monkeypatch.setattr(session_index, "CHUNK", 10)
    monkeypatch.setattr(session_index, "BUSY_KEPT", 4)
    log = open_log(f"sqlite:///{tmp_path / 'h.db'}")
    try:
        async with HarnessHost(log=log) as host:
            for k in range(30):
                session = await host.open(HARNESS, session_id=f"s-{k}")
                assert (await session.send("hello", input_id="m1")).outcome == "completed"
            waiting = await host.open(HARNESS, session_id="waiting")
            await waiting.send("approve", input_id="m1")
            back = await host.open(HARNESS, session_id="s-0")  # a quiet session that comes back later
            assert (await back.send("again", input_id="m2")).outcome == "completed"

            index = SessionIndex(CountingLog(log))  # type: ignore[arg-type]  # the full read (no scan_listing)
            folded: list[int] = []
            fold_all = index._fold_all

            async def counting(items: Any, touched: set[str]) -> None:
                await fold_all(items, touched)
                folded.append(len(index._busy))

            index._fold_all = counting  # type: ignore[method-assign]
            listed = await index.summaries()
            assert _json(listed) == _json(await list_sessions(log))
            assert {s.session_id: s.turns for s in listed}["s-0"] == 2
            assert max(folded) <= 4 + 10  # the bound, plus one chunk's new sessions at most
    finally:
        await log.close()
