"""``Worker(secrets_for=)``: a hook it cannot call is refused at construction; a hook that
raises or returns something else than names to text for one session holds that session
(one WARNING line, nothing written) and never stops the worker nor the other sessions.
No secret value reaches a log line, also not in these errors."""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Callable, Mapping
from typing import Any

import pytest
from pydantic import BaseModel, SecretStr

from harness import define_harness, durable_tool, tool_definition
from harness.errors import DefinitionError
from harness.log.memory import MemoryLog
from harness.models import ModelResponse, ScriptedModel, ToolCall
from harness.records import InputMessage, InputSettled
from harness.runtime import worker as worker_module
from harness.runtime.worker import Worker
from harness.secrets import secrets_for_result

SECRET = "sk_live_abcdefgh"


class Args(BaseModel):
    pass


async def read_key(args: Args, ctx: Any) -> dict[str, bool]:
    return {"has_key": ctx.secrets.get("key") == SECRET}


def harness() -> Any:
    model = ScriptedModel(
        [ModelResponse(tool_calls=[ToolCall(id="c1", name="read_key", arguments={})]), ModelResponse(text="done")]
    )
    return define_harness(
        name="h", model=model,
        tools=[durable_tool(tool_definition(name="read_key", description="d", input_schema=Args), read_key)],
    )


# --- at construction ------------------------------------------------------------------------


async def _async_hook(session_id: str, harness_name: str) -> dict[str, str]:
    return {"key": SECRET}


@pytest.mark.parametrize(
    ("hook", "says"),
    [
        ({"key": SECRET}, "Worker(secrets_for=) takes a function (session_id, harness_name) -> {name: value}, "
                          "not dict: for the same secrets in every session, "
                          "secrets_for=lambda session_id, harness_name: secrets"),
        (SECRET, "takes a function (session_id, harness_name) -> {name: value}, not str"),
        (_async_hook, "Worker(secrets_for=) must be a plain function, not 'async def'"),
        (lambda session_id: {}, "is called as secrets_for(session_id, harness_name); this one takes (session_id)"),
        (lambda: {}, "is called as secrets_for(session_id, harness_name); this one takes ()"),
    ],
    ids=["dict", "str", "async", "one-argument", "no-argument"],
)
def test_secrets_for_that_cannot_be_called_is_refused_at_construction(hook, says):
    with pytest.raises(DefinitionError, match=re.escape(says)) as refused:
        Worker(log=MemoryLog(), harnesses=[harness()], secrets_for=hook)
    assert SECRET not in str(refused.value)


def test_secrets_for_may_take_defaults_or_varargs():
    for hook in (lambda session_id, harness_name, extra=None: {}, lambda *names: {}):
        Worker(log=MemoryLog(), harnesses=[harness()], secrets_for=hook)


@pytest.mark.parametrize(
    ("given", "says"),
    [
        (["key"], "secrets_for returned list, not a mapping of name -> value (or None for no secrets)"),
        (SECRET, "secrets_for returned str, not a mapping of name -> value"),
        ({"key": SECRET, "pin": 1234}, "secrets_for: secret 'pin' must be a str or a pydantic SecretStr, not int"),
        ({"key": None}, "secrets_for: secret 'key' must be a str or a pydantic SecretStr, not NoneType"),
        ({5: SECRET}, "secrets_for: a secret's name must be a non-empty string, not 5"),
    ],
)
def test_what_secrets_for_returns_is_checked_as_secrets_are(given, says):
    with pytest.raises(DefinitionError, match=re.escape(says)) as refused:
        secrets_for_result(given)
    assert SECRET not in str(refused.value)


def test_secrets_for_may_return_secret_str_or_none():
    assert dict(secrets_for_result({"key": SecretStr(SECRET)})) == {"key": SECRET}
    assert dict(secrets_for_result(None)) == {}


# --- at run time ------------------------------------------------------------------------------


