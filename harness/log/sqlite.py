"""The embedded session log: one SQLite file (``sqlite:///path``).

Layout::

    meta(key PRIMARY KEY, value)               namespace (random, made with the file), schema
    records(seq INTEGER PRIMARY KEY, session_id, type, value BLOB, prev, crc)
    owners(session_id PRIMARY KEY, owner, epoch, lease_until)
    heads(session_id PRIMARY KEY, last_seq, crc) WITHOUT ROWID
    checkpoint(id = 1, version, covers, live, crc)   where a worker's restart starts reading
    summaries(session_id PRIMARY KEY, last_seq, summary, crc) WITHOUT ROWID   quiet sessions' summaries

(checksums, chains and the upgrade of older files: :mod:`harness.log.sqlite_schema`;
the checkpoint: :mod:`harness.log.sqlite_checkpoint`; the stored summaries a listing
uses: :mod:`harness.log.sqlite_summaries`)

Durability: WAL with ``synchronous=FULL``; every write is part of one ``BEGIN
IMMEDIATE`` ... ``COMMIT`` transaction, so it is fsync'd when ``append`` returns
and a crash leaves all of it or none.

Fencing: ``claim`` bumps the session's epoch. Every ``append`` checks, in its
transaction and in the statement that reads the next positions, that the owners row
still names this writer at its epoch: a newer claim (or a release) makes that write
fail with ``FencedError`` having written nothing. That statement is skipped when the
write connection already knows its answer: what it wrote and checked itself, as long
as no other connection has committed since (``PRAGMA data_version``, asked in every
write transaction: :mod:`harness.log.sqlite_positions`). So a writer's next append
costs that pragma, its INSERTs and the head's upsert. The lease is renewed by ``renew`` (the host's poller)
and by an append only when a third of it has passed since it was last renewed (then
the check is ``UPDATE owners SET lease_until=? WHERE session_id=? AND epoch=? AND
owner=?``: no row changed means fenced). The lease only decides whether a *claim* is
refused (``SessionBusy``); an owner whose lease ran out keeps writing until somebody
actually claims.

Group commit and threading: every write is queued and committed with the writes
queued next to it in one transaction, on the event-loop thread while commits are
cheap (see :mod:`harness.log.sqlite_commit`).

Size: a record whose encoded bytes exceed ``max_record_bytes`` (1000000 by default, as
on Kafka; ``sqlite:///harness.db?max_record_bytes=N``) fails its append or submit with
``RecordTooLarge`` before the write is queued: nothing of that append is written and
the writes it would have been committed with are not affected.

Reads (``read``, ``scan``, ``read_all``, ``sessions``, ``lease_info``) run on a
reader thread with their own connection: WAL lets it read while a write
commits, and a big read never blocks the loop. A read sees every write whose
``append`` has returned.

A log may be used from several event loops, one after another or at once (each
loop has its own queue; the write connection is used by one thread at a time).
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, ClassVar, Self, TypeVar

from harness.errors import (
    CorruptRecord,
    FencedError,
    LogClosed,
    LogError,
    LogUnavailable,
    SessionBusy,
)
from harness.log import (
    DEFAULT_MAX_RECORD_BYTES,
    SQLITE_MAX_RECORD_BYTES,
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
from harness.log.base import Checkpoint, LeaseInfo, LogEntry
from harness.log.holder import HOLDER_GRACE_S, running_holder
from harness.log.sqlite_checkpoint import NoCheckpoint, select_checkpoint, select_heads, upsert_checkpoint
from harness.log.sqlite_commit import NOT_ALONE, GroupCommit, SqliteStats
from harness.log.sqlite_listing import ListingRows, select_listing, select_sources
from harness.log.sqlite_open import connect_read, open_reader, open_writer
from harness.log.sqlite_positions import WriteConnection
from harness.log.sqlite_schema import (
    append_rows,
    select_changes,
    select_owner,
    select_rows,
    select_sessions,
    verify_rows,
)
from harness.log.sqlite_summaries import delete_damaged, upsert_summaries
from harness.records import Record
from harness.views import SessionSummary

__all__ = ["ListingRead", "SqliteLog", "SqliteStats", "SqliteWriter"]

T = TypeVar("T")

_FENCE = "UPDATE owners SET lease_until = ? WHERE session_id = ? AND epoch = ? AND owner = ?"

DEFAULT_BUSY_TIMEOUT = timedelta(seconds=10)
"""How long a write waits for another connection's write lock before failing."""

