"""A real Prometheus scrapes real workers (and, once it exists, the gateway) during a short
fleet run; every dashboard panel expression and every alert expression parses (promtool)
and evaluates in that Prometheus, and the key panels return data.

The key panels include those fed by the session runtime's call sites (steps, tool calls,
turns, model calls), so a call site that stops reporting fails here.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from ops_prometheus import Prometheus, check_exprs, promtool
from ops_tools import CHART, REPO, Proc, free_port, harness_env, http_get, wait_for
from prometheus_client.parser import text_string_to_metric_families

from harness.build import build_info
from harness.client import HarnessClient

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

DASHBOARD = CHART / "dashboards" / "durable-harness.json"
RULES = CHART / "alerts" / "durable-harness.rules.yaml"
PARTITIONS = 4
SESSIONS = 12
KEY_PANELS = {
    "Partitions owned per worker", "Live sessions by state", "Parked sessions", "Workers up", "Input lag",
    "Checkpoint age", "Rebuild duration", "Dead letters", "Takeovers, fencing and cut hand-overs", "Model tokens per second",
    "Steps per second", "Turns per second", "Tool calls per second", "Step latency", "Model call latency",
}
GATEWAY_PANELS = {"HTTP requests per second", "HTTP latency p90"}
VARIABLES = {"$namespace": ".*", "$harness": ".*", "$__rate_interval": "1m", "${datasource}": ""}


def dashboard_exprs() -> dict[str, list[str]]:
    """Panel title -> its expressions, with the dashboard's variables filled in."""
    out: dict[str, list[str]] = {}
    for panel in json.loads(DASHBOARD.read_text())["panels"]:
        exprs = []
        for target in panel.get("targets", []):
            expr = target["expr"]
            for var, value in VARIABLES.items():
                expr = expr.replace(var, value)
            exprs.append(expr)
        if exprs:
            out[panel["title"]] = exprs
    return out


@dataclass
class Run:
    prometheus: Prometheus
    workers: list[Proc]
    metrics_ports: list[int]


