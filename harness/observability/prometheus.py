"""The Prometheus sink of the metrics facade, on a PRIVATE ``CollectorRegistry``.

Private, so the embedding application's own default registry is never touched
(and two sinks in one process, as in tests, never collide). Metric names follow
Prometheus conventions: the ``harness_`` prefix, base units, ``_total`` counters.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from harness.build import build_info
from harness.observability.facade import (
    RATE_LIMIT_REASONS,
    SESSION_STATES,
    TOKEN_KINDS,
    Observation,
    ObservationSource,
)

__all__ = ["PrometheusSink"]

DURATION_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
MODEL_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0, 120.0)
REBUILD_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
STALL_BUCKETS = (1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)


class _WorkerCollector(Collector):
    """The gauges read from the registered sources' observations at scrape time."""

    def __init__(self) -> None:
        self._sources: list[ObservationSource] = []
        self._lock = threading.Lock()

    def add(self, source: ObservationSource) -> None:
        with self._lock:
            if source not in self._sources:
                self._sources.append(source)

    def remove(self, source: ObservationSource) -> None:
        with self._lock:
            if source in self._sources:
                self._sources.remove(source)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        with self._lock:
            sources = list(self._sources)
        seen: list[Observation] = [s.observe() for s in sources]
        now = time.time()
        owned = GaugeMetricFamily("harness_partitions_owned", "Partitions of the sessions topic this process drives")
        owned.add_metric([], sum(len(o.partitions) for o in seen))
        yield owned
        sessions = GaugeMetricFamily("harness_sessions", "Live sessions by state", labels=["state"])
        for state in SESSION_STATES:
            sessions.add_metric([state], sum(o.sessions.get(state, 0) for o in seen))
        yield sessions
        age = GaugeMetricFamily(
            "harness_checkpoint_age_seconds",
            "Seconds since the oldest folded record that no checkpoint covers yet (0: all covered)",
            labels=["partition"],
        )
        lag = GaugeMetricFamily(
            "harness_input_lag_records", "Log end minus the position driven so far", labels=["partition"]
        )
        ages: dict[int, float] = {}
        lags: dict[int, int] = {}
        for o in seen:
            for p in o.partitions:
                since = o.uncovered_since.get(p)
                ages[p] = max(ages.get(p, 0.0), 0.0 if since is None else max(now - since, 0.0))
            for p, n in o.input_lag.items():
                lags[p] = max(lags.get(p, 0), n)
        for p in sorted(ages):
            age.add_metric([str(p)], ages[p])
        for p in sorted(lags):
            lag.add_metric([str(p)], lags[p])
        yield age
        yield lag


