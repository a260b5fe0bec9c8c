"""The CLI under a locale that is not UTF-8 (an ASCII locale: ``LANG=C`` with Python's
locale coercion and UTF-8 mode off, ``PYTHONIOENCODING=ascii``): the UTF-8 text it is
given arrives as typed."""

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