@pytest.fixture(scope="module")
def fleet_run(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    """Two workers (smoke app) scraped every second by Prometheus with the chart's alert
    rules loaded, after SESSIONS sessions settled."""
    import uuid

    workdir = tmp_path_factory.mktemp("scrape")
    prefix = f"t{uuid.uuid4().hex[:10]}"
    url = f"kafka://{kafka_bootstrap}?topic_prefix={prefix}&partitions={PARTITIONS}"
    ports = [free_port(), free_port()]
    workers = [
        Proc(f"worker{i}", [sys.executable, "-m", "harness.cli", "worker", "--app", "harness.testing.smoke:harness"],
             workdir=workdir, cwd=REPO,
             env=harness_env(HARNESS_LOG=url, HARNESS_METRICS_PORT=str(port), HARNESS_INSTANCE_ID=f"scrape-{i}"))
        for i, port in enumerate(ports)
    ]
    prometheus = Prometheus(
        workdir / "prometheus",
        {"durable-harness-worker": [f"127.0.0.1:{p}" for p in ports]},
        rule_files=[RULES],
    )
    try:
        for w, port in zip(workers, ports, strict=True):
            def ready(w: Proc = w, port: int = port) -> bool:
                w.check_alive()
                return http_get(f"http://127.0.0.1:{port}/readyz", timeout=2)[0] == 200

            wait_for(ready, timeout=90, what=f"{w.name} ready", details=w.describe)
        prometheus.start()

        async def sessions() -> None:
            async with HarnessClient(bootstrap=kafka_bootstrap, topic_prefix=prefix, partitions=PARTITIONS) as client:
                ids = [await client.send(f"s{i}", f"message {i}", harness="harness/smoke") for i in range(SESSIONS)]
                outcomes = await asyncio.gather(
                    *(client.wait_settled(f"s{i}", ids[i], timeout=90) for i in range(SESSIONS))
                )
                assert {o.outcome for o in outcomes} == {"completed"}

        asyncio.run(sessions())
        # Both targets scraped a few times after the run: rates over the panels' window have
        # two samples or more.
        prometheus.wait_data('count(count_over_time(up{job="durable-harness-worker"}[1m]) >= 5) == 2', timeout=60)
        yield Run(prometheus, workers, ports)
    finally:
        prometheus.stop()
        for w in workers:
            w.stop()


# Labels Prometheus adds to every series of a target (namespace, pod ...: the Prometheus
# Operator's ServiceMonitor); ``le``: a histogram's buckets.
TARGET_LABELS = {"job", "instance", "namespace", "pod", "service", "endpoint", "container"}
PROMQL_WORDS = {
    "sum", "max", "min", "avg", "count", "by", "without", "and", "or", "unless", "rate", "increase", "delta",
    "histogram_quantile", "min_over_time", "max_over_time", "count_over_time", "absent", "on", "ignoring",
}


def alert_exprs() -> dict[str, str]:
    import yaml

    groups = yaml.safe_load(RULES.read_text())["groups"]
    return {r["alert"]: r["expr"] for g in groups for r in g["rules"] if "alert" in r}


def referenced(expr: str) -> tuple[set[str], set[str]]:
    """(metric names, label names) an expression selects, matches on or groups by."""
    names = {n for n in re.findall(r"\b([a-z_:][a-z0-9_:]*)\s*(?=\{|\[|\)|$|\s)", expr)
             if n not in PROMQL_WORDS and (n.startswith("harness_") or n == "up")}
    labels: set[str] = set()
    for matchers in re.findall(r"\{([^}]*)\}", expr):
        labels |= set(re.findall(r"([a-zA-Z_]\w*)\s*[=!]~?", matchers))
    for grouping in re.findall(r"\b(?:by|without|on|ignoring)\s*\(([^)]*)\)", expr):
        labels |= {x.strip() for x in grouping.split(",") if x.strip()}
    return names, labels


def exposed(text: str) -> dict[str, set[str]]:
    """Sample name -> its label names, from a /metrics exposition; a family with no sample
    yet (a labelled counter never incremented) is there with its name only."""
    out: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(text):
        suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"]}.get(family.type, [""])
        for suffix in suffixes:
            out.setdefault(family.name + suffix, set())
        for sample in family.samples:
            out.setdefault(sample.name, set()).update(sample.labels)
    return out


def test_every_metric_and_label_of_the_dashboard_and_alerts_is_exposed(fleet_run: Run) -> None:
    """A panel or an alert over a metric (or a label) no process exposes shows nothing, and
    silently: each name in their expressions is in a real worker's /metrics, each label is
    one of that metric's or one Prometheus adds. A labelled counter an alert takes
    ``increase()`` of exists at 0 from the start (a series born at its first increment
    hides that increment from ``increase()``)."""
    series = exposed(http_get(f"http://127.0.0.1:{fleet_run.metrics_ports[0]}/metrics")[1])
    series["up"] = set()
    # labels of families without a sample yet: what the sink declares (a scrape shows
    # a labelled counter's labels only once it was incremented)
    from harness.observability.prometheus import PrometheusSink

    sink = PrometheusSink()
    # (prometheus_client keeps a metric's label names in ``_labelnames``; no public reader)
    declared = {n: set(getattr(c, "_labelnames", ())) for c, names in sink.registry._collector_to_names.items()
                for n in names}
    problems = []
    exprs = {f"alert {a}": e for a, e in alert_exprs().items()}
    exprs |= {f"panel {t}": e for t, es in dashboard_exprs().items() for e in es}
    for where, expr in exprs.items():
        names, labels = referenced(expr)
        assert names, f"{where}: no metric found in {expr!r}"
        for name in names:
            if name not in series:
                problems.append(f"{where}: {name} is not exposed")
                continue
            have = series[name] | declared.get(name, set()) | TARGET_LABELS | ({"le"} if name.endswith("_bucket") else set())
            problems += [f"{where}: {name} has no label {label!r}" for label in sorted(labels - have)]
    assert not problems, "\n".join(problems)
    text = http_get(f"http://127.0.0.1:{fleet_run.metrics_ports[0]}/metrics")[1]
    assert 'harness_turn_failures_total{code="attempts_exhausted",harness="harness/smoke"} 0.0' in text, \
        "HarnessAttemptsExhaustedSpike's series starts at 0 for each harness the worker runs"


def _returns_data(prometheus: Prometheus, exprs: list[str]) -> bool:
    return any(prometheus.query(e) for e in exprs)


def test_every_dashboard_and_alert_expression_parses(tmp_path: Path) -> None:
    exprs = {f"{title} #{i}": e for title, es in dashboard_exprs().items() for i, e in enumerate(es)}
    check_exprs(exprs, tmp_path)
    promtool("check", "rules", str(RULES))


def head_commit() -> str:
    return subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True,
                          check=True).stdout.strip()


def test_prometheus_scrapes_the_workers(fleet_run: Run) -> None:
    p = fleet_run.prometheus
    up = {r["metric"]["instance"]: r["value"][1] for r in p.query('up{job="durable-harness-worker"}')}
    assert up == {f"127.0.0.1:{port}": "1" for port in fleet_run.metrics_ports}
    owned = p.query('sum(harness_partitions_owned{job="durable-harness-worker"})')
    assert owned[0]["value"][1] == str(PARTITIONS), "the two workers own every partition between them"
    # Which build each worker runs (this checkout: its HEAD commit).
    builds = {r["metric"]["instance"]: (r["metric"]["version"], r["metric"]["commit"])
              for r in p.query('harness_build_info{job="durable-harness-worker"} == 1')}
    assert builds == {f"127.0.0.1:{port}": (build_info().version, head_commit()) for port in fleet_run.metrics_ports}
    lag = p.query("harness_input_lag_records")
    assert sorted(int(r["metric"]["partition"]) for r in lag) == list(range(PARTITIONS))
    # every session settled: nothing is left to read (it stayed at 1 on every partition that
    # had records: its last transaction's commit marker counted as a record)
    wait_for(lambda: all(r["value"][1] == "0" for r in p.query("harness_input_lag_records")), timeout=60,
             what="every partition's input lag 0", details=lambda: str(p.query("harness_input_lag_records")))


