"""The local broker's JIT: C1 only for a quick start (tests), the full JIT for a broker
people run for a while (``harness kafka-local``) and for benchmarks."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.testing import kafka_local
from harness.testing.kafka_local import LocalKafka


def test_tests_start_with_c1_only_and_a_long_running_broker_gets_the_full_jit() -> None:
    quick = LocalKafka()._java_cmd(Path("/libs"), Path("/l.properties"), "kafka.Kafka")
    full = LocalKafka(quick_start=False)._java_cmd(Path("/libs"), Path("/l.properties"), "kafka.Kafka")
    assert "-XX:TieredStopAtLevel=1" in quick
    assert not any(arg.startswith("-XX:TieredStopAtLevel") for arg in full)
    # jvm_opts still come after the defaults (so they can override them)
    extra = LocalKafka(jvm_opts=["-Xmx2g"])._java_cmd(Path("/libs"), Path("/l.properties"), "kafka.Kafka")
    assert extra.index("-Xmx2g") > extra.index("-Xmx1g")


def test_harness_kafka_local_runs_the_full_jit(monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[LocalKafka] = []

    class Stop(Exception):
        pass

    def ensure_jars(*args: object, **kwargs: object) -> Path:
        raise Stop

    monkeypatch.setattr(kafka_local, "ensure_jars", ensure_jars)
    original = LocalKafka.__init__

    def record(self: LocalKafka, **kwargs: object) -> None:
        original(self, **kwargs)  # type: ignore[arg-type]
        made.append(self)

    monkeypatch.setattr(LocalKafka, "__init__", record)
    with pytest.raises(Stop):
        kafka_local.main([])
    assert made and not any(opt.startswith("-XX:TieredStopAtLevel") for opt in made[0].jvm_opts)


def test_the_broker_is_sized_for_the_cores_it_shares() -> None:
    small_threads, small_gc = kafka_local.sized_for(2)
    assert small_threads == {"num.network.threads": 1, "num.io.threads": 2}
    assert small_gc == ("-XX:+UseParallelGC",)
    big_threads, big_gc = kafka_local.sized_for(16)
    assert big_threads == {"num.network.threads": 8, "num.io.threads": 16}
    assert "-XX:+UseG1GC" in big_gc
    assert kafka_local.sized_for(0)[0] == {"num.network.threads": 1, "num.io.threads": 2}


def test_the_sizing_reaches_the_broker_and_a_chosen_collector_wins(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(kafka_local, "machine_cores", lambda: 2)
    broker = LocalKafka()
    broker.controller_port = 1
    broker.port = 2
    config = broker._config(tmp_path)
    assert config["num.network.threads"] == 1 and config["num.io.threads"] == 2
    assert "-XX:+UseParallelGC" in broker._java_cmd(Path("/libs"), Path("/l.properties"), "kafka.Kafka")
    # overrides still win over the sizing
    assert LocalKafka(overrides={"num.io.threads": 6})._config(tmp_path)["num.io.threads"] == 6
    chosen = LocalKafka(jvm_opts=["-XX:+UseZGC"])._java_cmd(Path("/libs"), Path("/l.properties"), "kafka.Kafka")
    assert "-XX:+UseZGC" in chosen and not any(o in chosen for o in ("-XX:+UseParallelGC", "-XX:+UseG1GC"))