class PrometheusSink:
    """Every metric of the issue, on ``self.registry``."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        self.steps = Counter("harness_steps_total", "step.do calls by outcome", ["harness", "outcome"], registry=r)
        self.step_duration = Histogram(
            "harness_step_duration_seconds", "step.do time: fn plus the commit", ["harness"],
            buckets=DURATION_BUCKETS, registry=r,
        )
        self._step_series: dict[tuple[str, str], tuple[Counter, Histogram]] = {}
        self.tool_calls = Counter(
            "harness_tool_calls_total", "Finished tool calls", ["harness", "tool", "outcome"], registry=r
        )
        self.turns = Counter("harness_turns_total", "Finished turns", ["harness", "outcome"], registry=r)
        self.turn_failures = Counter(
            "harness_turn_failures_total", "Turns that did not complete, by code", ["harness", "code"], registry=r
        )
        self.turn_attempts = Counter(
            "harness_turn_attempts_total", "Unfinished turns taken up by a new owner (takeovers)", ["harness"],
            registry=r,
        )
        self.fenced = Counter("harness_fenced_writers_total", "Writers fenced by a newer owner", registry=r)
        self.loop_stalls_noticed = Counter(
            "harness_event_loop_stalls_total",
            "Times the event loop did not run for a while, counted when noticed (while it lasts)",
            registry=r,
        )
        self.loop_stalls = Histogram(
            "harness_event_loop_stall_seconds",
            "Times the event loop did not run for a while (blocking code in async code), by length",
            buckets=STALL_BUCKETS, registry=r,
        )
        self.group_commits = Histogram(
            "harness_group_commit_batch_size", "Appends carried by one committed transaction",
            buckets=BATCH_BUCKETS, registry=r,
        )
        self.dead = Counter("harness_dead_letters_total", "Undecodable records sent to the dead-letter topic", registry=r)
        self.last_drain_cut: float | None = None  # time.monotonic() of the last drain_cut
        self.drain_cuts = Counter(
            "harness_drain_cut_sessions_total",
            "Sessions still running when a hand-over's drain timed out (cut; recovered by the next owner)",
            registry=r,
        )
        self.rebuild_duration = Histogram(
            "harness_rebuild_duration_seconds", "Time to take up a partition: checkpoint, read, go live",
            buckets=REBUILD_BUCKETS, registry=r,
        )
        self.rebuild_records = Counter(
            "harness_rebuild_records_total", "Records read while taking up partitions", registry=r
        )
        self.model_duration = Histogram(
            "harness_model_call_duration_seconds", "Model call latency", ["harness"], buckets=MODEL_BUCKETS, registry=r
        )
        self.tokens = Counter("harness_model_tokens_total", "Model tokens used", ["kind"], registry=r)
        self.http_requests = Counter(
            "harness_http_requests_total", "Gateway HTTP requests", ["route", "method", "code"], registry=r
        )
        self.http_duration = Histogram(
            "harness_http_request_duration_seconds", "Gateway HTTP request latency", ["route"],
            buckets=DURATION_BUCKETS, registry=r,
        )
        self.sse = Gauge("harness_sse_subscribers", "Open SSE event streams of the gateway", registry=r)
        self.rate_limited_requests = Counter(
            "harness_http_rate_limited_total",
            "Gateway requests refused with 429 by the caller's --rate-limit (reason=rate_limit) or its address's "
            "--auth-failure-limit (reason=auth_failures)",
            ["reason"], registry=r,
        )
        # harness_build_info{version=..., commit=...} 1: which build this process runs (two
        # releases of one version differ by commit; "" when unknown). Joined onto other series
        # with `* on(pod) group_left(version, commit) harness_build_info`.
        build = build_info()
        self.build = Info("harness_build", "The build this process runs: package version and source commit",
                          registry=r)
        self.build.info({"version": build.version, "commit": build.commit or ""})
        self._collector = _WorkerCollector()
        r.register(self._collector)
        for kind in sorted(TOKEN_KINDS):  # both series exist from the start
            self.tokens.labels(kind)
        for reason in RATE_LIMIT_REASONS:
            self.rate_limited_requests.labels(reason)

    # -- MetricsSink ----------------------------------------------------------------------

    def harness_served(self, harness: str) -> None:
        self.turn_failures.labels(harness, "attempts_exhausted")
        self.turn_attempts.labels(harness)

    def step(self, harness: str, outcome: str, seconds: float | None) -> None:
        # Once per step: the series are looked up once per label values (``labels()``
        # takes a lock and builds a key, ~1.8 us of the ~3.2 a step's metrics cost).
        # Bounded: the facade caps the harness label, the outcome is one of a few.
        series = self._step_series.get((harness, outcome))
        if series is None:
            series = self._step_series[(harness, outcome)] = (
                self.steps.labels(harness, outcome),
                self.step_duration.labels(harness),
            )
        series[0].inc()
        if seconds is not None:
            series[1].observe(seconds)

    def tool_call(self, harness: str, tool: str, outcome: str) -> None:
        self.tool_calls.labels(harness, tool, outcome).inc()

    def turn(self, harness: str, outcome: str, code: str | None) -> None:
        self.turns.labels(harness, outcome).inc()
        if code is not None:
            self.turn_failures.labels(harness, code).inc()

    def turn_attempt(self, harness: str) -> None:
        self.turn_attempts.labels(harness).inc()

    def fenced_writer(self) -> None:
        self.fenced.inc()

    def loop_stalled(self) -> None:
        self.loop_stalls_noticed.inc()

    def loop_stall(self, seconds: float) -> None:
        self.loop_stalls.observe(seconds)

    def group_commit(self, batch_size: int) -> None:
        self.group_commits.observe(batch_size)

    def model_call(self, harness: str, seconds: float, input_tokens: int, output_tokens: int) -> None:
        self.model_duration.labels(harness).observe(seconds)
        if input_tokens:
            self.tokens.labels("input").inc(input_tokens)
        if output_tokens:
            self.tokens.labels("output").inc(output_tokens)

    def dead_letters(self, count: int) -> None:
        self.dead.inc(count)

    def drain_cut(self, sessions: int) -> None:
        self.drain_cuts.inc(sessions)
        # (a SIGTERM's cut is counted moments before the process exits: the worker waits
        # for one more scrape after this, see MetricsServer.wait_for_scrape)
        self.last_drain_cut = time.monotonic()

    def rebuild(self, seconds: float, records: int) -> None:
        self.rebuild_duration.observe(seconds)
        self.rebuild_records.inc(records)

    def http_request(self, route: str, method: str, status: int, seconds: float) -> None:
        self.http_requests.labels(route, method, str(status)).inc()
        self.http_duration.labels(route).observe(seconds)

    def sse_subscribers(self, delta: int) -> None:
        self.sse.inc(delta)

    def rate_limited(self, reason: str = "rate_limit") -> None:
        self.rate_limited_requests.labels(reason).inc()

    def add_source(self, source: ObservationSource) -> None:
        self._collector.add(source)

    def remove_source(self, source: ObservationSource) -> None:
        self._collector.remove(source)
