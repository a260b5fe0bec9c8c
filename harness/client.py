"""``HarnessClient``: what another service needs to use sessions run by workers.

It only produces inputs and reads committed records; it never drives a turn. The
same can be done from any language with the Avro schemas alone (``schemas/README.md``).

    client = HarnessClient(bootstrap="kafka:9092", topic_prefix="acme")
    await client.send("s-1", "check out order 42", harness="acme/assistant", input_id="in-1")
    settled = await client.wait_settled("s-1", "in-1", timeout=60)
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Mapping
from typing import Any

from harness.context import check_app_records
from harness.jsonvalues import check_text, json_copy
from harness.log.base import SessionLog
from harness.records import InputAnswer, InputCancel, InputMessage, InputRecords, InputSettled, LogEntry

__all__ = ["HarnessClient"]

POLL_S = 0.1
"""How often ``events`` re-reads a log that cannot be tailed (SQLite, memory)."""


class HarnessClient:
    """Send inputs to sessions and read their records.

    Args:
        bootstrap: Kafka bootstrap servers (``host:port[,host:port]``); or
        log: any session log (``open_log(url)``), e.g. the embedded SQLite file.
        topic_prefix: the topics' prefix on Kafka.
        partitions: partitions of the sessions topic on Kafka (as every worker and
            producer of it is configured; a topic of another shape is refused).
        client_config: librdkafka settings (security ...), copied.
    """

    def __init__(
        self,
        *,
        bootstrap: str | None = None,
        topic_prefix: str = "harness",
        partitions: int = 12,
        client_config: Mapping[str, Any] | None = None,
        log: SessionLog | None = None,
    ) -> None:
        if (bootstrap is None) == (log is None):
            raise ValueError("give bootstrap= (Kafka) or log=, one of them")
        if log is None:
            from harness.log.kafka.log import KafkaLog

            log = KafkaLog(
                bootstrap=bootstrap or "", topic_prefix=topic_prefix, partitions=partitions, client_config=client_config
            )
            self._owns_log = True
        else:
            self._owns_log = False
        self.log: SessionLog = log
        # (session, input id) -> position of the input this client sent: a reuse of an
        # input id with another payload is settled on its own position (input_seq).
        self._sent: dict[tuple[str, str], int] = {}

    @staticmethod
    def _now() -> int:
        return int(time.time() * 1000)

    async def send(self, session_id: str, text: str, *, harness: str | None = None, input_id: str | None = None) -> str:
        """Send a user message; returns its ``input_id`` (resending one has no second effect)."""
        check_text(text, what="the message text")
        input_id = input_id or f"in-{uuid.uuid4().hex}"
        entry = await self.log.submit(InputMessage(session_id, self._now(), input_id, text, harness))
        self._sent[(session_id, input_id)] = entry.seq
        return input_id

    async def answer(
        self, session_id: str, tool_call_id: str, name: str, value: Any, *, input_id: str | None = None
    ) -> str:
        """Answer a ``step.ask``; the owner validates it against the ask's schema."""
        input_id = input_id or f"answer:{tool_call_id}:{name}"
        value = json_copy(value, what="answer")
        entry = await self.log.submit(InputAnswer(session_id, self._now(), input_id, tool_call_id, name, value))
        self._sent[(session_id, input_id)] = entry.seq
        return input_id

    async def append_records(
        self, session_id: str, records: list[dict[str, Any]], *, input_id: str | None = None
    ) -> str:
        """Append app records to a session (once per ``input_id``)."""
        checked = check_app_records(records)
        input_id = input_id or f"rec-{uuid.uuid4().hex}"
        entry = await self.log.submit(InputRecords(session_id, self._now(), input_id, checked))
        self._sent[(session_id, input_id)] = entry.seq
        return input_id

    async def cancel(self, session_id: str, input_id: str) -> str:
        """Cancel an input: its turn stops at its next boundary and settles ``aborted`` (a
        queued input never runs). Returns the cancel request's own input id
        (``cancel:<input_id>``); ``wait_settled(session_id, input_id)`` tells how it ended."""
        cancel_id = f"cancel:{input_id}"
        await self.log.submit(InputCancel(session_id, self._now(), cancel_id, input_id))
        return cancel_id

    async def events(self, session_id: str, after: int | None = None) -> AsyncIterator[LogEntry]:
        """The session's committed records from position ``after`` on (all if None), live.

        Each entry's ``seq`` is its position: pass the last one seen as ``after`` to resume.
        """
        position = 0 if after is None else after
        tail = getattr(self.log, "tail_partition", None)
        if tail is not None:
            partition = self.log.partition_for(session_id)  # type: ignore[attr-defined]
            async for entry in tail(partition, position):
                if entry.session_id == session_id:
                    yield entry
            return
        while True:
            entries = await self.log.read(session_id, after=position)
            for entry in entries:
                position = entry.seq
                yield entry
            if not entries:
                await asyncio.sleep(POLL_S)

    async def wait_settled(self, session_id: str, input_id: str, *, timeout: float | None = None) -> InputSettled:
        """Wait until the owner settled ``input_id``; returns its verdict.

        Raises:
            TimeoutError: not settled within ``timeout`` seconds.
        """
        mine = self._sent.get((session_id, input_id))
        first: int | None = None  # position of the first input record of this id
        async with asyncio.timeout(timeout):
            async for entry in self.events(session_id):
                record = entry.record
                if record.IS_INPUT and getattr(record, "input_id", None) == input_id and first is None:
                    first = entry.seq
                if isinstance(record, InputSettled) and record.input_id == input_id:
                    # The verdict on the record this client sent: a reuse of the id with
                    # another payload is settled on its own position (input_seq).
                    settles = record.input_seq if record.input_seq is not None else first
                    if mine is None or settles == mine:
                        return record
        raise AssertionError("unreachable: events() never ends")

    async def close(self) -> None:
        if self._owns_log:
            await self.log.close()

    async def __aenter__(self) -> HarnessClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
