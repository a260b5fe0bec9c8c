"""One broker per data dir: ``LocalKafka`` locks the dir before it touches anything in it.

Kafka's own ``.lock`` comes too late: a second broker on a running broker's dir read the
first one's metadata log mid-write and died on a "corrupt record" (seen in CI), after it
had already rewritten the running broker's ``server.properties``.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

import pytest

from harness.testing import kafka_local
from harness.testing.kafka_local import KafkaLaunchError, LocalKafka


class _Stop(Exception):
    pass


def _no_jars(*args: object, **kwargs: object) -> Path:
    raise _Stop


def test_a_second_broker_on_a_locked_data_dir_says_so_in_one_line_and_touches_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(kafka_local, "ensure_jars", _no_jars)
    props = tmp_path / "server.properties"
    props.write_text("the running broker's\n")
    fd = os.open(tmp_path / kafka_local._DATA_DIR_LOCK, os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(KafkaLaunchError) as err:
            LocalKafka(data_dir=tmp_path).start()
        assert err.value.summary == (
            f"the data dir {tmp_path.resolve()} is in use by another broker: stop that one, or give another --data-dir"
        )
        assert props.read_text() == "the running broker's\n"
    finally:
        os.close(fd)
    # once the other one lets go, the dir is free again (the lock is taken, then the jars)
    broker = LocalKafka(data_dir=tmp_path)
    with pytest.raises(_Stop):
        broker.start()
    assert broker._lock_fd is None  # a failed start lets go of the lock


def test_the_lock_is_held_while_started_and_released_on_stop(tmp_path: Path) -> None:
    broker = LocalKafka(data_dir=tmp_path)
    broker._lock_data_dir(tmp_path)
    other = LocalKafka(data_dir=tmp_path)
    with pytest.raises(KafkaLaunchError):
        other._lock_data_dir(tmp_path)
    broker.stop()
    other._lock_data_dir(tmp_path)
    other.stop()


def test_a_data_dir_that_cannot_be_one_and_a_port_out_of_range_each_get_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(kafka_local, "ensure_jars", lambda *args, **kwargs: tmp_path)
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    assert kafka_local.main(["--data-dir", str(a_file)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == f"kafka-local: cannot use {a_file} as the data dir (not a directory): give another --data-dir"
    for port in ["-5", "0", "70000", "abc"]:
        with pytest.raises(SystemExit) as exit_:
            kafka_local.main(["--port", port])
        assert exit_.value.code == 2
        line = capsys.readouterr().err.strip().splitlines()[-1]
        assert "give a number from 1 to 65535" in line, line
