"""The worker service running a harness whose model comes from ``from_uri``, against the local
provider test server, on the embedded SQLite log: end to end, and SIGKILLed half-way through a
streamed answer or after the answer was logged."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.client import HarnessClient
from harness.log import open_log
from harness.records import InputSettled
from harness.testing.model_server import ModelServer, Reply
from tests.apps.real_model import API_KEY
from tests.integration.fleet_helpers import REPO, WorkerProcess, wait_until

pytestmark = pytest.mark.crash

APP = "tests.apps.real_model:assistant"
HARNESS = "tests/real-model"
LEASE_S = "1"
"""Session lease of the workers: a restarted worker takes over once the dead one's lease ran out."""


@pytest.fixture
def server() -> Iterator[ModelServer]:
    with ModelServer() as s:
        yield s


class Workers:
    def __init__(self, tmp_path: Path, server: ModelServer, provider: str) -> None:
        self.url = f"sqlite:///{tmp_path / 'log.db'}"
        self.tmp_path = tmp_path
        self.hold = tmp_path / "hold"
        base = server.openai_url if provider == "openai" else server.anthropic_url + "/"
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
        env["PYTHONUNBUFFERED"] = "1"
        env["HARNESS_TEST_MODEL_URI"] = f"{provider}+{base}:test-model"
        env["HARNESS_TEST_HOLD_FILE"] = str(self.hold)
        for name in ("HARNESS_LOG", "HARNESS_APPS", "OPENAI_API_KEY", "ANTHROPIC_API_KEY"):
            env.pop(name, None)
        self.env = env
        self.started: list[WorkerProcess] = []

    def start(self) -> WorkerProcess:
        worker = WorkerProcess(
            name=f"w{len(self.started)}", log_url=self.url, apps=[APP], env=self.env, workdir=self.tmp_path,
            extra_args=["--lease", LEASE_S],
        )
        self.started.append(worker)
        return worker

    def describe(self) -> str:
        return "\n".join(w.describe() for w in self.started)

    def cleanup(self) -> None:
        for w in self.started:
            w.cleanup()


@pytest.fixture
def workers(request: pytest.FixtureRequest, tmp_path: Path, server: ModelServer) -> Iterator[Workers]:
    made = Workers(tmp_path, server, getattr(request, "param", "openai"))
    yield made
    made.cleanup()


async def settled(client: HarnessClient, input_id: str, workers: Workers) -> InputSettled:
    found: list[InputSettled] = []

    async def check() -> bool:
        for entry in await client.log.read("s-1"):
            if isinstance(entry.record, InputSettled) and entry.record.input_id == input_id:
                found.append(entry.record)
                return True
        return False

    await wait_until(check, timeout=90, what=f"input {input_id} settled", details=workers.describe)
    return found[0]


def tool_results(body: dict[str, Any]) -> list[tuple[str, Any]]:
    """(call id, decoded content) of the tool results in a request body, either provider's shape."""
    out: list[tuple[str, Any]] = []
    for message in body["messages"]:
        if message["role"] == "tool":
            out.append((message["tool_call_id"], json.loads(message["content"])))
        elif isinstance(message["content"], list):
            out += [(b["tool_use_id"], json.loads(b["content"])) for b in message["content"] if b["type"] == "tool_result"]
    return out


async def types(client: HarnessClient) -> list[str]:
    return [e.type for e in await client.log.read("s-1")]


