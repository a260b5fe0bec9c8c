"""The owner's handle on one session of a Kafka log (``KafkaLog.claim`` returns it)."""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Sequence
from typing import Protocol

from harness.errors import FencedError
from harness.log import _Codec, _encode_batch
from harness.log.base import LogEntry
from harness.log.kafka.writer import Append, PartitionWriter
from harness.records import Record

__all__ = ["KafkaSessionWriter", "WriterRegistry"]


class WriterRegistry(Protocol):
    """What a session writer needs from the log that made it (``KafkaLog``)."""

    @property
    def codec(self) -> _Codec: ...

    def check_writer(self, writer: KafkaSessionWriter) -> None:
        """Raise ``FencedError`` if a newer claim of the session replaced ``writer``."""
        ...

    async def release_writer(self, writer: KafkaSessionWriter) -> None:
        """Forget ``writer``; the last session of a partition closes its producer."""
        ...


class KafkaSessionWriter:
    """The owner's handle on one session; appends go through its partition's shared writer."""

    def __init__(
        self,
        log: WriterRegistry,
        session_id: str,
        *,
        owner: str,
        epoch: int,
        partition: int,
        writer: PartitionWriter,
    ) -> None:
        self._log = log
        self._session_id = session_id
        self._owner = owner
        self._epoch = epoch
        self._writer = writer
        self.partition = partition

    @property
    def session_id(self) -> str:
        return self._session_id

    @property
    def epoch(self) -> int:
        return self._epoch

    @property
    def owner(self) -> str:
        return self._owner

    @property
    def shared(self) -> PartitionWriter:
        """The partition's writer this session's appends go through."""
        return self._writer

    async def append(self, records: Sequence[Record]) -> list[LogEntry]:
        """Append all ``records`` in one transaction or none; returns once committed.

        Appends of other sessions of the partition that arrive meanwhile share the next
        transaction (group commit); one append's records are never split. Cancelling the
        call before its transaction began lands nothing; after, its outcome stands.

        Raises:
            FencedError: another claim (here or in any process) took over; nothing written.
            RecordTooLarge: a record exceeds the size limit; nothing of this append written.
            LogUnavailable: the cluster failed; nothing of this append is visible.
        """
        encoded = _encode_batch(self._log.codec, self._session_id, records)
        self._log.check_writer(self)
        if not encoded:
            return []
        future: concurrent.futures.Future[list[int]] = concurrent.futures.Future()
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[list[int]] = loop.create_future()
        self._writer.enqueue(Append(self._session_id, self._epoch, encoded, future, records, loop, waiter))
        try:
            offsets = await waiter
        except asyncio.CancelledError:
            future.cancel()  # lands nothing if its transaction has not begun; else its outcome stands
            raise
        return [LogEntry(offset + 1, record) for offset, record in zip(offsets, records, strict=True)]

    async def renew(self) -> None:
        """No lease to renew; raises ``FencedError`` if this writer is known to be fenced."""
        self._log.check_writer(self)
        if self._writer.dead:
            raise FencedError(
                f"session {self._session_id!r}: partition {self.partition} is owned by another writer",
                session_id=self._session_id,
                epoch=self._epoch,
            )

    async def release(self) -> None:
        """Give the session up; the last session of a partition closes its producer."""
        await self._log.release_writer(self)
