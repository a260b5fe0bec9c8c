"""What a worker says while its broker does not answer (harness.runtime.broker_silence):
the first failure at once with its reason, then one line a minute saying for how long, and
one when it answers again (before: a KafkaError repr every 5 s)."""

from __future__ import annotations

from confluent_kafka import KafkaError, KafkaException

from harness.runtime.broker_silence import BrokerSilence, kafka_reason


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def down() -> KafkaException:
    return KafkaException(KafkaError(KafkaError._TRANSPORT, "Failed to get metadata: Local: Broker transport failure"))


def test_a_broker_down_for_three_minutes_is_a_few_lines_not_one_every_probe() -> None:
    clock = Clock()
    silence = BrokerSilence("kafka-0:9092", repeat=60, clock=clock)
    said = []
    clock.now += 5
    for _ in range(36):  # a probe every 5 s for 3 minutes
        clock.now += 5
        said.append(silence.failed(down()))
    lines = [line for line in said if line is not None]
    assert lines == [
        "the broker at kafka-0:9092 did not answer (Failed to get metadata: Local: Broker transport failure); "
        "waiting for it",
        "the broker at kafka-0:9092 has not answered for 70 s; waiting for it",
        "the broker at kafka-0:9092 has not answered for 130 s; waiting for it",
    ]
    assert silence.silent
    clock.now += 5
    assert silence.answered() == "the broker at kafka-0:9092 answers again (after 190 s)"
    assert not silence.silent and silence.answered() is None
    clock.now += 5
    assert silence.failed(down()) is not None  # a new outage is said at once


def test_kafka_reason_is_the_errors_text_not_its_repr() -> None:
    assert kafka_reason(down()) == "Failed to get metadata: Local: Broker transport failure"
    assert kafka_reason(TimeoutError("slow")) == "slow"
    assert kafka_reason(TimeoutError()) == "TimeoutError"
