"""The metrics facade, its Prometheus sink, the health server, and what a worker publishes.

Metric names and labels are the contract of the dashboards and alerts in
``helm/durable-harness``: these tests read them back from the exposition text.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from pydantic import BaseModel

from harness import define_harness, durable_tool, tool_definition
from harness.log.memory import MemoryLog
from harness.models import ModelResponse, ScriptedModel, ToolCall
from harness.observability import (
    MetricsServer,
    Observation,
    PrometheusSink,
    disable_metrics,
    enable_metrics,
    metrics,
)
from harness.observability.facade import MAX_LABEL_VALUES, OTHER
from harness.records import InputAnswer, InputMessage, InputSettled
from harness.runtime.observe import BROKER_STALE_S, LIVENESS_STALE_S, WorkerHealth
from harness.runtime.worker import Worker

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def sink() -> Iterator[PrometheusSink]:
    s = enable_metrics()
    try:
        yield s
    finally:
        disable_metrics()


def samples(sink: PrometheusSink) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of the sink's registry: (name, sorted labels) -> value."""
    text = generate_latest(sink.registry).decode()
    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(sink: PrometheusSink, name: str, **labels: str) -> float:
    return samples(sink).get((name, tuple(sorted(labels.items()))), 0.0)


# --------------------------------------------------------------------------- the facade


