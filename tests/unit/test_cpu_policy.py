"""The worker's CPU policy: what it accepts, and that it reaches every thread (in a child
process: the test process keeps its own)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from harness.services.cpu_policy import CPU_POLICIES, DEFAULT_CPU_POLICY, apply_cpu_policy
from harness.services.worker.main import parse

CHILD = """
import os, threading
from harness.services.cpu_policy import apply_cpu_policy
started = threading.Event(); stop = threading.Event()
def before(): started.set(); stop.wait()
early = threading.Thread(target=before); early.start(); started.wait()
print(apply_cpu_policy({policy!r}))
late = threading.Thread(target=stop.wait); late.start()
print(sorted({{os.sched_getscheduler(int(t)) for t in os.listdir("/proc/self/task")}}))
stop.set(); early.join(); late.join()
"""


def test_an_unknown_policy_is_refused() -> None:
    assert DEFAULT_CPU_POLICY == "batch" and set(CPU_POLICIES) == {"batch", "normal"}
    with pytest.raises(ValueError, match="one of batch, normal"):
        apply_cpu_policy("fifo")


def test_the_worker_takes_the_policy_from_the_flag_then_the_environment() -> None:
    assert parse(["--app", "a:b"], {}).cpu_policy == "batch"
    assert parse(["--app", "a:b"], {"HARNESS_CPU_POLICY": "Normal"}).cpu_policy == "normal"
    assert parse(["--app", "a:b", "--cpu-policy", "batch"], {"HARNESS_CPU_POLICY": "normal"}).cpu_policy == "batch"


@pytest.mark.skipif(not hasattr(os, "SCHED_BATCH"), reason="SCHED_BATCH is Linux only")
@pytest.mark.parametrize(("policy", "expected"), [("batch", "SCHED_BATCH"), ("normal", "SCHED_OTHER")])
def test_threads_started_before_and_after_get_the_policy(policy: str, expected: str) -> None:
    # the child starts batch for "normal", so the switch back is seen too
    prefix = ["chrt", "--batch", "0"] if policy == "normal" else []
    done = subprocess.run([*prefix, sys.executable, "-c", CHILD.format(policy=policy)],
                          capture_output=True, text=True, timeout=60, check=True)
    refused, policies = done.stdout.strip().splitlines()
    assert refused == "None"
    assert policies == str([getattr(os, expected)])
