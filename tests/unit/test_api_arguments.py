"""A wrong value given to a public call fails at that call, with a typed error that says
what is wrong and how to fix it (never an AttributeError from deep inside, later)."""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path

import pytest

from harness import HarnessHost, open_log
from harness.errors import DefinitionError
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


@pytest.mark.parametrize("log", [None, 5, Path("harness.db")], ids=["none", "int", "path"])
def test_host_log_must_be_a_session_log_or_its_url(log):
    with pytest.raises(TypeError, match=f"log= takes a session log or its URL, not {type(log).__name__}"):
        HarnessHost(log=log)


@pytest.mark.parametrize("given", [5, 2.5, timedelta(seconds=5)])
async def test_host_lease_and_poll_interval_take_a_timedelta_or_seconds(given):
    async with HarnessHost(log="memory:", lease=given, poll_interval=given) as host:
        seconds = given.total_seconds() if isinstance(given, timedelta) else given
        assert host.lease == timedelta(seconds=seconds) and host.poll_interval == seconds


@pytest.mark.parametrize(
    ("bad", "says"),
    [
        (True, "takes a timedelta or a number of seconds as its duration, not bool"),
        ("5", "takes a timedelta or a number of seconds as its duration, not str"),
        (float("nan"), "give a finite duration"),
        (float("inf"), "give a finite duration"),
        (0, "must be a positive duration, not 0"),
        (-1.5, "must be a positive duration, not -1.5"),
        (timedelta(0), "must be a positive duration"),
    ],
)
@pytest.mark.parametrize("name", ["lease", "poll_interval"])
def test_host_lease_and_poll_interval_must_be_positive_durations(name, bad, says):
    with pytest.raises(DefinitionError, match=re.escape(f"HarnessHost({name}=)")) as refused:
        HarnessHost(log="memory:", **{name: bad})
    assert says in str(refused.value)


@pytest.mark.parametrize("bad", [0, True, "4", 2.0])
def test_host_sync_threads_is_a_whole_number(bad):
    with pytest.raises(DefinitionError, match=f"sync_threads must be a whole number of at least 1, not {bad!r}"):
        HarnessHost(log="memory:", sync_threads=bad)