def test_metrics_off_costs_no_import() -> None:
    """The runtime imports the facade; with metrics off prometheus_client is never loaded."""
    code = (
        "import sys\n"
        "import harness.runtime.worker, harness.runtime.group\n"
        "from harness.observability import metrics\n"
        "metrics.step('h', 'ran', 0.1); metrics.tool_call('h', 't', 'ok'); metrics.rebuild(1.0, 3)\n"
        "assert not metrics.enabled\n"
        "assert 'prometheus_client' not in sys.modules, 'prometheus_client imported with metrics off'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO, env={"PYTHONPATH": str(REPO)})


def test_every_facade_method_lands_in_its_metric(sink: PrometheusSink) -> None:
    metrics.step("acme/a", "ran", 0.02)
    metrics.step("acme/a", "served")
    metrics.tool_call("acme/a", "checkout", "ok")
    metrics.tool_call("acme/a", "checkout", "cut")
    metrics.turn("acme/a", "completed")
    metrics.turn("acme/a", "failed", "attempts_exhausted")
    metrics.turn_attempt("acme/a")
    metrics.fenced_writer()
    metrics.group_commit(7)
    metrics.model_call("acme/a", 1.5, input_tokens=120, output_tokens=30)
    metrics.dead_letters(2)
    metrics.rebuild(0.4, 1234)
    metrics.http_request("/sessions/{id}/messages", "post", 202, 0.01)
    metrics.sse_subscribers(+1)
    metrics.sse_subscribers(+1)
    metrics.sse_subscribers(-1)

    assert value(sink, "harness_steps_total", harness="acme/a", outcome="ran") == 1
    assert value(sink, "harness_steps_total", harness="acme/a", outcome="served") == 1
    assert value(sink, "harness_step_duration_seconds_count", harness="acme/a") == 1  # only the timed one
    assert value(sink, "harness_tool_calls_total", harness="acme/a", tool="checkout", outcome="cut") == 1
    assert value(sink, "harness_turns_total", harness="acme/a", outcome="failed") == 1
    assert value(sink, "harness_turn_failures_total", harness="acme/a", code="attempts_exhausted") == 1
    assert value(sink, "harness_turn_attempts_total", harness="acme/a") == 1
    assert value(sink, "harness_fenced_writers_total") == 1
    assert value(sink, "harness_group_commit_batch_size_sum") == 7
    assert value(sink, "harness_group_commit_batch_size_bucket", le="8.0") == 1
    assert value(sink, "harness_group_commit_batch_size_bucket", le="4.0") == 0
    assert value(sink, "harness_model_call_duration_seconds_sum", harness="acme/a") == 1.5
    assert value(sink, "harness_model_tokens_total", kind="input") == 120
    assert value(sink, "harness_model_tokens_total", kind="output") == 30
    assert value(sink, "harness_dead_letters_total") == 2
    assert value(sink, "harness_rebuild_duration_seconds_count") == 1
    assert value(sink, "harness_rebuild_records_total") == 1234
    assert value(sink, "harness_http_requests_total", route="/sessions/{id}/messages", method="POST", code="202") == 1
    assert value(sink, "harness_sse_subscribers") == 1


def test_steps_count_into_the_series_of_their_harness_and_outcome(sink: PrometheusSink) -> None:
    """Each (harness, outcome) has its own series, however often and in whatever order
    steps come (the sink keeps the series it looked up)."""
    for harness, outcome, seconds in [
        ("a", "ran", 0.5), ("b", "ran", 0.25), ("a", "failed", 1.0), ("a", "ran", 0.5),
        ("a", "served", None), ("b", "ran", 0.25), ("a", "ran", 0.5),
    ]:
        metrics.step(harness, outcome, seconds)
    assert value(sink, "harness_steps_total", harness="a", outcome="ran") == 3
    assert value(sink, "harness_steps_total", harness="a", outcome="failed") == 1
    assert value(sink, "harness_steps_total", harness="a", outcome="served") == 1
    assert value(sink, "harness_steps_total", harness="b", outcome="ran") == 2
    assert value(sink, "harness_step_duration_seconds_count", harness="a") == 4  # (served: no duration)
    assert value(sink, "harness_step_duration_seconds_sum", harness="a") == 2.5
    assert value(sink, "harness_step_duration_seconds_sum", harness="b") == 0.5


def test_labels_stay_bounded(sink: PrometheusSink) -> None:
    metrics.step("h", "exploded")  # not an outcome
    metrics.tool_call("h", "", "ok")  # no name
    for i in range(MAX_LABEL_VALUES + 20):
        metrics.tool_call("h", f"tool-{i}", "ok")  # e.g. a model inventing tool names
    assert value(sink, "harness_steps_total", harness="h", outcome=OTHER) == 1
    tools = {dict(k[1])["tool"] for k in samples(sink) if k[0] == "harness_tool_calls_total"}
    assert len(tools) == MAX_LABEL_VALUES + 1  # the cap, plus "other"
    assert value(sink, "harness_tool_calls_total", harness="h", tool=OTHER, outcome="ok") == 21


def test_no_created_series_and_a_private_registry(sink: PrometheusSink) -> None:
    from prometheus_client import REGISTRY

    metrics.fenced_writer()
    names = {k[0] for k in samples(sink)}
    assert not any(n.endswith("_created") for n in names)
    assert REGISTRY.get_sample_value("harness_fenced_writers_total") is None


def test_observations_are_read_at_scrape_time(sink: PrometheusSink) -> None:
    class Source:
        def __init__(self) -> None:
            self.observation = Observation()

        def observe(self) -> Observation:
            return self.observation

    a, b = Source(), Source()
    metrics.add_source(a)
    metrics.add_source(b)
    a.observation = Observation(
        partitions=(0, 1), sessions={"running": 2, "waiting": 1}, uncovered_since={1: 0.0}, input_lag={0: 5, 1: 0}
    )
    b.observation = Observation(partitions=(2,), sessions={"sleeping": 4})
    assert value(sink, "harness_partitions_owned") == 3
    assert value(sink, "harness_sessions", state="running") == 2
    assert value(sink, "harness_sessions", state="waiting") == 1
    assert value(sink, "harness_sessions", state="sleeping") == 4
    assert value(sink, "harness_input_lag_records", partition="0") == 5
    assert value(sink, "harness_checkpoint_age_seconds", partition="0") == 0  # all covered
    assert value(sink, "harness_checkpoint_age_seconds", partition="1") > 1e9  # uncovered since 1970
    metrics.remove_source(a)
    assert value(sink, "harness_partitions_owned") == 1


def test_disabled_facade_drops_events() -> None:
    s = enable_metrics()
    disable_metrics()
    metrics.fenced_writer()
    assert value(s, "harness_fenced_writers_total") == 0


# --------------------------------------------------------------------------- the server


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_server_serves_metrics_and_health(sink: PrometheusSink) -> None:
    state = {"ready": (False, "rebuilding partition 3"), "alive": (True, "ok")}
    server = MetricsServer(
        host="127.0.0.1", port=0, registry=sink.registry, alive=lambda: state["alive"], ready=lambda: state["ready"]
    ).start()
    try:
        base = f"http://127.0.0.1:{server.port}"
        metrics.fenced_writer()
        status, text = _get(base + "/metrics")
        assert status == 200 and "harness_fenced_writers_total 1.0" in text
        assert _get(base + "/healthz") == (200, "ok\n")
        assert _get(base + "/readyz") == (503, "rebuilding partition 3\n")
        state["ready"] = (True, "ok")
        assert _get(base + "/readyz") == (200, "ok\n")

        def broken() -> tuple[bool, str]:
            raise RuntimeError("boom")

        state_server = MetricsServer(host="127.0.0.1", port=0, alive=broken).start()
        try:
            code, why = _get(f"http://127.0.0.1:{state_server.port}/healthz")
            assert code == 503 and "boom" in why
            assert _get(f"http://127.0.0.1:{state_server.port}/metrics")[0] == 404  # no registry given
        finally:
            state_server.close()
        assert _get(base + "/nope")[0] == 404
    finally:
        server.close()


def test_server_errors_go_to_logging_never_a_traceback_on_stderr(capfd: Any, caplog: Any) -> None:
    """socketserver prints a traceback on stderr for a failed request, past the log format;
    a client that went away is normal and says nothing, anything else is one warning line."""
    import http.client
    import logging

    class BrokenRegistry:
        def collect(self) -> Any:
            raise RuntimeError("collector broke")

    server = MetricsServer(host="127.0.0.1", port=0, registry=BrokenRegistry()).start()
    try:
        with caplog.at_level(logging.WARNING, logger="harness.observability"):
            with pytest.raises((urllib.error.URLError, http.client.HTTPException, ConnectionError)):
                _get(f"http://127.0.0.1:{server.port}/metrics")
            try:
                raise ConnectionResetError("the scraper went away")
            except ConnectionResetError:
                server._httpd.handle_error(None, ("127.0.0.1", 1))
    finally:
        server.close()
    err = capfd.readouterr().err
    assert "Exception occurred" not in err and "Traceback" not in err
    warnings = [r.getMessage() for r in caplog.records if r.name == "harness.observability"]
    assert len(warnings) == 1 and "RuntimeError: collector broke" in warnings[0]


# --------------------------------------------------------------------------- worker health


def test_worker_health_rules(monkeypatch: pytest.MonkeyPatch) -> None:
    import harness.runtime.observe as observe

    now = [1000.0]
    monkeypatch.setattr(observe.time, "monotonic", lambda: now[0])
    h = WorkerHealth(needs_broker=True)
    assert h.alive() == (True, "ok")
    assert h.ready()[0] is False and "not yet live" in h.ready()[1]
    h.live = True
    assert "broker" in h.ready()[1]
    h.broker_answered()
    assert h.ready() == (True, "ok")
    h.pending = 2
    assert h.ready() == (False, "2 assigned partition(s) not yet taken up")
    h.pending = 0
    now[0] += BROKER_STALE_S + 1
    h.beat()
    assert h.ready()[0] is False and "broker has not answered" in h.ready()[1]
    h.broker_answered()
    now[0] += LIVENESS_STALE_S + 1
    assert h.alive()[0] is False and h.ready()[0] is False
    h.beat()
    h.stopping = True
    assert h.ready() == (False, "stopping")
    h.error = "RuntimeError: group consumer failed"
    assert h.alive() == (False, "worker failed: RuntimeError: group consumer failed")


# --------------------------------------------------------------------------- a worker publishes


class NapArgs(BaseModel):
    seconds: float


class Ok(BaseModel):
    ok: bool


async def _nap(args: NapArgs, ctx: Any) -> dict[str, float]:
    await ctx.step.sleep("nap", timedelta(seconds=args.seconds))
    return {"slept": args.seconds}


async def _approve(args: BaseModel, ctx: Any) -> dict[str, bool]:
    answer = await ctx.step.ask("approve", message="ok?", schema=Ok)
    return {"ok": answer.ok}


class NoArgs(BaseModel):
    pass


def _script(messages: list[dict[str, Any]]) -> ModelResponse:
    user = next(m["content"] for m in messages if m["role"] == "user")
    if any(m["role"] == "assistant" for m in messages):
        return ModelResponse(text="done")
    if user == "nap":
        return ModelResponse(tool_calls=[ToolCall(id="c1", name="nap", arguments={"seconds": 3600})])
    return ModelResponse(tool_calls=[ToolCall(id="c1", name="approve", arguments={})])


PARKING = define_harness(
    name="parking",
    model=ScriptedModel(_script),
    tools=[
        durable_tool(tool_definition(name="nap", description="sleep", input_schema=NapArgs), _nap),
        durable_tool(tool_definition(name="approve", description="ask", input_schema=NoArgs), _approve),
    ],
)


async def _until(predicate: Any, what: str, rounds: int = 2000) -> None:
    for _ in range(rounds):
        if predicate():
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"never happened: {what}")


