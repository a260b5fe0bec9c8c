"""A wrong value given to a public call fails at that call, with a typed error that says
what is wrong and how to fix it (never an AttributeError from deep inside, later)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from harness import open_log
from harness.log import open_client_log


@pytest.mark.parametrize("url", [123, None, b"memory:"], ids=["int", "none", "bytes"])
def test_open_log_takes_a_url_string(url):
    for opener in (open_log, open_client_log):
        with pytest.raises(TypeError, match=f"takes a log URL as a string, not {type(url).__name__}"):
            opener(url)


def test_open_log_of_a_folder_names_the_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "adir").mkdir()
    says = f"names the folder {tmp_path / 'adir'}, not a file: name the log's file in it"
    for opener in (open_log, open_client_log):
        with pytest.raises(ValueError, match=re.escape(says)):
            opener("sqlite:///adir")
    assert sorted(p.name for p in Path(tmp_path).iterdir()) == ["adir"]  # nothing was created
