"""The session log contract, shared by every backend.

A *session log* holds, per session, an ordered list of committed records.

* ``submit(record)``: anyone may add an INPUT record (a user message, an
  answer, app records sent from outside). It waits in the log until the
  session's owner takes it. No ownership needed.
* ``claim(session_id, owner=, lease=)``: become the session's single writer.
  Returns a :class:`SessionWriter`. A newer claim fences the older writer, whose
  next ``append`` raises :class:`~harness.errors.FencedError` and writes
  nothing. Backends with leases (SQLite, memory) refuse a claim with
  :class:`~harness.errors.SessionBusy` while another owner's lease is live.
* ``SessionWriter.append(records)``: atomic (all or nothing) and durable when
  it returns.
* ``read(session_id, after=)``: committed records of one session in order.

Records are always stored as encoded bytes (``harness.codec``), so every
backend holds the very same Avro records.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Protocol, runtime_checkable

from harness.records import LogEntry, Record

__all__ = ["Checkpoint", "CheckpointWritten", "LeaseInfo", "LogEntry", "SessionLog", "SessionWriter"]


@dataclass(frozen=True, slots=True)
class LeaseInfo:
    """Who owns a session now, as far as the log knows."""

    owner: str | None
    epoch: int
    lease_until: float | None  # epoch seconds; None when the backend has no lease


@runtime_checkable
class SessionWriter(Protocol):
    """The owner's handle on one session's log.

    A writer's class may also define ``append_now(records)``: the records' positions
    when it committed them at once, else an awaitable of them (the session core prefers
    it to ``append``: a step's commit with no coroutine in between; the SQLite writer
    has it).
    """

    @property
    def session_id(self) -> str: ...

    @property
    def epoch(self) -> int: ...

    async def append(self, records: Sequence[Record]) -> list[LogEntry]:
        """Append atomically; durable on return; ``FencedError`` if ownership was lost."""
        ...

    async def renew(self) -> None:
        """Extend the lease (no-op where the backend has none); ``FencedError`` if lost."""
        ...

    async def release(self) -> None:
        """Give up ownership so another owner can claim at once."""
        ...


@runtime_checkable
class SessionLog(Protocol):
    """A session log backend, opened with :func:`harness.open_log`."""

    @property
    def namespace(self) -> str:
        """The log's stable id, part of every idempotency key (see ``harness.ids``)."""
        ...

    async def read(self, session_id: str, *, after: int | None = None) -> list[LogEntry]:
        """Committed records of ``session_id`` in order (only those with seq > after)."""
        ...

    async def submit(self, record: Record) -> LogEntry:
        """Append one input record for the session's owner to take (no ownership)."""
        ...

    async def claim(self, session_id: str, *, owner: str, lease: timedelta) -> SessionWriter:
        """Become the session's writer; fences any previous writer."""
        ...

    async def lease_info(self, session_id: str) -> LeaseInfo:
        """The current owner and lease of the session."""
        ...

    async def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """A partition's sessions as of log position ``covers`` (every record <= covers).

    ``ended`` names the sessions that ended at some point, each with the position of its
    first record (0: not known), which never changes; it grows with every session the
    partition ever had, so a backend stores it in parts that are written once
    (``directory``: the sealed parts, ``unsealed``: the entries in none yet) and a
    checkpoint costs what changed since the last, not what the partition ever held
    (docs/architecture.md, "Checkpoints"). A session in both ``sessions`` and ``ended``
    ended once and is live again: ``sessions`` holds it.
    """

    covers: int
    sessions: Mapping[str, Sequence[LogEntry]]  # live sessions: all their records
    ended: Mapping[str, int] = field(default_factory=dict)  # ended sessions: id -> first position
    directory: tuple[tuple[str, int], ...] = ()
    """The sealed parts of ``ended``: (part id, where the backend stored it), oldest first."""
    unsealed: tuple[tuple[str, int], ...] | None = None
    """The entries of ``ended`` in no part of ``directory`` yet, oldest first (None: all
    of ``ended``, for a checkpoint made without a directory)."""
    reread: tuple[str, ...] = ()
    """Sessions of ``ended`` that a new owner reads whole before it goes live, though no
    record of them comes after ``covers``: the parked sessions (an unreadable record)
    whose inputs' verdicts were not all written yet. Read again, each parks again and its
    new owner writes those verdicts (taken for ended, nobody would: its senders would
    wait for good)."""


@dataclass(frozen=True, slots=True)
class CheckpointWritten:
    """What a checkpoint write sealed: its writer's next checkpoint builds on this."""

    directory: tuple[tuple[str, int], ...]
    """The sealed parts the written checkpoint names (those it was given and any new ones)."""
    sealed: int
    """How many of the checkpoint's ``unsealed`` entries (the first ones) are in them now."""