DEFAULT_INLINE_COMMIT_LIMIT = timedelta(milliseconds=2)
"""Commits slower than this (moving average) run on the writer thread, not the loop."""


@dataclass(frozen=True, slots=True)
class ListingRead:
    """What ``scan_listing`` read (:class:`~harness.log.sqlite_listing.ListingRows`, decoded).

    Attributes:
        entries: the records of the types asked for (none of the ``stored`` sessions').
        lasts: the last record of every session of ``heads`` not in ``stored``.
        end: the log's last position in the snapshot read.
        stored: the sessions whose stored summary is their summary -> it.
        damaged: the stored summaries that did not check.
    """

    entries: list[LogEntry | CorruptRecord]
    lasts: dict[str, LogEntry | CorruptRecord]
    end: int
    stored: dict[str, SessionSummary] = field(default_factory=dict)
    damaged: int = 0


def _seconds(value: timedelta | float) -> float:
    return value.total_seconds() if isinstance(value, timedelta) else float(value)


class SqliteLog:
    """A :class:`~harness.log.base.SessionLog` in one SQLite file.

    The constructor opens (or creates) the file and reads its namespace, waiting
    for that on the calling thread: open logs at startup, not per request. A file
    that holds other tables and no harness ``meta`` table is refused, whichever way
    it is opened; so is one this process cannot write, unless opened ``read_only``
    (see :mod:`harness.log.sqlite_open`).

    Args:
        path: the database file; created with its tables when missing (or empty).
        clock: seconds since the epoch, for leases. All processes sharing the file
            must use the same time base (``time.time`` by default).
        busy_timeout: how long a write waits for another writer's lock (on the
            writer thread, never on the event loop).
        codec: the record codec; ``harness.codec.default_codec()`` by default.
        inline_commit_limit: commits run on the event-loop thread while they take
            less than this on average; 0 runs every commit on the writer thread.
        create: False: the file must already be a log (a client's: it makes nothing).
        read_only: only read the file, through a read-only connection: nothing is made,
            upgraded or changed, and writes raise ``LogUnavailable``. It must be a log.
        max_record_bytes: the largest record this log takes (its encoded bytes); a larger
            one fails its append or submit with ``RecordTooLarge``, writing nothing of it.
            The URL's ``?max_record_bytes=N``; 1000000 by default (what Kafka takes by
            default), at most :data:`~harness.log.SQLITE_MAX_RECORD_BYTES`. Every process
            that writes the file should use the same: an input a client with a larger
            limit sent may be one this owner cannot copy into an answer or a result.

    Raises:
        LogUnavailable: the file is not a log (or, without ``create``, is missing or
            empty), cannot be written (unless ``read_only``), or is damaged.
        ValueError: ``max_record_bytes`` is not a whole number of bytes in range.
    """

    has_leases: ClassVar[bool] = True  # claims are refused while another lease is live

    def __init__(
        self,
        path: str | Path,
        *,
        clock: Callable[[], float] = time.time,
        busy_timeout: timedelta | float = DEFAULT_BUSY_TIMEOUT,
        codec: _Codec | None = None,
        inline_commit_limit: timedelta | float = DEFAULT_INLINE_COMMIT_LIMIT,
        create: bool = True,
        read_only: bool = False,
        max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
    ) -> None:
        self._path = str(path)
        self._limit = _RecordLimit(
            _max_record_bytes(max_record_bytes, ceiling=SQLITE_MAX_RECORD_BYTES, why=" on SQLite (its own limit on a row)"),
            f"the log URL's max_record_bytes, the same for every process that opens it: "
            f"sqlite:///{self._path}?max_record_bytes=N",
        )
        self._clock = clock
        self._busy_seconds = _seconds(busy_timeout)
        self._codec = codec if codec is not None else _default_codec()
        self._stats = SqliteStats()
        self._conn: sqlite3.Connection | None = None  # the reader thread's connection
        self._closed = False
        self._read_target = self._path  # what read connections open (a file: URI when read-only)
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="harness-sqlite-read")
        self._commits: GroupCommit | None = None  # None: opened read-only
        if read_only:
            try:
                self._namespace = self._executor.submit(self._open_read_only).result()
            except BaseException:
                self._executor.shutdown(wait=True)
                raise
            return
        wconn, self._namespace = open_writer(self._path, self._busy_seconds, create=create)
        self._commits = GroupCommit(
            self._path,
            wconn,
            busy_seconds=self._busy_seconds,
            inline_limit=_seconds(inline_commit_limit),
            stats=self._stats,
        )
        try:
            self._executor.submit(self._guard, self._open_reader).result()
        except BaseException:
            self._commits.close_conns()
            self._executor.shutdown(wait=True)
            raise

    @property
    def namespace(self) -> str:
        return self._namespace

    @property
    def path(self) -> str:
        return self._path

    @property
    def stats(self) -> SqliteStats:
        """Live counters: appends committed, transactions that carried them."""
        return self._stats

    @property
    def max_record_bytes(self) -> int:
        """The largest record (encoded bytes) this log takes."""
        return self._limit.max_bytes

    @property
    def read_only(self) -> bool:
        """Whether this log was opened ``read_only`` (it takes no writes)."""
        return self._commits is None

    def connect_reader(self) -> sqlite3.Connection:
        """A new connection that reads the file as this log's reads do (read-only when the
        log is), for watchers of the file (``PRAGMA data_version``); any thread."""
        return connect_read(self._read_target, self._busy_seconds)

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
        return await self._call(self._scan, session_id, after or 0, -1 if limit is None else limit)

    async def scan_listing(self, types: Collection[str]) -> ListingRead:
        """What a listing of every session reads, from one snapshot
        (:mod:`harness.log.sqlite_listing`): the sessions whose stored summary is theirs,
        and of the others the records of these types in log order and each one's last
        record; a row that does not check or decode comes back as its ``CorruptRecord``."""
        return await self._call(self._scan_listing, tuple(types))

    async def summary_sources(
        self, types: Collection[str], skip: Mapping[str, int | None], limit: int
    ) -> tuple[ListingRead, bool]:
        """What the summaries of up to ``limit`` sessions whose stored summary is missing
        or stale are made of, read as ``scan_listing`` reads them (``skip``: sessions to
        leave out, with the head they were left out at, or None), and whether more are
        left (:func:`harness.log.sqlite_listing.select_sources`)."""
        return await self._call(self._summary_sources, tuple(types), dict(skip), limit)

    async def write_summaries(self, rows: Sequence[tuple[str, int, SessionSummary]]) -> int:
        """Store quiet sessions' summaries (``(session, the position of its last record,
        summary)``), in a transaction of its own (never with other writes); how many."""
        self._writes()  # refused when read-only
        if self._closed:
            raise LogClosed(f"the SQLite log {self._path!r} is closed")
        if not rows:
            return 0
        return await asyncio.to_thread(self._guard, self._write_summaries, list(rows))

    async def drop_damaged_summaries(self) -> int:
        """Delete the stored summaries that do not check (a changed byte), in a transaction
        of their own, so they are written again like missing ones; how many
        (:func:`harness.log.sqlite_summaries.delete_damaged`)."""
        self._writes()  # refused when read-only
        if self._closed:
            raise LogClosed(f"the SQLite log {self._path!r} is closed")
        return int(await asyncio.to_thread(self._guard, self._write_apart, delete_damaged))

    async def sessions(self) -> list[str]:
        """Every session with at least one record, in order of its first record."""
        return await self._call(self._sessions)

    async def positions_since(
        self, after: int | None, session_ids: Collection[str]
    ) -> tuple[int, dict[str, list[int]]]:
        """Where the log ends now, and the positions of records after ``after`` of the
        given sessions (nothing is decoded). ``after=None``: only where it ends."""
        return await self._call(self._changes, after, session_ids)

    async def lease_info(self, session_id: str) -> LeaseInfo:
        return await self._call(self._lease_info, session_id)

    # --- the checkpoint (harness.log.sqlite_checkpoint) ------------------------------------

    async def read_checkpoint(self) -> tuple[Checkpoint, list[CorruptRecord]] | NoCheckpoint:
        """Where a restart starts: the sessions not ended as of the checkpoint's position,
        each read whole from the file and verified (their records up to that position; the
        unreadable ones as ``CorruptRecord``), and every other session as ended (first
        position 0: not known). ``NoCheckpoint`` says why there is none to use."""
        return await self._call(self._read_checkpoint)

    async def write_checkpoint(self, covers: int, live: Collection[str]) -> bool:
        """Record that every session not in ``live`` had ended as of position ``covers``,
        in a transaction of its own (never with other writes); False when a checkpoint
        that covers as much is there already (another process wrote it)."""
        self._writes()  # refused when read-only
        if self._closed:
            raise LogClosed(f"the SQLite log {self._path!r} is closed")
        return await asyncio.to_thread(self._guard, self._write_checkpoint, covers, list(live))

    # --- writes --------------------------------------------------------------------------

    async def submit(self, record: Record) -> LogEntry:
        """Append one input record (``IS_INPUT``) without ownership."""
        _check_input(record)
        encoded = _encode_batch(self._codec, record.session_id, [record], self._limit)
        (seq,) = await self._writes().run(self._op_append, (record.session_id, encoded, None), True)
        return LogEntry(seq, record)

    async def claim(self, session_id: str, *, owner: str, lease: timedelta) -> SqliteWriter:
        """Become the writer of ``session_id``; fences any previous writer.

        Raises:
            SessionBusy: another owner's lease is still live. The same owner may
                claim again at once (e.g. after its own restart); that fences its
                previous writer too.
        """
        seconds = _lease_seconds(lease)
        epoch = await self._writes().run(self._op_claim, (session_id, owner, seconds), False)
        return SqliteWriter(self, session_id, owner=owner, epoch=epoch, lease_seconds=seconds)

    async def close(self) -> None:
        """Land the writes already queued on this loop, then close."""
        if self._closed:
            return
        self._closed = True
        if self._commits is not None:
            self._commits.closed = True  # no new writes; the queued ones still land
            await self._commits.drain()
        await asyncio.get_running_loop().run_in_executor(self._executor, self._close_conns)
        self._executor.shutdown(wait=False)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # --- the writes, run inside a group's transaction ----------------------------------------
    # Each raises FencedError/SessionBusy BEFORE changing anything (an UPDATE that
    # matches no row changes nothing); the savepoint is the second line of defence.

    def _op_append(
        self,
        db: WriteConnection,
        session_id: str,
        encoded: Sequence[tuple[str, bytes]],
        writer: SqliteWriter | None,
    ) -> list[int]:
        """The fence check (writers only; a renewal when one is due), then the inserts."""
        owner = None
        if writer is not None:
            now = self._clock()
            if now >= writer._renew_at:
                self._fence(db, writer)  # checks and renews
                writer._renew_at = now + writer._lease_seconds / 3
            else:
                owner = (writer._owner, writer._epoch)  # checked by the positions' query
        seqs = append_rows(db, session_id, encoded, owner, db.known)
        if seqs is None:
            assert writer is not None
            raise self._fenced(writer)
        return seqs

    def _op_claim(self, db: WriteConnection, session_id: str, owner: str, lease_seconds: float) -> int:
        now = self._clock()
        row = db.execute(
            "SELECT owner, epoch, lease_until FROM owners WHERE session_id = ?", (session_id,)
        ).fetchone()
        if row is not None:
            cur_owner, _, cur_until = row
            if cur_owner is not None and cur_owner != owner and cur_until is not None:
                if cur_until > now:
                    raise SessionBusy(
                        f"session {session_id!r} is owned by {cur_owner!r} until {cur_until}",
                        session_id=session_id,
                        owner=cur_owner,
                        lease_until=cur_until,
                    )
                # Its lease ran out, but a holder still alive here may be in a step that
                # keeps the GIL (its renewals stopped with it): taking over now would run
                # that step again (see harness.log.holder).
                if now < cur_until + HOLDER_GRACE_S and (pid := running_holder(cur_owner)) is not None:
                    raise SessionBusy(
                        f"session {session_id!r}: the lease of {cur_owner!r} ran out at {cur_until}, but its "
                        f"process {pid} is still alive on this machine",
                        session_id=session_id,
                        owner=cur_owner,
                        lease_until=cur_until,
                        holder_pid=pid,
                        keep_until=cur_until + HOLDER_GRACE_S,
                    )
        epoch: int = (row[1] if row is not None else 0) + 1
        db.known.owner_changed(session_id)
        db.execute(
            "INSERT OR REPLACE INTO owners (session_id, owner, epoch, lease_until) VALUES (?, ?, ?, ?)",
            (session_id, owner, epoch, now + lease_seconds),
        )
        return epoch

    def _op_renew(self, db: sqlite3.Connection, writer: SqliteWriter) -> None:
        now = self._clock()
        self._fence(db, writer)
        writer._renew_at = now + writer._lease_seconds / 3

    def _op_release(self, db: WriteConnection, writer: SqliteWriter) -> None:
        db.known.owner_changed(writer.session_id)
        db.execute(
            "UPDATE owners SET owner = NULL, lease_until = NULL WHERE session_id = ? AND epoch = ? AND owner = ?",
            (writer.session_id, writer.epoch, writer.owner),
        )

    def _fence(self, db: sqlite3.Connection, writer: SqliteWriter) -> None:
        cur = db.execute(
            _FENCE, (self._clock() + writer._lease_seconds, writer.session_id, writer.epoch, writer.owner)
        )
        if cur.rowcount != 1:
            raise self._fenced(writer)

    @staticmethod
    def _fenced(writer: SqliteWriter) -> FencedError:
        return FencedError(
            f"writer epoch {writer.epoch} of session {writer.session_id!r} lost ownership",
            session_id=writer.session_id,
            epoch=writer.epoch,
        )

    # --- opening and closing -----------------------------------------------------------------

    def _writes(self) -> GroupCommit:
        if self._commits is None:
            raise LogUnavailable(f"the SQLite log {self._path!r} was opened read-only: it takes no writes")
        return self._commits

    def _open_reader(self) -> None:
        self._conn = connect_read(self._read_target, self._busy_seconds)

    def _open_read_only(self) -> str:
        """On the reader thread: its read-only connection, the file checked; the namespace."""
        self._conn, namespace, self._read_target = open_reader(self._path, self._busy_seconds)
        return namespace

    def _close_conns(self) -> None:
        """On the reader thread: the write connections (after any write in progress), then its own."""
        if self._commits is not None:
            self._commits.close_conns()
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    # --- reads, on the reader thread ------------------------------------------------------------

    async def _call(self, fn: Callable[..., T], *args: Any) -> T:
        if self._closed:
            raise LogClosed(f"the SQLite log {self._path!r} is closed")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self._guard, fn, *args)

    def _guard(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn`` on the reader thread; database failures become ``LogUnavailable``."""
        try:
            return fn(*args)
        except (sqlite3.Error, UnicodeDecodeError) as exc:
            raise LogUnavailable(f"SQLite log {self._path!r}: {exc}") from exc

    def _db(self) -> sqlite3.Connection:
        if self._conn is None:
            raise LogClosed(f"the SQLite log {self._path!r} is closed")
        return self._conn

    # Every read uses fetchall(): a statement left unfinished would keep its read
    # transaction (an old snapshot) open and later reads would miss new commits.

    def _scan(self, session_id: str | None, after: int, limit: int) -> list[LogEntry | CorruptRecord]:
        rows, head = select_rows(self._db(), session_id, after, limit)
        checked = verify_rows(rows, session_id=session_id, after=after, head=head, whole=limit < 0)
        return [self._decoded(item) for item in checked]

    def _scan_listing(self, types: tuple[str, ...]) -> ListingRead:
        return self._listing_read(select_listing(self._db(), types))

    def _summary_sources(
        self, types: tuple[str, ...], skip: dict[str, int | None], limit: int
    ) -> tuple[ListingRead, bool]:
        read, more = select_sources(self._db(), types, skip, limit)
        return self._listing_read(read), more

    def _listing_read(self, read: ListingRows) -> ListingRead:
        return ListingRead(
            entries=[self._decoded(item) for item in read.rows],
            lasts={sid: self._decoded(item) for sid, item in read.lasts.items()},
            end=read.end,
            stored=read.stored,
            damaged=read.damaged,
        )

    def _decoded(self, item: tuple[int, str, bytes] | CorruptRecord) -> LogEntry | CorruptRecord:
        return item if isinstance(item, CorruptRecord) else _decode_row(self._codec, item[1], item[0], item[2])

    def _changes(self, after: int | None, session_ids: Collection[str]) -> tuple[int, dict[str, list[int]]]:
        return select_changes(self._db(), after, session_ids)

    def _sessions(self) -> list[str]:
        return select_sessions(self._db())

    def _read_checkpoint(self) -> tuple[Checkpoint, list[CorruptRecord]] | NoCheckpoint:
        db = self._db()
        found = select_checkpoint(db)
        if isinstance(found, NoCheckpoint):
            return found
        sessions, bad = select_heads(db)
        if bad:
            return NoCheckpoint(f"{bad} row(s) of its heads table fail their check (a changed byte)", damaged=True)
        live: dict[str, list[LogEntry]] = {}
        corrupt: list[CorruptRecord] = []
        for sid in found.live:
            entries: list[LogEntry] = []
            for item in self._scan(sid, 0, -1):  # whole: every CRC, the chain up to the head
                if isinstance(item, CorruptRecord):
                    # (a bad row after the checkpoint is found again by the read of the tail)
                    if item.seq is None or item.seq <= found.covers or not item.raw:
                        corrupt.append(item)
                elif item.seq <= found.covers:
                    entries.append(item)
            live[sid] = entries
        ended = {sid: 0 for sid in sessions if sid not in live}
        checkpoint = Checkpoint(
            covers=found.covers, sessions={sid: e for sid, e in live.items() if e}, ended=ended, unsealed=()
        )
        return checkpoint, corrupt

    def _write_checkpoint(self, covers: int, live: list[str]) -> bool:
        # Not fsync'd: lost in a power cut, the previous checkpoint (or none) is used.
        return bool(self._write_apart(upsert_checkpoint, covers, live))

    def _write_summaries(self, rows: list[tuple[str, int, SessionSummary]]) -> int:
        # Not fsync'd: lost in a power cut, the rows are made again (a listing reads those sessions).
        return int(self._write_apart(upsert_summaries, rows))

    def _write_apart(self, write: Callable[..., Any], *args: Any) -> Any:
        """``write(conn, *args)`` in a transaction of its own, on a connection of its own,
        ``synchronous=NORMAL`` (what it writes can be made again): on a thread of its own,
        never part of a group commit, never with a step's fsync."""
        conn = sqlite3.connect(self._path, timeout=self._busy_seconds, isolation_level=None)
        try:
            conn.execute("PRAGMA synchronous = NORMAL")
            conn.execute("BEGIN IMMEDIATE")
            try:
                written = write(conn, *args)
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
            return written
        finally:
            conn.close()

    def _lease_info(self, session_id: str) -> LeaseInfo:
        row = select_owner(self._db(), session_id)
        if row is None:
            return LeaseInfo(owner=None, epoch=0, lease_until=None)
        owner, epoch, lease_until = row
        return LeaseInfo(owner=owner, epoch=epoch, lease_until=lease_until)


class SqliteWriter:
    """The owner's handle on one session of a :class:`SqliteLog`."""

    def __init__(
        self, log: SqliteLog, session_id: str, *, owner: str, epoch: int, lease_seconds: float
    ) -> None:
        self._log = log
        self._session_id = session_id
        self._owner = owner
        self._epoch = epoch
        self._lease_seconds = lease_seconds
        # The claim set the lease: appends renew it again once a third of it has passed.
        self._renew_at = log._clock() + lease_seconds / 3

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
        """Append all ``records`` (contiguous seqs) in a fsync'd transaction (renewing the
        lease when a third of it has passed).

        Raises:
            FencedError: a newer claim (or ``release``) took the session; nothing written.
            RecordTooLarge: a record is over the log's ``max_record_bytes``; nothing written.
            LogUnavailable: the database failed; nothing written.
        """
        seqs = self.append_now(records)
        if not isinstance(seqs, list):
            seqs = await seqs
        if len(seqs) == 1:
            return [LogEntry(seqs[0], records[0])]
        return [LogEntry(seq, record) for seq, record in zip(seqs, records, strict=True)]

    def append_now(self, records: Sequence[Record]) -> list[int] | Awaitable[list[int]]:
        """``append``, giving the records' positions: done at once on the loop's thread
        when this write is alone (see ``GroupCommit.alone``), else what to await for them
        (its group's commit). A step's hot path: no coroutine between the step and its
        commit, and no entries made that its caller would only take apart.

        Raises what ``append`` raises.
        """
        log = self._log
        encoded = _encode_batch(log._codec, self._session_id, records, log._limit)
        args = (self._session_id, encoded, self)
        commits = log._writes()
        seqs = commits.alone(log._op_append, args, True)
        return commits.grouped(log._op_append, args, True) if seqs is NOT_ALONE else seqs

    async def renew(self) -> None:
        await self._log._writes().run(self._log._op_renew, (self,), False)

    def renew_blocking(self) -> None:
        """Renew on the calling thread, without the event loop: how a host keeps its
        leases while blocking code holds its loop (``harness.runtime.watchdog``).

        Raises:
            FencedError: the lease was lost. LogUnavailable: the database failed.
        """
        self._log._writes().run_blocking(self._log._op_renew, (self,))

    async def release(self) -> None:
        """Give the session up so another owner can claim at once (no-op if already lost)."""
        try:
            await self._log._writes().run(self._log._op_release, (self,), False)
        except LogError:
            if not self._log._closed:
                raise