class Hook:
    """A ``secrets_for`` that fails for session "bad" with ``failure`` until it is healed."""

    def __init__(self, failure: Callable[[], Any]) -> None:
        self.failure = failure
        self.healed = False
        self.calls: list[str] = []

    def __call__(self, session_id: str, harness_name: str) -> Mapping[str, Any]:
        self.calls.append(session_id)
        if session_id == "bad" and not self.healed:
            return self.failure()  # type: ignore[no-any-return]
        return {"key": SECRET}


def _raise() -> Any:
    raise RuntimeError("vault is down")


async def _until(predicate: Callable[[], Any], rounds: int = 2000) -> None:
    for _ in range(rounds):
        if await predicate():
            return
        await asyncio.sleep(0.005)
    raise AssertionError("condition not reached")


async def _settled(log: MemoryLog) -> dict[str, str]:
    return {e.session_id: e.record.outcome for e in await log.read_all() if isinstance(e.record, InputSettled)}


@pytest.mark.parametrize(
    ("failure", "says"),
    [
        (_raise, "secrets_for raised RuntimeError: vault is down"),
        (lambda: {"key": SECRET, "pin": 1234}, "secrets_for: secret 'pin' must be a str or a pydantic SecretStr, "
                                                "not int"),
        (lambda: [SECRET], "secrets_for returned list, not a mapping of name -> value (or None for no secrets)"),
    ],
    ids=["raises", "int-value", "list"],
)
@pytest.mark.parametrize("max_sessions", [None, 1])
async def test_a_failing_secrets_for_holds_its_session_and_nothing_else(monkeypatch, caplog, failure, says,
                                                                         max_sessions):
    monkeypatch.setattr(worker_module, "SWEEP_EVERY_S", 0.02)
    caplog.set_level(logging.INFO, logger="harness")
    log = MemoryLog()
    hook = Hook(failure)
    worker = Worker(log=log, harnesses=[harness()], secrets_for=hook, max_sessions=max_sessions)
    stop = asyncio.Event()
    run = asyncio.create_task(worker.run(stop))
    await worker.ready.wait()
    await log.submit(InputMessage("bad", 0, "in-1", "go", "h"))
    await log.submit(InputMessage("good", 0, "in-1", "go", "h"))

    async def good_done() -> bool:
        return (await _settled(log)).get("good") == "completed"

    await _until(good_done)  # (with max_sessions=1 the held session gave its slot back)

    async def asked_again() -> bool:
        return hook.calls.count("bad") >= 4

    await _until(asked_again)  # at each sweep
    assert not run.done()
    assert [e.type for e in await log.read("bad")] == ["harness.input.message"]  # nothing written
    held = [r.getMessage() for r in caplog.records if "is held, not driven" in r.getMessage()]
    assert held == [f"session bad is held, not driven: {says}; nothing was written; secrets_for is asked again "
                    "each second and the session goes on once it answers"]
    assert held[0].count("\n") == 0
    assert list(worker.runtimes[0].held) == ["bad"]

    hook.healed = True

    async def bad_done() -> bool:
        return (await _settled(log)).get("bad") == "completed"

    await _until(bad_done)
    assert "session bad got its secrets: driving it" in caplog.messages
    assert not worker.runtimes[0].held
    results = [e.data["content"] for e in await log.read("bad") if e.type == "harness.tool.result"]
    assert results == [{"has_key": True}]
    stop.set()
    await run
    assert all(SECRET not in r.getMessage() for r in caplog.records)


async def test_secrets_for_returning_none_runs_the_session_without_secrets():
    log = MemoryLog()
    worker = Worker(log=log, harnesses=[harness()], secrets_for=lambda session_id, harness_name: None)
    stop = asyncio.Event()
    run = asyncio.create_task(worker.run(stop))
    await worker.ready.wait()
    await log.submit(InputMessage("s-1", 0, "in-1", "go", "h"))

    async def done() -> bool:
        return (await _settled(log)).get("s-1") == "completed"

    await _until(done)
    results = [e.data["content"] for e in await log.read("s-1") if e.type == "harness.tool.result"]
    assert results == [{"has_key": False}]
    stop.set()
    await run
