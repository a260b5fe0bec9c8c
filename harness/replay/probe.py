"""Whether a session ended, from its control records alone. PURE.

A rebuild meets mostly sessions that ended long ago; deciding that from the few
records that can change it (inputs, their verdicts, turns started and finished), read
as plain fields, spares decoding and folding everything else. The rules are the
fold's (``state.py``), restricted to what ``SessionState.ended`` depends on; a
property test holds the two to the same answer.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from harness.jsonvalues import dumps
from harness.records import Record, record_data
from harness.replay.payload import input_payload

__all__ = ["CONTROL_TYPES", "control_fields", "ended_from_control"]

_INPUTS = frozenset(
    {"harness.input.message", "harness.input.answer", "harness.input.records", "harness.input.cancel"}
)
_SETTLED = "harness.input.settled"
_STARTED = "harness.turn.started"
_FINISHED = "harness.turn.finished"

CONTROL_TYPES = _INPUTS | {_SETTLED, _STARTED, _FINISHED}
"""The record types ``SessionState.ended`` depends on."""


def control_fields(record: Record) -> dict[str, Any]:
    """A record's fields as a lazily read record gives them: JSON fields as text."""
    data = record_data(record)
    for name in type(record).JSON_FIELDS:
        data[name] = dumps(data[name])
    return data


def ended_from_control(records: Iterable[tuple[int, str, Mapping[str, Any]]]) -> bool:
    """``fold(...).ended`` from (position, type, fields) of a session's control records
    in log order; JSON fields as text (as a lazily read record gives them).

    Records of other types are ignored.
    """
    inputs: dict[str, list[bool]] = {}  # input id -> [settled, started a turn]
    first: dict[str, tuple[int, tuple[Any, ...]]] = {}  # input id -> (position, payload)
    conflicts: dict[int, str] = {}  # unsettled conflicting reuses: position -> input id
    finished: list[bool] = []  # per turn
    for seq, record_type, fields in records:
        if record_type in _INPUTS:
            input_id = fields["input_id"]
            payload = input_payload(record_type, fields, json_as_text=True)
            if input_id not in first:
                first[input_id] = (seq, payload)
                inputs[input_id] = [False, False]
            elif first[input_id][1] != payload:
                conflicts[seq] = input_id
        elif record_type == _SETTLED:
            input_id = fields["input_id"]
            at = fields.get("input_seq")
            if at is not None and input_id in first and at != first[input_id][0]:
                if conflicts.get(at) == input_id:
                    del conflicts[at]
                continue
            inp = inputs.get(input_id)
            if inp is not None and not inp[0]:
                inp[0] = True
        elif record_type == _STARTED:
            inp = inputs.get(fields["input_id"])
            if inp is not None and not inp[1] and fields["turn"] == len(finished) + 1:
                inp[1] = True
                finished.append(False)
        elif record_type == _FINISHED:
            n = fields["turn"]
            if 0 < n <= len(finished) and not finished[n - 1]:
                finished[n - 1] = True
    active = bool(finished) and not finished[-1]
    pending = any(not settled and not started for settled, started in inputs.values())
    return not active and not pending and not conflicts
