"""What a SQLite log's write connection knows of positions and owners between its commits.

Before it inserts, an append needs three facts: the session's last position (the new
records' ``prev``), the log's last position (the next seq), and, for an owner, that the
owners row still names it at its epoch (the fence). Reading them is one more statement in
every append's transaction: about 9 us of a 0.2 ms step on a disk where a commit's fsync
takes 0.1 ms. Yet after an append commits, the write connection knows them all: the log
and the session end where it wrote, and the owner it checked still holds the session.

They stay true until ANOTHER connection commits (another process's submit or claim, the
writer thread's connection, a checkpoint). ``PRAGMA data_version`` says exactly that: its
value moves when another connection has committed, never for this connection's own
commits (sqlite.org/pragma.html#pragma_data_version). So each write transaction asks it
once, after ``BEGIN IMMEDIATE`` (the write lock held: nobody else commits until this one
ends), and forgets everything when it moved. A transaction that does not commit forgets
too (its writes are gone), and so does a claim or a release of a session (its epoch or
owner changes in the transaction). What is not known is read, as before.
"""

from __future__ import annotations

import sqlite3

__all__ = ["KnownPositions", "WriteConnection"]

MAX_SESSIONS = 4096
"""Sessions whose head and owner one connection remembers; past that it starts again."""


class KnownPositions:
    """The facts one write connection may use without reading them, while they hold."""

    __slots__ = ("epochs", "heads", "last", "version")

    def __init__(self) -> None:
        self.version: int | None = None
        """``PRAGMA data_version`` when these facts were last known to hold."""
        self.last: int | None = None
        """The log's last position."""
        self.heads: dict[str, int] = {}
        """Session -> its last position."""
        self.epochs: dict[str, tuple[str, int]] = {}
        """Session -> the (owner, epoch) found holding it."""

    def begin(self, db: WriteConnection) -> None:
        """In a write transaction, the write lock held: keep what is known only if no other
        connection committed since this one last did."""
        version = db.statements.execute("PRAGMA data_version").fetchone()[0]
        if version != self.version:
            self.forget()
            self.version = version

    def forget(self) -> None:
        self.version = self.last = None
        self.heads.clear()
        self.epochs.clear()

    def next_of(self, session_id: str, owner: tuple[str, int] | None) -> tuple[int, int] | None:
        """``(session head, log end)`` if both are known (and ``owner`` is known to hold the
        session at its epoch); None: read them."""
        last = self.last
        if last is None:
            return None
        head = self.heads.get(session_id)
        if head is None or (owner is not None and self.epochs.get(session_id) != owner):
            return None
        return head, last

    def read(self, session_id: str, last: int, owner: tuple[str, int] | None) -> None:
        """The log's end as read in this transaction, and the owner found holding the session."""
        self.last = last
        if owner is not None:
            if len(self.epochs) >= MAX_SESSIONS:
                self.epochs.clear()
            self.epochs[session_id] = owner

    def appended(self, session_id: str, last_seq: int) -> None:
        """This transaction wrote the session's records up to ``last_seq``, the log's end."""
        if len(self.heads) >= MAX_SESSIONS:
            self.heads.clear()
        self.heads[session_id] = last_seq
        self.last = last_seq

    def owner_changed(self, session_id: str) -> None:
        """A claim or a release of the session in this transaction."""
        self.epochs.pop(session_id, None)


class WriteConnection(sqlite3.Connection):
    """A log's write connection, with what it knows between its commits."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.known = KnownPositions()
        self.statements = self.cursor()
        """One cursor for the statements of every transaction that return at most a row
        read at once (BEGIN, the pragma, COMMIT): ``execute`` makes a cursor a call."""
