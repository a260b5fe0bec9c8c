"""The followers of one Kafka log in this process: the shared tails that serve
``subscribe`` and ``tail_partition``, and who hears of the poison records they meet.

Two sets of shared tails (:class:`~harness.log.kafka.fanout.Fanout`, one consumer for
every partition followed): one for followers that write (a worker: a poison record is
dead-lettered) and one for readers that write nothing (clients, the gateway: a poison
record is skipped quietly). A follower that starts behind a tail catches up with a
bounded read of the log (``scan``) first.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence

from harness.errors import CorruptRecord
from harness.log.base import LogEntry
from harness.log.kafka.config import KafkaSettings
from harness.log.kafka.fanout import CatchUp, Covered, Fanout
from harness.log.kafka.reader import ReadResult, result_seq
from harness.log.kafka.stats import KafkaLogStats
from harness.records import Record

__all__ = ["Followers", "Scan"]

log = logging.getLogger("harness.log.kafka")

Scan = Callable[[int, int, int, bytes | None, int], Awaitable[list[ReadResult]]]
"""``(partition, start, end, key, limit)``: a bounded read of the log that reaches ``end``."""

_Listener = tuple[asyncio.AbstractEventLoop, Callable[[CorruptRecord], object]]


class Followers:
    """The shared tails of one :class:`~harness.log.kafka.log.KafkaLog` (thread-safe).

    Args:
        settings: the log's current settings (read when a set of tails is made).
        decode: the codec's ``decode``; ``peek``: its ``framed_type``.
        stats: counters of the log.
        scan: the bounded read a follower that starts behind catches up with.
        skip_corrupt: drops the poison records of a read (dead-lettering them).
        dead_letter: copies one poison record to the dead-letter topic (blocking).
        check_open: raises once the log is closed.
        on_covered: told how far each tail read (``Fanout``'s ``on_covered``).
    """

    def __init__(
        self,
        settings: Callable[[], KafkaSettings],
        *,
        decode: Callable[[bytes], Record],
        peek: Callable[[bytes], str | None],
        stats: KafkaLogStats,
        scan: Scan,
        skip_corrupt: Callable[[Sequence[ReadResult]], Awaitable[list[LogEntry]]],
        dead_letter: Callable[[CorruptRecord], None],
        check_open: Callable[[], None],
        on_covered: Covered | None = None,
    ) -> None:
        self._on_covered = on_covered
        self._settings = settings
        self._decode = decode
        self._peek = peek
        self._stats = stats
        self._scan = scan
        self._skip_corrupt = skip_corrupt
        self._dead_letter = dead_letter
        self._check_open = check_open
        self._lock = threading.Lock()  # guards the fields below; never held while waiting
        self._fanout: Fanout | None = None
        self._quiet_fanout: Fanout | None = None
        self._corrupt_listeners: dict[int, list[_Listener]] = {}  # partition -> tails that asked

    @property
    def fanout(self) -> Fanout:
        """The shared tails of followers that write (a poison record is dead-lettered)."""
        with self._lock:
            self._check_open()
            if self._fanout is None:
                self._fanout = self._new_fanout(self._catch_up, self._fanout_corrupt)
            return self._fanout

    @property
    def quiet_fanout(self) -> Fanout:
        """The shared tails of the followers that write nothing (clients, the gateway): a
        poison record is skipped, never dead-lettered."""
        with self._lock:
            self._check_open()
            if self._quiet_fanout is None:
                self._quiet_fanout = self._new_fanout(self._catch_up_quietly, _skip_quietly)
            return self._quiet_fanout

    async def tail(
        self,
        partition: int,
        start_offset: int,
        *,
        dead_letter: bool,
        on_corrupt: Callable[[CorruptRecord], object] | None,
    ) -> AsyncIterator[LogEntry]:
        """Every committed record of ``partition`` from ``start_offset`` on, as it commits;
        ``on_corrupt`` hears of each poison record too, on the caller's loop."""
        fanout = self.fanout if dead_letter else self.quiet_fanout
        listener = (asyncio.get_running_loop(), on_corrupt) if on_corrupt is not None else None
        if listener is not None:
            with self._lock:
                self._corrupt_listeners.setdefault(partition, []).append(listener)
        try:
            async for entry in fanout.subscribe(partition, after=start_offset):
                yield entry
        finally:
            if listener is not None:
                with self._lock:
                    self._corrupt_listeners.get(partition, []).remove(listener)

    def follow(
        self,
        partition: int,
        *,
        after: int,
        session_id: str,
        dead_letter: bool,
        types: frozenset[str] | None,
    ) -> AsyncIterator[LogEntry]:
        """The committed records of ``session_id`` (in ``partition``) after ``after``, live."""
        fanout = self.fanout if dead_letter else self.quiet_fanout
        return fanout.subscribe(partition, after=after, session_id=session_id, types=types)

    def following(self, partition: int) -> bool:
        """Whether a shared tail of this process follows ``partition`` now."""
        with self._lock:
            fanouts = [f for f in (self._fanout, self._quiet_fanout) if f is not None]
        return any(f.read_upto(partition) is not None for f in fanouts)

    def own(self, partition: int, records: list[tuple[int, Record]]) -> None:
        """Records this process just committed (writer thread): the partition's shared
        tail hands them to its followers as they are, without decoding their bytes."""
        fanout = self._fanout
        if fanout is not None and records:
            fanout.own(partition, records)

    async def close(self) -> None:
        with self._lock:
            fanouts = [f for f in (self._fanout, self._quiet_fanout) if f is not None]
        for fanout in fanouts:
            await fanout.close()

    # --- internals ---------------------------------------------------------------------------

    def _new_fanout(self, catch_up: CatchUp, on_corrupt: Callable[[CorruptRecord], None]) -> Fanout:
        return Fanout(
            self._settings(),
            decode=self._decode,
            catch_up=catch_up,
            on_corrupt=on_corrupt,
            stats=self._stats,
            peek=self._peek,
            on_covered=self._on_covered,
        )

    async def _catch_up(
        self, partition: int, start: int, end: int, key: bytes | None, limit: int
    ) -> tuple[list[LogEntry], int]:
        items = await self._scan(partition, start, end, key, limit)
        reached = end if len(items) < limit else result_seq(items[-1])
        for item in items:
            if isinstance(item, CorruptRecord):
                self._tell_corrupt(item)
        return await self._skip_corrupt(items), reached

    async def _catch_up_quietly(
        self, partition: int, start: int, end: int, key: bytes | None, limit: int
    ) -> tuple[list[LogEntry], int]:
        items = await self._scan(partition, start, end, key, limit)
        reached = end if len(items) < limit else result_seq(items[-1])
        return [item for item in items if isinstance(item, LogEntry)], reached

    def _fanout_corrupt(self, corrupt: CorruptRecord) -> None:
        """A poison record met by a shared tail (on a worker thread): dead-letter it and
        tell the tails of its partition that asked (``tail(on_corrupt=)``)."""
        self._dead_letter(corrupt)
        self._tell_corrupt(corrupt)

    def _tell_corrupt(self, corrupt: CorruptRecord) -> None:
        with self._lock:
            listeners = list(self._corrupt_listeners.get(corrupt.partition or 0, ()))
        for loop, callback in listeners:
            loop.call_soon_threadsafe(callback, corrupt)


def _skip_quietly(corrupt: CorruptRecord) -> None:
    log.warning("skipping an unreadable record: %s", corrupt)

