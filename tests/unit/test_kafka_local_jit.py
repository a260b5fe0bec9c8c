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
