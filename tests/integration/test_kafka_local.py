"""Smoke test for the real local Kafka broker launcher (harness.testing.kafka_local)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import confluent_kafka as ck
import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from harness.testing.kafka_local import LocalKafka

pytestmark = pytest.mark.kafka


@pytest.fixture(scope="module")
def broker() -> Iterator[LocalKafka]:
    with LocalKafka() as kafka:
        yield kafka


def _create_topic(bootstrap: str, topic: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics(
        [NewTopic(topic, num_partitions=1, replication_factor=1)]
    )
    futures[topic].result(timeout=30)


def _consume_committed(
    bootstrap: str, topic: str, n: int, timeout: float = 30.0
) -> list[tuple[bytes | None, bytes | None]]:
    consumer = ck.Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"g-{uuid.uuid4().hex}",
            "auto.offset.reset": "earliest",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topic])
    out: list[tuple[bytes | None, bytes | None]] = []
    deadline = time.monotonic() + timeout
    try:
        while len(out) < n and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            assert msg.error() is None, msg.error()
            out.append((msg.key(), msg.value()))
    finally:
        consumer.close()
    return out


def _txn_produce(
    bootstrap: str, topic: str, key: bytes, value: bytes, *, commit: bool
) -> None:
    producer = ck.Producer(
        {
            "bootstrap.servers": bootstrap,
            "transactional.id": f"tx-{uuid.uuid4().hex}",
            "enable.idempotence": True,
        }
    )
    producer.init_transactions(60)
    producer.begin_transaction()
    producer.produce(topic, key=key, value=value)
    if commit:
        producer.commit_transaction(60)
    else:
        producer.flush(30)
        producer.abort_transaction(60)


def test_transactional_roundtrip(broker: LocalKafka) -> None:
    assert broker.bootstrap == f"127.0.0.1:{broker.port}"
    topic = f"t-{uuid.uuid4().hex[:8]}"
    _create_topic(broker.bootstrap, topic)

    _txn_produce(broker.bootstrap, topic, b"k0", b"aborted", commit=False)
    t0 = time.monotonic()
    _txn_produce(broker.bootstrap, topic, b"k1", b"v1", commit=True)
    print(f"transactional produce+commit: {time.monotonic() - t0:.2f}s")

    assert _consume_committed(broker.bootstrap, topic, 1) == [(b"k1", b"v1")]


def test_restart_keeps_data(broker: LocalKafka) -> None:
    topic = f"r-{uuid.uuid4().hex[:8]}"
    _create_topic(broker.bootstrap, topic)
    _txn_produce(broker.bootstrap, topic, b"k", b"before-restart", commit=True)
    port = broker.port
    broker.restart()
    assert broker.port == port
    broker.warm_up_transactions()
    _txn_produce(broker.bootstrap, topic, b"k", b"after-restart", commit=True)
    got = _consume_committed(broker.bootstrap, topic, 2)
    assert [v for _, v in got] == [b"before-restart", b"after-restart"]


def test_cli_prints_bootstrap_and_stops_on_sigterm(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "harness.testing.kafka_local"]
    cmd += ["--data-dir", str(tmp_path)]
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True) as proc:
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline().strip()
            assert line.startswith("bootstrap=127.0.0.1:"), line
            admin = AdminClient({"bootstrap.servers": line.removeprefix("bootstrap=")})
            assert 1 in admin.list_topics(timeout=10).brokers
            # a second broker on the same port, or on the same data dir: one line each
            port = line.rsplit(":", 1)[1]
            for extra, says in [
                (["--port", port], f"kafka-local: port {port} is in use (another broker?): give another --port"),
                (["--data-dir", str(tmp_path)], f"kafka-local: the data dir {tmp_path} is in use by another broker"),
            ]:
                second = subprocess.run([sys.executable, "-m", "harness.testing.kafka_local", *extra],
                                        capture_output=True, text=True, timeout=120)
                assert second.returncode == 1
                assert second.stderr.strip().splitlines()[-1].startswith(says), second.stderr
                assert "Exception" not in second.stderr and "\tat " not in second.stderr, second.stderr
        finally:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=60) == 0


@pytest.mark.slow
def test_cli_reports_jar_download_progress_on_its_first_run(tmp_path: Path) -> None:
    from harness.testing.kafka_jars import KAFKA_VERSION, ensure_jars

    cache = tmp_path / "cache"
    err_path = tmp_path / "stderr"
    cmd = [sys.executable, "-m", "harness", "kafka-local", "--cache-dir", str(cache), "--data-dir", str(tmp_path / "d")]
    with open(err_path, "w") as err, subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True) as proc:
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline().strip()
            assert line.startswith("bootstrap=127.0.0.1:"), err_path.read_text()
        finally:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=60) == 0
    lines = err_path.read_text().splitlines()
    assert lines[0] == f"kafka-local: fetching the Apache Kafka {KAFKA_VERSION} jars with Maven (first run only) ..."
    libs = cache / f"kafka-{KAFKA_VERSION}" / "libs"
    jars = len(list(libs.glob("*.jar")))
    assert any(x.startswith("kafka-local: jars: ") and f"{jars} jars in place; ready in {libs}" in x for x in lines)
    assert lines[-1] == f"kafka-local: starting Apache Kafka {KAFKA_VERSION} (KRaft) ..."
    told: list[str] = []
    assert ensure_jars(cache, progress=told.append) == libs and told == []  # cached: nothing to report
