"""This process's owner writers of a Kafka log: one fenced producer per partition it
writes, which claim of a session is current, and how far its commits reached.

Kafka has no leases. The owner of a session is whoever last ran ``init_transactions``
for its partition; within one process the latest claim of a session (a local epoch
counter) fences the earlier writers of that session. Producers live as long as the
log: releasing a partition's last session keeps its producer (no second
``init_transactions``, ~100 ms); ``disown`` and ``close`` close it.

Once the group gave this process a partition (``own``), it writes only to the
partitions the group gives it: a claim never starts a producer of its own there, since
a new producer could fence the partition's real owner (e.g. after this process was
frozen and the group moved the partition meanwhile).

Every method is quick and never waits: the caller awaits a writer's ``ready`` or
``closed`` future itself.
"""

from __future__ import annotations

import concurrent.futures
import threading
from collections.abc import Callable
from dataclasses import dataclass

from harness.errors import FencedError, LogClosed
from harness.log.base import LeaseInfo
from harness.log.kafka.config import KafkaSettings
from harness.log.kafka.stats import KafkaLogStats
from harness.log.kafka.writer import PartitionWriter
from harness.records import Record

__all__ = ["Owners"]


@dataclass(slots=True)
class _Ownership:
    """What this process knows about one session's writer."""

    epoch: int = 0
    owner: str | None = None
    writer: PartitionWriter | None = None


class Owners:
    """The owner side of one :class:`~harness.log.kafka.log.KafkaLog` (thread-safe).

    Args:
        settings: the log's current settings (its partition count may be learned late).
        stats: counters of the log.
        on_records: told about each record a writer writes, as it is delivered and before
            its transaction commits (writer thread).
    """

    def __init__(
        self,
        settings: Callable[[], KafkaSettings],
        stats: KafkaLogStats,
        *,
        on_records: Callable[[int, list[tuple[int, Record]]], None],
    ) -> None:
        self._settings = settings
        self._stats = stats
        self._on_records = on_records
        self._lock = threading.Lock()  # guards every field below; never held while waiting
        self._closed = False
        self._writers: dict[int, PartitionWriter] = {}
        self._pinned: set[int] = set()  # partitions the group gave this process
        self._assigned_only = False  # set by the first own(): claims start no producer after
        self._sessions: dict[str, _Ownership] = {}
        self._committed: dict[int, int] = {}  # partition -> end of what this process committed

    def claim(self, session_id: str, partition: int, owner: str) -> tuple[PartitionWriter, int]:
        """Make ``owner`` the current writer of ``session_id``: its partition's writer
        (started here unless this process writes only what the group gives it) and the
        claim's epoch, which fences this process's earlier writers of the session.

        Raises:
            FencedError: (a worker) the partition is not its own or its producer stopped.
            LogUnavailable: the log is closed.
        """
        with self._lock:
            self._check_open()
            writer = self._writers.get(partition)
            if self._assigned_only:
                if partition not in self._pinned or writer is None:
                    raise FencedError(
                        f"partition {partition} of session {session_id!r} is not owned by this worker",
                        session_id=session_id,
                    )
                if writer.dead or writer.closing:
                    # Another producer fenced ours (this process may be a zombie now), or
                    # it died after a failure. A new producer here could fence the
                    # partition's real owner back; only the group's say-so may start one.
                    raise FencedError(
                        f"partition {partition} of session {session_id!r} was taken over by another owner"
                        if writer.fenced
                        else f"the producer of partition {partition} stopped ({writer.dead_reason}); "
                        "the worker takes the partition up again",
                        session_id=session_id,
                    )
            if writer is None or writer.dead or writer.closing:
                writer = self._new_writer(partition, previous=writer)
            own = self._sessions.setdefault(session_id, _Ownership())
            if own.writer is not None and own.writer is not writer:
                own.writer.sessions.discard(session_id)
            own.epoch += 1
            own.owner = owner
            own.writer = writer
            writer.sessions.add(session_id)
            return writer, own.epoch

    def own(self, partition: int) -> PartitionWriter:
        """A NEW writer of ``partition`` (the group gave it here); this process's earlier
        session writers of the partition lose their ownership."""
        with self._lock:
            self._check_open()
            old = self._writers.get(partition)
            if old is not None:
                self._forget(old)
            writer = self._new_writer(partition, previous=old)
            self._pinned.add(partition)
            self._assigned_only = True
            return writer

    def stopped(self, partition: int) -> str | None:
        """Why the producer of an owned partition stopped, or None while it can write
        (or the partition is not owned)."""
        with self._lock:
            writer = self._writers.get(partition)
            if partition not in self._pinned or writer is None or not writer.dead:
                return None
            return writer.dead_reason

    def disown(self, partition: int) -> concurrent.futures.Future[None] | None:
        """Stop writing ``partition``: its writer's ``closed`` future (queued appends
        finish first), or None if this process had none."""
        with self._lock:
            self._pinned.discard(partition)
            writer = self._writers.pop(partition, None)
            if writer is None:
                return None
            self._forget(writer)
            writer.sessions.clear()
            return writer.close()

    def release(self, session_id: str, epoch: int, writer: PartitionWriter) -> None:
        """The claim ``epoch`` of ``session_id`` is done; the partition's producer stays."""
        with self._lock:
            own = self._sessions.get(session_id)
            if own is None or own.epoch != epoch or own.owner is None:
                return  # already lost: releasing changes nothing
            own.owner = None
            own.writer = None
            writer.sessions.discard(session_id)

    def is_current(self, session_id: str, epoch: int) -> bool:
        with self._lock:
            own = self._sessions.get(session_id)
            return own is not None and own.epoch == epoch and own.owner is not None

    def lease_info(self, session_id: str) -> LeaseInfo:
        """What this process knows: its live writer's owner (if any) and the local epoch."""
        with self._lock:
            own = self._sessions.get(session_id)
            if own is None:
                return LeaseInfo(owner=None, epoch=0, lease_until=None)
            live = own.writer is not None and not own.writer.dead
            return LeaseInfo(owner=own.owner if live else None, epoch=own.epoch, lease_until=None)

    def note_commit(self, partition: int, end: int) -> None:
        """This process's records of ``partition`` now reach ``end`` (exclusive)."""
        with self._lock:
            if end > self._committed.get(partition, 0):
                self._committed[partition] = end

    def committed(self, partition: int) -> int:
        """The end of what this process committed to ``partition`` (0: nothing)."""
        with self._lock:
            return self._committed.get(partition, 0)

    def close(self) -> list[PartitionWriter]:
        """No claim from now on; the writers to close."""
        with self._lock:
            self._closed = True
            writers = list(self._writers.values())
            self._writers.clear()
            return writers

    def _check_open(self) -> None:
        if self._closed:
            raise LogClosed("the Kafka session log is closed")

    def _forget(self, writer: PartitionWriter) -> None:
        """Every session written through ``writer`` loses its owner (lock held)."""
        for own in self._sessions.values():
            if own.writer is writer:
                own.writer, own.owner = None, None

    def _new_writer(self, partition: int, *, previous: PartitionWriter | None) -> PartitionWriter:
        """A started writer for ``partition`` (lock held)."""
        if previous is not None:
            previous.close()  # a dead one stops its thread; a closing one finishes first
        writer = PartitionWriter(
            settings=self._settings(),
            partition=partition,
            stats=self._stats,
            is_current=self.is_current,
            on_commit=self.note_commit,
            previous=previous,
            on_records=self._on_records,
        )
        self._writers[partition] = writer
        writer.start()
        self._stats.add(producers_started=1)
        return writer
