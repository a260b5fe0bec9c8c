"""``--app module:attribute`` mistakes a new user makes, each one ConfigError line saying
what to write instead (harness.services.worker.apps)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from harness.errors import ConfigError
from harness.services.worker.apps import load_harnesses


@pytest.fixture
def app_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "newapp_pkg").mkdir()
    (tmp_path / "newapp_pkg" / "__init__.py").write_text("")
    (tmp_path / "newapp_pkg" / "agents.py").write_text(
        "def none():\n    return []\n\nnumber = 7\nthings = ['a']\n"
    )
    monkeypatch.chdir(tmp_path)
    yield tmp_path
    for name in [m for m in sys.modules if m.startswith("newapp_pkg")]:
        del sys.modules[name]


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("newapp_pkg/agents.py:assistant",
         "'newapp_pkg/agents.py' is a file path; --app takes a module name: --app newapp_pkg.agents:assistant"),
        ("newapp_pkg/agents:assistant", "--app newapp_pkg.agents:assistant"),
        ("newapp_pkg.agents:none", "--app newapp_pkg.agents:none gives no harness (an empty list)"),
        ("newapp_pkg.agents:number", "--app newapp_pkg.agents:number gives an int, not a harness"),
        ("newapp_pkg.agents:things", "--app newapp_pkg.agents:things gives a str, not a harness"),
    ],
)
def test_an_app_that_is_not_a_module_attribute_holding_harnesses_is_refused_in_one_line(
    app_folder: Path, spec: str, says: str
) -> None:
    with pytest.raises(ConfigError) as refused:
        load_harnesses([spec])
    assert says in str(refused.value)
    assert "\n" not in str(refused.value)
