"""The collector settings of long-running services (harness.gcpause)."""

from __future__ import annotations

import json
import subprocess
import sys

from harness.gcpause import SERVICE_GEN0_THRESHOLD


def test_a_service_freezes_what_it_loaded_and_collects_the_young_less_often() -> None:
    # In a process of its own: the settings are process-wide.
    code = (
        "import gc, json; from harness.gcpause import tune_for_service; "
        "before = gc.get_freeze_count(); tune_for_service(); "
        "print(json.dumps([before, gc.get_freeze_count(), gc.get_threshold()[0], gc.isenabled()]))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    before, frozen, young, enabled = json.loads(out.stdout)
    assert before == 0 and frozen > 1000  # the modules, schemas, ... loaded so far
    assert young == SERVICE_GEN0_THRESHOLD and enabled is True
