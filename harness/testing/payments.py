"""A fake payment provider that several processes share through a SQLite file.

It behaves like a real provider with idempotency keys: a repeated key with the
same request returns the first result and charges nothing more (counted as a
replay); a repeated key with a different request is refused. Every call is
counted, so crash tests can prove each effect happened exactly once and each
step function ran at most twice with the same key.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from pathlib import Path
from typing import Any

__all__ = ["FakePaymentProvider", "IdempotencyConflict"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS effects (
    kind TEXT NOT NULL, key TEXT NOT NULL, request TEXT NOT NULL, result TEXT NOT NULL,
    PRIMARY KEY (kind, key)
);
CREATE TABLE IF NOT EXISTS calls (n INTEGER PRIMARY KEY AUTOINCREMENT, kind TEXT, key TEXT);
"""


class IdempotencyConflict(Exception):
    """The same idempotency key came with a different request."""


class FakePaymentProvider:
    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        self._lock = threading.Lock()
        with self._connect() as db:
            db.executescript(_SCHEMA)

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, timeout=30, isolation_level=None)
        db.execute("PRAGMA journal_mode=WAL")
        return db

    def _effect(self, kind: str, key: str, request: dict[str, Any], make: Any) -> dict[str, Any]:
        text = json.dumps(request, sort_keys=True)
        with self._lock, self._connect() as db:
            db.execute("BEGIN IMMEDIATE")
            db.execute("INSERT INTO calls (kind, key) VALUES (?, ?)", (kind, key))
            row = db.execute("SELECT request, result FROM effects WHERE kind=? AND key=?", (kind, key)).fetchone()
            if row is not None:
                db.execute("COMMIT")
                if row[0] != text:
                    raise IdempotencyConflict(f"{kind} key {key!r} reused with another request")
                return dict(json.loads(row[1]))
            n = db.execute("SELECT COUNT(*) FROM effects WHERE kind=?", (kind,)).fetchone()[0]
            result = make(n + 1)
            db.execute(
                "INSERT INTO effects (kind, key, request, result) VALUES (?, ?, ?, ?)",
                (kind, key, text, json.dumps(result)),
            )
            db.execute("COMMIT")
            return dict(result)

    # -- the provider's API ---------------------------------------------------------------

    def charge(self, order_id: str, amount_cents: int, *, idempotency_key: str) -> dict[str, Any]:
        return self._effect(
            "charge", idempotency_key, {"order_id": order_id, "amount": amount_cents},
            lambda n: {"id": f"ch_{n}", "order_id": order_id, "amount": amount_cents},
        )

    def send_invoice(self, charge_id: str, *, idempotency_key: str) -> dict[str, Any]:
        return self._effect(
            "invoice", idempotency_key, {"charge_id": charge_id},
            lambda n: {"id": f"inv_{n}", "charge_id": charge_id},
        )

    def notify(self, message: str, *, idempotency_key: str) -> dict[str, Any]:
        return self._effect(
            "notify", idempotency_key, {"message": message}, lambda n: {"id": f"msg_{n}"}
        )

    # -- what tests look at ------------------------------------------------------------------

    def effects(self, kind: str) -> int:
        """How many distinct effects of ``kind`` happened (charges made, invoices sent)."""
        with self._connect() as db:
            return int(db.execute("SELECT COUNT(*) FROM effects WHERE kind=?", (kind,)).fetchone()[0])

    def calls(self, kind: str, key: str | None = None) -> int:
        """How many requests of ``kind`` arrived (replays of a key included)."""
        with self._connect() as db:
            if key is None:
                row = db.execute("SELECT COUNT(*) FROM calls WHERE kind=?", (kind,)).fetchone()
            else:
                row = db.execute("SELECT COUNT(*) FROM calls WHERE kind=? AND key=?", (kind, key)).fetchone()
            return int(row[0])

    def calls_per_key(self, kind: str) -> dict[str, int]:
        """Requests of ``kind`` per idempotency key (replays of a key included)."""
        with self._connect() as db:
            rows = db.execute("SELECT key, COUNT(*) FROM calls WHERE kind=? GROUP BY key", (kind,)).fetchall()
            return {str(key): int(n) for key, n in rows}

    def max_calls_per_key(self, kind: str) -> int:
        with self._connect() as db:
            row = db.execute(
                "SELECT COALESCE(MAX(c), 0) FROM (SELECT COUNT(*) AS c FROM calls WHERE kind=? GROUP BY key)",
                (kind,),
            ).fetchone()
            return int(row[0])
