"""Crash tests: a real process runs the checkout story and SIGKILLs itself at a step
boundary; a second process recovers the session. The fake payment provider proves
every effect happened once."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from harness import open_log
from harness.records import AppRecord, ModelResponseRecord, ToolResult, TurnResumed
from harness.testing.checkout import CRASH_POINTS
from harness.testing.payments import FakePaymentProvider

pytestmark = pytest.mark.crash

SESSION = "crash-1"


@pytest.fixture(params=["sqlite", pytest.param("kafka", marks=pytest.mark.kafka)])
def log_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'log.db'}"
    bootstrap = request.getfixturevalue("kafka_bootstrap")
    prefix = request.getfixturevalue("unique_prefix")
    return f"kafka://{bootstrap}?topic_prefix={prefix}&partitions=3"


def _app(command: str, log_url: str, provider: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "harness.testing.checkout", command, "--log", log_url,
         "--provider", str(provider), "--session", SESSION, "--lease", "0.5", *extra],
        capture_output=True, text=True, timeout=120, check=False,
    )


async def _read(log_url: str) -> list:
    log = open_log(log_url)
    try:
        return await log.read(SESSION)
    finally:
        await log.close()


@pytest.mark.parametrize("crash_at", CRASH_POINTS)
def test_sigkill_at_boundary_then_recover_runs_each_effect_once(log_url: str, tmp_path: Path, crash_at: str) -> None:
    provider_path = tmp_path / "payments.db"
    first = _app("run", log_url, provider_path, "--crash-at", crash_at)
    assert first.returncode == -signal.SIGKILL, first.stderr

    second = _app("recover", log_url, provider_path)
    assert second.returncode == 0, second.stderr
    results = json.loads(second.stdout.strip().splitlines()[-1])["results"]
    assert [r["outcome"] for r in results] == ["completed"]

    provider = FakePaymentProvider(provider_path)
    assert provider.effects("charge") == 1
    assert provider.effects("invoice") == 1
    # A step's fn runs at most twice, always with the same key (SPEC 2.4, 2.5).
    assert provider.max_calls_per_key("charge") <= 2
    assert provider.max_calls_per_key("invoice") <= 2
    assert provider.calls("notify") <= 1  # the replay="never" tool never runs again

    entries = asyncio.run(_read(log_url))
    results_by_call: dict[str, list[ToolResult]] = {}
    for e in entries:
        if isinstance(e.record, ToolResult):
            results_by_call.setdefault(e.record.tool_call_id, []).append(e.record)
    assert sorted(results_by_call) == ["call-checkout", "call-notify"]
    assert all(len(v) == 1 for v in results_by_call.values()), "a tool call has two results"
    assert sum(isinstance(e.record, AppRecord) for e in entries) == 1
    assert any(isinstance(e.record, TurnResumed) for e in entries)
    checkout = results_by_call["call-checkout"][0]
    assert not checkout.is_error and checkout.content == {"charge_id": "ch_1", "invoice_id": "inv_1"}

    notify = results_by_call["call-notify"][0]
    if crash_at == "charge:fn-returned":
        # The charge reached the provider, its step did not commit: fn ran again, same key.
        assert provider.calls("charge") == 2
    if crash_at in ("charge:committed", "checkout:steps-done", "model:second-call"):
        assert provider.calls("charge") == 1  # served from the log
    if crash_at in ("checkout:steps-done", "model:second-call"):
        assert provider.calls("invoice") == 1
    if crash_at == "notify:steps-done":
        assert provider.calls("notify") == 1
        assert notify.is_error and notify.code == "cut"  # the model is told, not rerun
    if crash_at == "model:second-call":
        # Both results were logged before the crash: nothing ran again, and the first
        # model response was not requested again (SPEC 5.7).
        assert not notify.is_error
        assert sum(isinstance(e.record, ModelResponseRecord) for e in entries) == 2
