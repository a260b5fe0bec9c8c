"""The live topic on a real broker: workers publish the text deltas of streamed model answers to
``<prefix>.live``; ``HarnessClient.events(sid, live=True)`` in another process gets them between
the committed records. The worker runs a harness whose model comes from ``from_uri``, against the
local provider test server."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import confluent_kafka  # noqa: F401 - the dev extra has it; never skipped
import pytest
from confluent_kafka.admin import AdminClient, ConfigResource  # type: ignore[attr-defined]

from harness.client import HarnessClient
from harness.ids import live_topic
from harness.live import LiveEvent
from harness.live.kafka import LIVE_RETENTION_MS, KafkaLivePublisher, kafka_live_events
from harness.log.kafka import KafkaLog
from harness.records import LogEntry
from harness.testing.model_server import ModelServer, Reply
from tests.integration.fleet_helpers import REPO, WorkerProcess, wait_until

pytestmark = [pytest.mark.kafka]

PARTITIONS = 3


@pytest.fixture
def server() -> Iterator[ModelServer]:
    with ModelServer() as s:
        yield s


def event(session_id: str, n: int) -> LiveEvent:
    return LiveEvent(session_id=session_id, turn=1, index=0, retry=0, position=n, text=f"d{n}", ts=n)


async def test_publisher_and_reader_on_the_live_topic(kafka_bootstrap: str, unique_prefix: str) -> None:
    log = KafkaLog(bootstrap=kafka_bootstrap, topic_prefix=unique_prefix, partitions=PARTITIONS)
    publisher = KafkaLivePublisher.for_log(log)
    try:
        await asyncio.to_thread(publisher.start)
        # Two sessions in one partition: a reader gets only its own session's events, in order.
        a = "s-a"
        b = next(f"s-b{i}" for i in range(1000) if log.partition_for(f"s-b{i}") == log.partition_for(a))
        publisher.publish(event(a, 0))  # before the reader's time: not seen
        await asyncio.to_thread(publisher.close)
        await asyncio.to_thread(publisher.start)
        since = int(time.time() * 1000) + 1
        while int(time.time() * 1000) < since:  # the next events get timestamps >= since
            await asyncio.sleep(0)
        reader = kafka_live_events(
            bootstrap=kafka_bootstrap, topic_prefix=unique_prefix, partition=log.partition_for(a),
            session_id=a, since_ms=since,
        )
        for n in range(1, 6):
            publisher.publish(event(a, n))
            publisher.publish(event(b, n))
        await asyncio.to_thread(publisher.close, 10.0)
        got: list[LiveEvent] = []
        async with asyncio.timeout(60):
            async for item in reader:
                got.append(item)
                if len(got) == 5:
                    break
        await reader.aclose()
        assert [(e.session_id, e.text) for e in got] == [(a, f"d{n}") for n in range(1, 6)]
        # The topic: as many partitions as the sessions topic, short retention.
        admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
        topic = live_topic(unique_prefix)
        assert len(admin.list_topics(topic, timeout=30).topics[topic].partitions) == PARTITIONS
        resource = ConfigResource("topic", topic)
        configs = admin.describe_configs([resource])[resource].result(timeout=30)
        assert configs["retention.ms"].value == str(LIVE_RETENTION_MS)
    finally:
        publisher.close()
        await log.close()


def worker_env(server: ModelServer) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    env["HARNESS_TEST_MODEL_URI"] = f"openai+{server.openai_url}:test-model"
    for name in ("HARNESS_LOG", "HARNESS_APPS", "OPENAI_API_KEY"):
        env.pop(name, None)
    return env


async def test_worker_on_kafka_streams_deltas_to_a_client_in_another_process(
    kafka_bootstrap: str, unique_prefix: str, server: ModelServer, tmp_path: Path
) -> None:
    url = f"kafka://{kafka_bootstrap}?topic_prefix={unique_prefix}&partitions={PARTITIONS}"
    answer = "Streaming from a worker to a client, through Kafka."
    server.script(Reply(text=answer, chunk=6, pause_after=4))
    worker = WorkerProcess(
        name="w0", log_url=url, apps=["tests.apps.real_model:assistant"], env=worker_env(server), workdir=tmp_path
    )
    client = HarnessClient(bootstrap=kafka_bootstrap, topic_prefix=unique_prefix, partitions=PARTITIONS)
    try:
        await wait_until(lambda: worker.ready, timeout=90, what="worker ready", details=worker.describe)
        seen: list[Any] = []
        events = client.events("s-1", live=True)  # anchored now: every delta of the answer is seen

        async def follow() -> None:
            async for item in events:
                seen.append(item)
                if isinstance(item, LogEntry) and item.type == "harness.input.settled":
                    return

        follower = asyncio.create_task(follow())
        await client.send("s-1", "stream please", harness="tests/real-model", input_id="in-1")
        await wait_until(lambda: any(isinstance(i, LiveEvent) for i in seen), timeout=60,
                         what="a live delta", details=worker.describe)
        assert await asyncio.to_thread(server.paused.wait, 30)
        # Half-way: the client saw deltas; the log holds no response yet.
        assert not any(isinstance(i, LogEntry) and i.type == "harness.model.response" for i in seen)
        server.release()
        await asyncio.wait_for(follower, 90)
        deltas = [i for i in seen if isinstance(i, LiveEvent)]
        assert "".join(d.text for d in deltas) == answer
        assert [d.position for d in deltas] == list(range(0, len(answer), 6))
        entries = [i for i in seen if isinstance(i, LogEntry)]
        response = next(e for e in entries if e.type == "harness.model.response")
        assert response.data["text"] == answer
        kinds = ["delta" if isinstance(i, LiveEvent) else i.type for i in seen]
        assert kinds.index("harness.model.response") > max(i for i, k in enumerate(kinds) if k == "delta")
        assert [e.type for e in entries] == [e.type for e in await client.log.read("s-1")]  # nothing per delta
        assert worker.terminate() == 0, worker.describe()
    finally:
        worker.cleanup()
        await client.close()