def test_alert_rules_load_and_evaluate_in_prometheus(fleet_run: Run) -> None:
    p = fleet_run.prometheus

    def evaluated() -> list[dict[str, Any]] | None:
        groups = json.loads(http_get(f"{p.url}/api/v1/rules")[1])["data"]["groups"]
        rules = [r for g in groups for r in g["rules"]]
        return rules if rules and all(r.get("lastEvaluation", "").startswith("20") for r in rules) else None

    rules = wait_for(evaluated, timeout=30, what="the alert rules evaluated")
    assert isinstance(rules, list)
    assert {r["name"] for r in rules} == {
        "HarnessWorkerDown", "HarnessInputLagGrowing", "HarnessDeadLetters", "HarnessFencingStorm",
        "HarnessRebuildSlow", "HarnessAttemptsExhaustedSpike", "HarnessEventLoopStalled", "HarnessHandOverCutCalls",
        "HarnessSessionsHeld",
    }
    assert all(r["health"] == "ok" for r in rules), [(r["name"], r.get("lastError")) for r in rules]
    firing = [r["name"] for r in rules if r["state"] != "inactive"]
    assert firing == [], f"a healthy fleet fires {firing}"


def test_every_panel_evaluates_and_the_key_panels_return_data(fleet_run: Run) -> None:
    panels = dashboard_exprs()
    assert set(panels) >= KEY_PANELS | GATEWAY_PANELS
    empty = []
    for title, exprs in panels.items():
        has = _returns_data(fleet_run.prometheus, exprs)  # a query error fails here
        if title in KEY_PANELS and not has:
            empty.append(title)
    assert not empty, f"key panels without data: {empty}"


def test_prometheus_scrapes_the_gateway(kafka_bootstrap: str, unique_prefix: str, tmp_path: Path) -> None:
    """The gateway's /metrics on its metrics port, and its HTTP panels return data after a request."""
    http_port, metrics_port = free_port(), free_port()
    url = f"kafka://{kafka_bootstrap}?topic_prefix={unique_prefix}&partitions={PARTITIONS}"
    # The gateway is a client of the log: it never creates topics (workers or this command do).
    subprocess.run([sys.executable, "-m", "harness.cli", "topics", "create", "--log", url], env=harness_env(),
                   cwd=REPO, capture_output=True, text=True, timeout=120, check=True)
    gateway = Proc("gateway", [sys.executable, "-m", "harness.cli", "gateway", "--host", "127.0.0.1",
                               "--port", str(http_port), "--open-access"],
                   workdir=tmp_path, cwd=REPO, env=harness_env(HARNESS_LOG=url, HARNESS_METRICS_PORT=str(metrics_port)))
    prometheus = Prometheus(tmp_path / "prometheus", {"durable-harness-gateway": [f"127.0.0.1:{metrics_port}"]})
    try:
        def ready() -> bool:
            gateway.check_alive()
            return http_get(f"http://127.0.0.1:{http_port}/readyz", timeout=2)[0] == 200

        wait_for(ready, timeout=90, what="the gateway ready", details=gateway.describe)
        prometheus.start()
        status, health = http_get(f"http://127.0.0.1:{http_port}/healthz")
        assert status == 200
        assert json.loads(health) == {"status": "ok", "version": build_info().version, "commit": head_commit()}
        prometheus.wait_data('harness_build_info{job="durable-harness-gateway"}', timeout=60)
        [build] = prometheus.query('harness_build_info{job="durable-harness-gateway"}')
        assert (build["metric"]["version"], build["metric"]["commit"], build["value"][1]) == (
            build_info().version, head_commit(), "1")
        panels = dashboard_exprs()
        prometheus.wait_data(panels["HTTP requests per second"][0], timeout=60)
        assert _returns_data(prometheus, panels["SSE subscribers"])
        # The gateway's /metrics has the worker gauges too (one registry, at 0): a panel of
        # workers per instance ("Partitions owned per worker") must not list gateway pods
        # as workers owning nothing (with an HPA of gateways, up to 10 such lines).
        gateway_instance = f"127.0.0.1:{metrics_port}"
        for_every_process = GATEWAY_PANELS | {"SSE subscribers", "Event loop stalls"}
        shown = {title: [r["metric"] for e in exprs for r in prometheus.query(e)]
                 for title, exprs in panels.items() if title not in for_every_process}
        as_worker = [t for t, series in shown.items() if any(m.get("instance") == gateway_instance for m in series)]
        assert not as_worker, f"worker panels show the gateway as a worker: {as_worker}"
    finally:
        prometheus.stop()
        gateway.stop()
