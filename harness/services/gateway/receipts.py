"""Receipts: what the gateway answers once an input is in the log. PURE (no I/O).

A receipt is a function of the log alone, so any replica gives the same one for
the same ``input_id``, however often it is asked:

* the input's first record in the session (its position ``p``) is found;
* its payload must equal the request's, else the request is ``rejected`` with
  code ``input_conflict`` (and nothing is written);
* the status comes from the records before ``p``: a message behind an earlier
  message that had not settled at ``p`` is ``queued``; everything else is
  ``accepted``.

A request refused before anything is written (unknown harness, no open ask, an
answer that fails the ask's schema, ...) is ``rejected`` with a code and a reason;
nothing is in the log, so asking again judges it again.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from harness.records import InputMessage, LogEntry, Record, record_data

__all__ = ["Receipt", "find_input", "receipt_for", "same_payload"]



@dataclass(frozen=True, slots=True)
class Receipt:
    input_id: str
    status: str  # accepted | queued | rejected
    code: str | None = None
    reason: str | None = None
    position: int | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"input_id": self.input_id, "status": self.status}
        if self.code is not None:
            out["code"] = self.code
        if self.reason is not None:
            out["reason"] = self.reason
        if self.position is not None:
            out["position"] = self.position
        return out


def rejected(input_id: str, code: str, reason: str) -> Receipt:
    return Receipt(input_id, "rejected", code, reason)


def _input_id(record: Record) -> str | None:
    value = getattr(record, "input_id", None)
    return value if isinstance(value, str) and getattr(type(record), "IS_INPUT", False) else None


def find_input(entries: Sequence[LogEntry], input_id: str) -> LogEntry | None:
    """The first input record of ``input_id`` in ``entries`` (log order)."""
    for entry in entries:
        if _input_id(entry.record) == input_id:
            return entry
    return None


def _payload(record: Record) -> dict[str, Any]:
    data = record_data(record)
    for key in ("session_id", "ts", "input_id"):
        data.pop(key, None)
    data["type"] = record.TYPE
    return data


def same_payload(a: Record, b: Record) -> bool:
    """Two inputs carry the same request (their ids, times and sessions aside)."""
    return _payload(a) == _payload(b)


def receipt_for(entries: Sequence[LogEntry], input_id: str, request: Record | None = None) -> Receipt | None:
    """The receipt of ``input_id`` from the session's records, or None if it is not in them.

    ``request``: the record a caller wants to send now; a different payload under the
    same id is ``input_conflict``.
    """
    first = find_input(entries, input_id)
    if first is None:
        return None
    if request is not None and not same_payload(first.record, request):
        return rejected(
            input_id,
            "input_conflict",
            f"input {input_id!r} was already sent with another payload; use a new input_id",
        )
    status = "accepted"
    if isinstance(first.record, InputMessage):
        open_messages: set[str] = set()
        for entry in entries:
            if entry.seq >= first.seq:
                break
            record = entry.record
            if isinstance(record, InputMessage):
                open_messages.add(record.input_id)
            elif record.TYPE == "harness.input.settled":
                open_messages.discard(getattr(record, "input_id", ""))
        if open_messages:
            status = "queued"
    return Receipt(input_id, status, position=first.seq)