async def test_worker_publishes_sessions_by_state_and_its_rebuild(sink: PrometheusSink) -> None:
    log = MemoryLog()
    await log.submit(InputMessage("before", 0, "in-1", "ask", "parking"))  # history: read by the rebuild
    worker = Worker(log=log, harnesses=[PARKING], poll_interval=timedelta(milliseconds=5))
    stop = asyncio.Event()
    run = asyncio.create_task(worker.run(stop))
    try:
        await worker.ready.wait()
        assert value(sink, "harness_rebuild_duration_seconds_count") == 1
        assert value(sink, "harness_rebuild_records_total") == 1
        await log.submit(InputMessage("sleeper", 0, "in-1", "nap", "parking"))
        await log.submit(InputMessage("asker", 0, "in-1", "ask", "parking"))

        def published(running: int, waiting: int, sleeping: int) -> bool:
            return worker.observe().sessions == {"running": running, "waiting": waiting, "sleeping": sleeping,
                                                 "unreadable": 0, "held": 0}

        await _until(lambda: published(0, 2, 1), "two sessions waiting, one sleeping")
        assert value(sink, "harness_sessions", state="waiting") == 2
        assert value(sink, "harness_sessions", state="sleeping") == 1
        assert value(sink, "harness_partitions_owned") == 1
        assert worker.health.ready() == (True, "ok")

        await log.submit(InputAnswer("asker", 0, "answer-1", "c1", "approve", {"ok": True}))

        async def settled() -> bool:
            return any(isinstance(e.record, InputSettled) for e in await log.read("asker"))

        await _until(lambda: published(0, 1, 1), "the answered session left")
        assert await settled()
    finally:
        stop.set()
        await run
    assert value(sink, "harness_partitions_owned") == 0  # a stopped worker is no source any more
    assert worker.health.ready() == (False, "stopping")


def test_a_workers_snapshot_counts_its_unreadable_and_held_sessions() -> None:
    """Sessions a worker does not drive are counted too: ``unreadable`` (parked on an
    unreadable record) and ``held`` (secrets_for fails for them), each alertable."""
    from types import SimpleNamespace

    from harness.runtime.observe import observe_runtimes

    runtimes = {
        0: SimpleNamespace(sessions={}, parked={"bad": object()}, held={"v1": "vault down", "v2": "vault down"}),
        1: SimpleNamespace(sessions={}, parked={"bad2": object()}, held={}),
    }
    seen = observe_runtimes(runtimes, [0, 1], uncovered_since={}, input_lag={}, now_ms=0)  # type: ignore[arg-type]
    assert seen.sessions == {"running": 0, "waiting": 0, "sleeping": 0, "unreadable": 2, "held": 2}
