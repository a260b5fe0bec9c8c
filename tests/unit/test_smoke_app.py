"""The built-in smoke app (``--app harness.testing.smoke:harness``) drives a durable step
per message, turn after turn."""

from __future__ import annotations

from harness import HarnessHost, open_log
from harness.records import StepResult
from harness.testing.smoke import HARNESS_NAME, harness


async def test_each_message_runs_one_durable_step_then_answers() -> None:
    log = open_log("memory:")
    host = HarnessHost(log=log)
    session = await host.open(harness, session_id="smoke-1")
    first = await session.send("hello", input_id="in-1")
    second = await session.send("again", input_id="in-2")
    assert harness.name == HARNESS_NAME
    assert (first.outcome, first.text) == ("completed", "smoke ok: hello")
    assert (second.outcome, second.text) == ("completed", "smoke ok: again")
    steps = [e.record for e in await log.read("smoke-1") if isinstance(e.record, StepResult)]
    assert [(s.name, s.value) for s in steps] == [("echo", {"echo": "hello"}), ("echo", {"echo": "again"})]
    await session.close()
    await log.close()
