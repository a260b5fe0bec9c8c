"""An in-process session log (``memory:``): the test double of every backend.

It keeps the very same contract as SQLite and Kafka: records are stored as
encoded bytes (so a record the codec refuses is refused here too), ownership is
an owner epoch plus a lease read from an injected clock, and a newer claim
fences the older writer, and a record over ``max_record_bytes`` (1000000 by default,
as on SQLite and Kafka) is refused with ``RecordTooLarge``. Every commit is signalled in-process (``changes``), so
followers (:mod:`harness.log.follow`) and workers wake at once instead of polling.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import ClassVar, Self

from harness.errors import CorruptRecord, FencedError, LogClosed, SessionBusy
from harness.log import (
    DEFAULT_MAX_RECORD_BYTES,
    _check_input,
    _Codec,
    _decode_row,
    _default_codec,
    _encode_batch,
    _lease_seconds,
    _max_record_bytes,
    _RecordLimit,
    _strict,
)
from harness.log.base import LeaseInfo, LogEntry
from harness.log.follow import ChangeSignal
from harness.records import Record

__all__ = ["MemoryLog", "MemoryWriter"]


@dataclass(slots=True)
class _Row:
    seq: int
    session_id: str
    type: str
    value: bytes


@dataclass(slots=True)
class _Owner:
    owner: str | None
    epoch: int
    lease_until: float | None


class MemoryLog:
    """A :class:`~harness.log.base.SessionLog` held in this process's memory.

    Args:
        clock: seconds since the epoch; leases are measured with it (inject a fake
            clock to test expiry without sleeping).
        namespace: the log's stable id; a random one by default.
        codec: the record codec; ``harness.codec.default_codec()`` by default.
        max_record_bytes: the largest record this log takes (its encoded bytes); a larger
            one fails its append or submit with ``RecordTooLarge``, writing nothing of it
            (``memory:?max_record_bytes=N``; 1000000 by default, as on SQLite and Kafka).

    Raises:
        ValueError: ``max_record_bytes`` is not a whole number of bytes above 0.
    """

    has_leases: ClassVar[bool] = True  # claims are refused while another lease is live

    def __init__(
        self,
        *,
        clock: Callable[[], float] = time.time,
        namespace: str | None = None,
        codec: _Codec | None = None,
        max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
    ) -> None:
        self._limit = _RecordLimit(
            _max_record_bytes(max_record_bytes), "the memory log's max_record_bytes: memory:?max_record_bytes=N"
        )
        self._clock = clock
        self._namespace = namespace or uuid.uuid4().hex
        self._codec = codec if codec is not None else _default_codec()
        self._rows: list[_Row] = []  # seq order; seq = index + 1
        self._by_session: dict[str, list[_Row]] = {}
        self._owners: dict[str, _Owner] = {}
        # Every method completes without awaiting, so the event loop already makes
        # each one atomic; the lock only guards use from several threads.
        self._lock = threading.Lock()
        self._closed = False
        self._changes = ChangeSignal(end=lambda: len(self._rows))

    @property
    def namespace(self) -> str:
        return self._namespace

    @property
    def max_record_bytes(self) -> int:
        """The largest record (encoded bytes) this log takes."""
        return self._limit.max_bytes

    @property
    def changes(self) -> ChangeSignal:
        """Signalled after every commit (in-process: no polling)."""
        return self._changes

    # --- reads ---------------------------------------------------------------------------

    async def read(self, session_id: str, *, after: int | None = None) -> list[LogEntry]:
        """Committed records of ``session_id`` in order; ``CorruptRecord`` on an unreadable one."""
        return _strict(await self.scan(session_id, after=after))

    async def read_all(self, *, after: int | None = None, limit: int | None = None) -> list[LogEntry]:
        """Committed records of every session in log order (for workers polling inputs)."""
        return _strict(await self.scan(None, after=after, limit=limit))

    async def scan(
        self, session_id: str | None = None, *, after: int | None = None, limit: int | None = None
    ) -> list[LogEntry | CorruptRecord]:
        """Like ``read``/``read_all`` but an unreadable row comes back as its ``CorruptRecord``."""
        with self._lock:
            self._check_open()
            rows = self._rows if session_id is None else self._by_session.get(session_id, [])
            start = after or 0
            picked = [row for row in rows if row.seq > start] if session_id is not None else rows[start:]
            if limit is not None:
                picked = picked[:limit]
        return [_decode_row(self._codec, row.session_id, row.seq, row.value) for row in picked]

    async def sessions(self) -> list[str]:
        """Every session with at least one record, in order of its first record."""
        with self._lock:
            self._check_open()
            return list(self._by_session)

    async def positions_since(
        self, after: int | None, session_ids: Collection[str]
    ) -> tuple[int, dict[str, list[int]]]:
        """Where the log ends now, and the positions of records after ``after`` of the
        given sessions (nothing is decoded). ``after=None``: only where it ends."""
        with self._lock:
            self._check_open()
            end = len(self._rows)
            if after is None:
                return end, {}
            found: dict[str, list[int]] = {}
            for row in self._rows[after:]:
                if row.session_id in session_ids:
                    found.setdefault(row.session_id, []).append(row.seq)
        return end, found

    async def lease_info(self, session_id: str) -> LeaseInfo:
        with self._lock:
            self._check_open()
            own = self._owners.get(session_id)
        if own is None:
            return LeaseInfo(owner=None, epoch=0, lease_until=None)
        return LeaseInfo(owner=own.owner, epoch=own.epoch, lease_until=own.lease_until)

    # --- writes --------------------------------------------------------------------------

    async def submit(self, record: Record) -> LogEntry:
        """Append one input record (``IS_INPUT``) without ownership."""
        _check_input(record)
        ((type_, value),) = _encode_batch(self._codec, record.session_id, [record], self._limit)
        with self._lock:
            self._check_open()
            seq = self._store(record.session_id, [(type_, value)])[0]
        return LogEntry(seq, record)

    async def claim(self, session_id: str, *, owner: str, lease: timedelta) -> MemoryWriter:
        """Become the writer of ``session_id``; fences any previous writer.

        Raises:
            SessionBusy: another owner's lease is still live. The same owner may
                claim again at once (e.g. after its own restart); that fences its
                previous writer too.
        """
        seconds = _lease_seconds(lease)
        with self._lock:
            self._check_open()
            now = self._clock()
            own = self._owners.get(session_id)
            if own is not None and _live_other(own, owner, now):
                raise SessionBusy(
                    f"session {session_id!r} is owned by {own.owner!r} until {own.lease_until}",
                    session_id=session_id,
                    owner=own.owner,
                    lease_until=own.lease_until,
                )
            epoch = (own.epoch if own is not None else 0) + 1
            self._owners[session_id] = _Owner(owner, epoch, now + seconds)
        return MemoryWriter(self, session_id, owner=owner, epoch=epoch, lease_seconds=seconds)

    async def close(self) -> None:
        self._closed = True

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # --- internals (called with the lock held) -------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise LogClosed("the memory log is closed")

    def _store(self, session_id: str, encoded: Sequence[tuple[str, bytes]]) -> list[int]:
        seqs = []
        bucket = self._by_session.setdefault(session_id, [])
        for type_, value in encoded:
            row = _Row(len(self._rows) + 1, session_id, type_, value)
            self._rows.append(row)
            bucket.append(row)
            seqs.append(row.seq)
        if seqs:
            self._changes.notify()
        return seqs

    def _renew(self, writer: MemoryWriter) -> None:
        own = self._owners.get(writer.session_id)
        if own is None or own.epoch != writer.epoch or own.owner != writer.owner:
            raise FencedError(
                f"writer epoch {writer.epoch} of session {writer.session_id!r} lost ownership",
                session_id=writer.session_id,
                epoch=writer.epoch,
            )
        own.lease_until = self._clock() + writer._lease_seconds


def _live_other(own: _Owner, owner: str, now: float) -> bool:
    return own.owner is not None and own.owner != owner and own.lease_until is not None and own.lease_until > now


class MemoryWriter:
    """The owner's handle on one session of a :class:`MemoryLog`."""

    def __init__(self, log: MemoryLog, session_id: str, *, owner: str, epoch: int, lease_seconds: float) -> None:
        self._log = log
        self._session_id = session_id
        self._owner = owner
        self._epoch = epoch
        self._lease_seconds = lease_seconds

    @property
    def session_id(self) -> str:
        return self._session_id

    @property
    def epoch(self) -> int:
        return self._epoch

    @property
    def owner(self) -> str:
        return self._owner

    async def append(self, records: Sequence[Record]) -> list[LogEntry]:
        """Append all ``records`` or none; renews the lease. ``FencedError`` if ownership was
        lost; ``RecordTooLarge`` (nothing written) if a record is over ``max_record_bytes``."""
        encoded = _encode_batch(self._log._codec, self._session_id, records, self._log._limit)
        with self._log._lock:
            self._log._check_open()
            self._log._renew(self)
            seqs = self._log._store(self._session_id, encoded)
        return [LogEntry(seq, record) for seq, record in zip(seqs, records, strict=True)]

    async def renew(self) -> None:
        with self._log._lock:
            self._log._check_open()
            self._log._renew(self)

    async def release(self) -> None:
        """Give the session up so another owner can claim at once (no-op if already lost)."""
        with self._log._lock:
            own = self._log._owners.get(self._session_id)
            if own is not None and own.epoch == self._epoch and own.owner == self._owner:
                own.owner = None
                own.lease_until = None
