"""Which input records are resends of an earlier one. PURE.

Duplicates of an input cannot always be kept out of the log: on Kafka two gateways or
clients produce independently, and concurrent requests race past a look-up. Resending
an input with the same ``input_id`` and the same payload has no second effect (SPEC
7.2): the fold keeps the first copy (``SessionState.inputs``) and counts each later one
as an anomaly. Readers that show records one by one (the timeline, ``harness show`` /
``tail``, the gateway's events) use :class:`FirstInputs` to say so of a later copy,
and never show its payload (a message's text, app records) a second time.

A later record of the id with another payload is not a resend: it is a conflict, a
request of its own that its owner settles ``rejected`` / ``input_conflict``.
"""

from __future__ import annotations

from harness.records import Record
from harness.replay.payload import record_payload
from harness.replay.state import SessionState

__all__ = ["FirstInputs"]


class FirstInputs:
    """The first record of each input id seen so far.

    Feed it a session's records in log order with :meth:`see`. ``state``: the fold of
    the session's records before the first one fed (or of more: the fold's first copy
    of an id is the log's), looked up only for an id not seen here, so a reader that
    starts at a cursor costs nothing to set up. Payloads are compared only when an id
    comes again.
    """

    __slots__ = ("_first", "_state")

    def __init__(self, state: SessionState | None = None) -> None:
        self._first: dict[str, tuple[int, Record]] = {}
        self._state = state

    def see(self, seq: int, record: Record) -> int | None:
        """The position of the first copy when ``record`` (at ``seq``) resends it;
        None for any other record (not an input, the first copy, a conflict)."""
        if not getattr(type(record), "IS_INPUT", False):
            return None
        input_id = getattr(record, "input_id", None)
        if not isinstance(input_id, str):
            return None
        first = self._first.get(input_id)
        if first is None and self._state is not None:
            inp = self._state.inputs.get(input_id)
            first = (inp.seq, inp.record) if inp is not None else None
        if first is None:
            self._first[input_id] = (seq, record)
            return None
        first_seq, first_record = first
        if first_seq >= seq:  # the first itself (also known from the state)
            return None
        return first_seq if record_payload(record) == record_payload(first_record) else None
