"""`harness answer` with JSON the log cannot hold is a usage error, refused before anything is opened."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.cli import main


@pytest.mark.parametrize(
    ("value", "what"),
    [
        ('{"approved": true, "note": NaN}', "$.note is nan"),
        ('{"approved": 1e999}', "$.approved is inf"),
        ('{"n": 123456789012345678901234567890}', "outside the signed 64-bit range"),
        ('{"note": "\\ud800"}', "lone surrogate"),
    ],
)
def test_an_answer_the_log_cannot_hold_is_exit_2_with_one_line(
    value: str, what: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = f"sqlite:///{tmp_path / 'none.db'}"  # never opened: the value is checked first
    assert main(["answer", "s-1", "call-1", "approval", value, "--log", log]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("harness answer: answer at ")
    assert what in err
    assert "nothing was sent" in err
    assert not (tmp_path / "none.db").exists()
