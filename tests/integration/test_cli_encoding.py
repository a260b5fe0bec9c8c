"""The CLI under a locale that is not UTF-8 (an ASCII locale: ``LANG=C`` with Python's
locale coercion and UTF-8 mode off, ``PYTHONIOENCODING=ascii``): the UTF-8 text it is
given arrives as typed, and what it prints is what the terminal can show, never an error."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest

from tests.integration.cli_helpers import HARNESS, Backend

pytestmark = pytest.mark.timeout(300)

NOT_UTF8 = {
    "ascii": {"PYTHONIOENCODING": "ascii"},
    "C locale": {"LC_ALL": "C", "LANG": "C", "PYTHONCOERCECLOCALE": "0", "PYTHONUTF8": "0"},
}


@pytest.fixture(scope="module")
def sqlite_worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Backend]:
    workdir = tmp_path_factory.mktemp("cli-encoding")
    backend = Backend("sqlite", f"sqlite:///{workdir / 'log.db'}", workdir)
    worker = backend.worker()
    deadline = time.monotonic() + 90
    while not worker.ready:
        assert worker.alive and time.monotonic() < deadline, worker.describe()
        time.sleep(0.1)
    sent = backend.cli("send", "enc-1", "café ✓ order=42", "--harness", HARNESS)
    assert sent.returncode == 0, sent.stderr
    yield backend
    backend.cleanup()


def test_a_utf8_message_under_an_ascii_locale_is_sent_as_typed(sqlite_worker: Backend) -> None:
    """Under an ASCII locale Python reads each byte of a UTF-8 argument it cannot decode as a
    lone surrogate, and `harness send s-1 'über'` was refused: "the message text holds a
    character that is not valid UTF-8 (byte 0xc3 at position 0)", though it was valid UTF-8.
    Now the argument's own bytes are read as UTF-8 (bytes that are not UTF-8 are still refused)."""
    sent = sqlite_worker.cli("send", "enc-2", "über", "--harness", HARNESS, "--no-wait", env=NOT_UTF8["C locale"])
    assert sent.returncode == 0, sent.stderr
    shown = json.loads(sqlite_worker.cli("show", "enc-2", "--json").stdout)
    assert shown["timeline"][0]["text"] == "über"
    answered = sqlite_worker.cli("answer", "enc-2", "c1", "q", '"ün"', env=NOT_UTF8["C locale"])
    assert "not valid UTF-8" not in answered.stderr and "no ask named 'q'" in answered.stderr, answered.stderr
    not_utf8 = sqlite_worker.cli("send", "enc-3", "caf\udcff", "--harness", HARNESS, env=NOT_UTF8["C locale"])
    assert not_utf8.returncode == 2 and "not valid UTF-8 (byte 0xff at position 3)" in not_utf8.stderr


@pytest.mark.parametrize("terminal", list(NOT_UTF8))
def test_show_sessions_and_send_print_on_a_terminal_that_is_not_utf8(sqlite_worker: Backend, terminal: str) -> None:
    """`harness show` printed nothing but "unexpected error: UnicodeEncodeError: 'ascii' codec can't
    encode character '\\xb7'" (its header's dots), exit 1, for every session; `harness send` of a
    message whose answer held an accent ended the same way after the turn had completed, so
    the answer was lost to its sender, who got exit 1 for a turn that worked. Now the
    timeline's marks are spelt in ASCII there (`->`, `...`, `-`) and a character the terminal
    cannot show is escaped (`\\xe9`)."""
    env = NOT_UTF8[terminal]
    show = sqlite_worker.cli("show", "enc-1", env=env)
    assert show.returncode == 0 and show.stderr == "", show.stderr
    assert "session enc-1  -  harness tests/cli" in show.stdout
    assert "→" not in show.stdout and "  -> completed" in show.stdout
    assert "caf\\xe9 \\u2713 order=42" in show.stdout
    listed = sqlite_worker.cli("sessions", env=env)
    assert listed.returncode == 0 and "enc-1" in listed.stdout, listed.stderr
    sent = sqlite_worker.cli("send", "enc-1", "über", env=env)
    assert sent.returncode == 0, sent.stderr
    assert sent.stdout.strip() == "you said: \\xfcber"
