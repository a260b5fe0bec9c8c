"""The gateway's shared readers: many subscribers of a session cost one reader of the log
(one per partition on Kafka); each sees every record after its cursor once, in order."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from harness.log import open_log
from harness.records import InputMessage
from harness.services.gateway.sources import LogEventSource


async def _collect(source: LogEventSource, sid: str, after: int, n: int, out: list[int]) -> None:
    async for entry in source.subscribe(sid, after):
        out.append(entry.seq)
        if len(out) >= n:
            return


async def fan_out(url: str, subscribers: int) -> None:
    log = open_log(url)
    source = LogEventSource(log, poll_s=0.01)
    try:
        for i in range(5):
            await log.submit(InputMessage("s", i, f"early-{i}", "x", "h"))
            await log.submit(InputMessage("other", i, f"o-{i}", "x", "h"))
        total = 25
        results: list[list[int]] = [[] for _ in range(subscribers)]
        tasks = [asyncio.create_task(_collect(source, "s", 0, total, results[k])) for k in range(subscribers // 2)]
        for i in range(10):
            await log.submit(InputMessage("s", i, f"mid-{i}", "x", "h"))
            await asyncio.sleep(0)
        # the second half joins late, from the start: catch-up read, then the shared reader
        tasks += [asyncio.create_task(_collect(source, "s", 0, total, results[k]))
                  for k in range(subscribers // 2, subscribers)]
        for i in range(10):
            await log.submit(InputMessage("s", i, f"late-{i}", "x", "h"))
            await log.submit(InputMessage("other", i, f"ol-{i}", "x", "h"))
        await asyncio.wait_for(asyncio.gather(*tasks), 60)
        expected = [e.seq for e in await log.read("s")]
        assert len(expected) == total
        for got in results:
            assert got == expected
        assert source.readers_started == 1  # one reader for every subscriber
        assert source.subscribers == 0
        # resuming from a cursor gives exactly what follows it
        tail: list[int] = []
        await asyncio.wait_for(_collect(source, "s", expected[9], total - 10, tail), 30)
        assert tail == expected[10:]
    finally:
        await source.close()
        await log.close()


@pytest.mark.parametrize("backend", ["memory", "sqlite"])
def test_fan_out_shares_one_reader(backend: str, tmp_path: Path) -> None:
    url = "memory:" if backend == "memory" else f"sqlite:///{tmp_path / 'h.db'}"
    asyncio.run(fan_out(url, 200))


@pytest.mark.kafka
def test_fan_out_shares_one_reader_per_partition_kafka(kafka_bootstrap: str, unique_prefix: str) -> None:
    asyncio.run(fan_out(f"kafka://{kafka_bootstrap}?topic_prefix={unique_prefix}&partitions=1", 50))


