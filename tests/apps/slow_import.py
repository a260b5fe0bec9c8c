"""An app whose import waits for the test, so a signal lands while a command loads its
apps: it creates ``importing`` in ``$HARNESS_TEST_GATE_DIR`` and goes on once ``imported``
exists there. Its harness is ``tests.apps.cli_app``'s."""

from __future__ import annotations

import os
import time
from pathlib import Path

_folder = Path(os.environ["HARNESS_TEST_GATE_DIR"])
(_folder / "importing").write_text("")
while not (_folder / "imported").exists():
    time.sleep(0.02)

from tests.apps.cli_app import assistant  # noqa: E402 - after the gate, on purpose

__all__ = ["assistant"]
