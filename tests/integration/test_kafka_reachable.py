"""Whether the Kafka cluster answers *now*: the gateway's readiness asks it on every check
(a started log goes on without asking), and reads of a broker that is down are
``LogUnavailable`` (503 at the gateway), never a raw client exception
(harness.log.kafka.topics.ClusterProbe, KafkaLog.check_reachable, the checkpoint read)."""

from __future__ import annotations

import socket

import pytest

from harness.errors import LogUnavailable
from harness.log.kafka import KafkaLog
from harness.log.kafka.config import KafkaSettings
from harness.log.kafka.snapshots import SnapshotStore
from harness.log.kafka.topics import ClusterProbe

pytestmark = pytest.mark.asyncio


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_a_cluster_that_does_not_answer_is_log_unavailable_naming_where(monkeypatch: pytest.MonkeyPatch) -> None:
    from harness.log.kafka import snapshots

    monkeypatch.setattr(snapshots, "ADMIN_TIMEOUT_S", 1.0)  # (30 s otherwise)
    port = closed_port()
    settings = KafkaSettings(bootstrap=f"127.0.0.1:{port}", topic_prefix="nobody")
    with pytest.raises(LogUnavailable, match=f"the Kafka cluster at 127.0.0.1:{port} did not answer within 1 s"):
        ClusterProbe(settings).check(1.0)
    with pytest.raises(LogUnavailable, match=r"reading the checkpoint of partition 0 failed: .*is the broker up"):
        await SnapshotStore(settings, None).read(0, create=False)


@pytest.mark.kafka
async def test_a_started_log_asks_the_cluster_again_and_sees_its_topic(kafka_bootstrap: str, unique_prefix: str) -> None:
    log = KafkaLog(bootstrap=kafka_bootstrap, topic_prefix=unique_prefix, partitions=1)
    await log.start()
    try:
        await log.check_reachable(5.0)
        await log.check_reachable(5.0)  # (the same admin client, asked again)
    finally:
        await log.close()
    missing = KafkaLog(bootstrap=kafka_bootstrap, topic_prefix=f"{unique_prefix}x", partitions=1, create_topics=False)
    try:
        with pytest.raises(LogUnavailable, match=f"the topic '{unique_prefix}x.sessions' is not there"):
            await missing.check_reachable(5.0)
    finally:
        await missing.close()
