"""HarnessHandOverCutCalls sees a SIGTERM's cut: a real worker (SQLite, no broker) whose
drain runs out is scraped by a real Prometheus, and the alert's expression fires.

The cut is counted moments before the process exits; unless the worker waits for one more
scrape, Prometheus never reads that count (its next scrape finds the process gone), and the
alert never fires for the case its runbook entry starts with (SIGTERM).
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest
import yaml
from ops_prometheus import Prometheus
from ops_tools import REPO, Proc, free_port, harness_env, http_get, run, wait_for

RULES = REPO / "helm" / "durable-harness" / "alerts" / "durable-harness.rules.yaml"
SCRAPE_S = 3  # the chart's is 30 s; a cut process is gone well within either

SLOW_APP = textwrap.dedent('''
    import time
    from typing import Any
    from pydantic import BaseModel
    from harness.definition import define_harness
    from harness.models import ModelResponse, ScriptedModel, ToolCall
    from harness.tools import durable_tool, tool_definition

    class A(BaseModel):
        text: str

    async def _slow(args: A, ctx: Any) -> dict:
        return dict(await ctx.step.do("wait", lambda: (time.sleep(60), {"ok": True})[1]))

    def _script(messages):
        last = max(i for i, m in enumerate(messages) if m.get("role") == "user")
        if not any(m.get("role") == "assistant" for m in messages[last:]):
            return ModelResponse(tool_calls=[ToolCall(id=f"s-{last}", name="slow", arguments={"text": "x"})])
        return ModelResponse(text="done")

    harness = define_harness(name="ops/slow", model=ScriptedModel(_script),
        tools=[durable_tool(tool_definition(name="slow", description="slow", input_schema=A), _slow)])
    ''')


def _alert_expr(name: str) -> str:
    rules = yaml.safe_load(RULES.read_text())["groups"][0]["rules"]
    return next(r["expr"] for r in rules if r.get("alert") == name)


@pytest.mark.slow
def test_a_sigterms_drain_cut_reaches_prometheus_and_fires_the_alert(tmp_path: Path) -> None:
    (tmp_path / "slowapp.py").write_text(SLOW_APP)
    url = f"sqlite:///{tmp_path / 'log.db'}"
    port = free_port()
    env = harness_env(HARNESS_LOG=url, PYTHONPATH=f"{REPO}:{tmp_path}")
    worker = Proc("worker", [sys.executable, "-m", "harness.cli", "worker", "--app", "slowapp:harness",
                             "--metrics-port", str(port), "--drain-timeout", "1"], workdir=tmp_path, cwd=REPO, env=env)
    prometheus = Prometheus(tmp_path / "prometheus", {"durable-harness-worker": [f"127.0.0.1:{port}"]})
    config = yaml.safe_load(prometheus.config.read_text())
    config["global"]["scrape_interval"] = f"{SCRAPE_S}s"
    prometheus.config.write_text(yaml.safe_dump(config))
    try:
        wait_for(lambda: worker.check_alive() or http_get(f"http://127.0.0.1:{port}/readyz", timeout=2)[0] == 200,
                 timeout=60, what="the worker ready", details=worker.describe)
        prometheus.start()
        prometheus.wait_data('harness_drain_cut_sessions_total{job="durable-harness-worker"}', timeout=30)
        run([sys.executable, "-m", "harness.cli", "send", "--no-wait", "--log", url, "--harness", "ops/slow", "s-1", "hi"],
            env=env, timeout=60)
        wait_for(lambda: "tool" in worker.output() or "s-1" in worker.output(), timeout=30,
                 what="the slow tool running", details=worker.describe)
        # two scrapes seen by the worker (it learns the interval), then SIGTERM: the 60 s step is cut
        wait_for(lambda: prometheus.query('count_over_time(up{job="durable-harness-worker"}[1m]) >= 2'),
                 timeout=30, what="two scrapes of the worker")
        assert worker.stop(timeout=60) == 0, worker.describe()
        assert "drain timed out after 1 s: 1 session(s) still running are cut" in worker.output(), worker.describe()

        def seen() -> bool:
            result = prometheus.query('max_over_time(harness_drain_cut_sessions_total{job="durable-harness-worker"}[5m])')
            return bool(result) and result[0]["value"][1] == "1"

        wait_for(seen, timeout=15, what="Prometheus read the cut (harness_drain_cut_sessions_total 1)",
                 details=lambda: worker.describe() + "\n" + str(
                     prometheus.query('harness_drain_cut_sessions_total[1m]')))
        assert prometheus.query(_alert_expr("HarnessHandOverCutCalls")), "HarnessHandOverCutCalls does not fire"
    finally:
        worker.stop()
        prometheus.stop()