@pytest.mark.parametrize("workers", ["openai", "anthropic"], indirect=True)
async def test_worker_runs_a_from_uri_harness_end_to_end(server: ModelServer, workers: Workers) -> None:
    server.script(
        Reply(text="Holding.", tool_calls=(("call_1", "hold", {"label": "a"}),), usage=(50, 5)),
        Reply(text="Done holding.", usage=(80, 4)),
    )
    client = HarnessClient(log=open_log(workers.url))
    try:
        worker = workers.start()
        await wait_until(lambda: worker.ready, timeout=60, what="worker ready", details=workers.describe)
        await client.send("s-1", "hold a", harness=HARNESS, input_id="in-1")
        verdict = await settled(client, "in-1", workers)
        assert verdict.outcome == "completed", workers.describe()
        entries = await client.log.read("s-1")
        finished = [e.record for e in entries if e.type == "harness.turn.finished"]
        assert finished[0].text == "Done holding."  # type: ignore[attr-defined]
        assert [e.data["input_tokens"] for e in entries if e.type == "harness.model.usage"] == [50, 80]
        assert len(server.requests) == 2
        first, second = server.requests
        key = first.headers.get("x-api-key") or first.headers["authorization"].removeprefix("Bearer ")
        assert key == API_KEY
        assert tool_results(second.body) == [("call_1", {"held": "a", "step": 1})]
        assert worker.terminate() == 0, worker.describe()
    finally:
        await client.log.close()


async def test_sigkill_half_way_through_a_streamed_answer_calls_the_model_once_more(
    server: ModelServer, workers: Workers
) -> None:
    server.script(Reply(text="This answer is streamed and cut by a crash.", chunk=4, pause_after=4),
                  Reply(text="The answer after recovery."))
    client = HarnessClient(log=open_log(workers.url))
    try:
        first = workers.start()
        await wait_until(lambda: first.ready, timeout=60, what="worker ready", details=workers.describe)
        await client.send("s-1", "tell me", harness=HARNESS, input_id="in-1")
        await wait_until(server.paused.is_set, timeout=60, what="the stream half-way", details=workers.describe)
        assert "harness.model.response" not in await types(client)
        first.kill()
        server.release()  # the first stream's connection is gone; its handler ends
        second = workers.start()
        verdict = await settled(client, "in-1", workers)
        assert verdict.outcome == "completed", workers.describe()
        # Recovery called the model once more, with the same request; one response is logged.
        assert len(server.requests) == 2 and server.requests[0].body == server.requests[1].body
        log_types = await types(client)
        assert log_types.count("harness.model.response") == 1 and "harness.turn.resumed" in log_types
        responses = [e.data["text"] for e in await client.log.read("s-1") if e.type == "harness.model.response"]
        assert responses == ["The answer after recovery."]
        assert second.terminate() == 0, second.describe()
    finally:
        await client.log.close()


async def test_sigkill_after_the_answer_was_logged_never_calls_the_model_for_it_again(
    server: ModelServer, workers: Workers
) -> None:
    server.script(
        Reply(text="Holding.", tool_calls=(("call_1", "hold", {"label": "k"}),)),
        Reply(text="Finished after the crash."),
    )
    workers.hold.write_text("hold")
    client = HarnessClient(log=open_log(workers.url))
    try:
        first = workers.start()
        await wait_until(lambda: first.ready, timeout=60, what="worker ready", details=workers.describe)
        await client.send("s-1", "hold k", harness=HARNESS, input_id="in-1")
        holding = Path(f"{workers.hold}.holding")
        await wait_until(holding.exists, timeout=60, what="the tool running", details=workers.describe)
        assert "harness.model.response" in await types(client)
        first.kill()
        workers.hold.unlink()
        second = workers.start()
        verdict = await settled(client, "in-1", workers)
        assert verdict.outcome == "completed", workers.describe()
        # The logged answer was not asked for again: one request for it, one with its result.
        assert len(server.requests) == 2
        first_body, second_body = (r.body for r in server.requests)
        assert first_body["messages"][-1]["content"] == "hold k"
        assert tool_results(second_body) == [("call_1", {"held": "k", "step": 1})]
        log_types = await types(client)
        assert log_types.count("harness.model.response") == 2 and log_types.count("harness.step.result") == 1
        assert second.terminate() == 0, second.describe()
    finally:
        await client.log.close()
