"""Ctrl-C at any moment of a CLI command ends it with exit 130 and no traceback."""

from __future__ import annotations

import importlib

import pytest

import harness.cli as cli


def test_ctrl_c_while_the_commands_module_loads_is_exit_130_without_a_traceback(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # The subcommand's module is imported after main() starts (a quarter of a second for
    # `harness sessions`): a Ctrl-C then used to print the import's whole traceback.
    real_import = importlib.import_module

    def interrupted(name: str, *args: object) -> object:
        if name.startswith("harness.cli.sessions"):
            raise KeyboardInterrupt
        return real_import(name, *args)

    monkeypatch.setattr(cli.importlib, "import_module", interrupted)
    assert cli.main(["sessions", "--log", "sqlite:///nowhere.db"]) == 130
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert err == "\n"
