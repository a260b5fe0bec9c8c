"""`harness serve` / `harness gateway` settings given through the environment with a bad
value: one line naming the command and the variable, exit 2, nothing started."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.gateway.helpers import APP, child_env, harness_command


@pytest.mark.parametrize(
    ("command", "env", "expected"),
    [
        # read as false: the start was refused for want of auth, the variable never named
        ("serve", {"HARNESS_OPEN_ACCESS": "enable"},
         "harness serve: HARNESS_OPEN_ACCESS takes true or false (1 or 0, yes or no, on or off), not 'enable'"),
        ("gateway", {"HARNESS_OPEN_ACCESS": "maybe"},
         "harness gateway: HARNESS_OPEN_ACCESS takes true or false (1 or 0, yes or no, on or off), not 'maybe'"),
        # read as false: reads went unlimited without a word
        ("serve", {"HARNESS_OPEN_ACCESS": "true", "HARNESS_GATEWAY_RATE_LIMIT": "5",
                   "HARNESS_GATEWAY_RATE_LIMIT_READS": "enabled"},
         "harness serve: HARNESS_GATEWAY_RATE_LIMIT_READS takes true or false (1 or 0, yes or no, on or off), "
         "not 'enabled'"),
        # "harness: HARNESS_LOG_LEVEL / HARNESS_LOG_FORMAT: ...": neither the command nor which one
        ("serve", {"HARNESS_OPEN_ACCESS": "1", "HARNESS_LOG_LEVEL": "loud"},
         "harness serve: HARNESS_LOG_LEVEL: unknown log level 'loud'; use one of debug, info, warning, error, "
         "critical"),
        ("gateway", {"HARNESS_OPEN_ACCESS": "1", "HARNESS_LOG_FORMAT": "xml"},
         "harness gateway: HARNESS_LOG_FORMAT: unknown log format 'xml'; use text or json"),
    ],
)
def test_a_bad_value_in_the_environment_is_one_line_naming_the_variable(
    tmp_path: Path, command: str, env: dict[str, str], expected: str
) -> None:
    args = [command, "--log", "sqlite:///h.db", "--port", "0"] + (["--app", APP] if command == "serve" else [])
    done = subprocess.run(harness_command(*args), cwd=tmp_path, capture_output=True, text=True,
                          env=child_env(**env), timeout=60, stdin=subprocess.DEVNULL)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == expected
    assert not (tmp_path / "h.db").exists()


@pytest.mark.parametrize("value", ["on", "YES", " true "])
def test_open_access_takes_the_usual_words_for_true(tmp_path: Path, value: str) -> None:
    from harness.services.gateway.settings import parse_settings

    settings = parse_settings(["--log", "sqlite:///h.db"], {"HARNESS_OPEN_ACCESS": value})
    assert settings.open_access
