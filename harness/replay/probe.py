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

__all__ = ["CONTROL_TYPES", "ended_from_control"]

_INPUTS = frozenset({"harness.input.message", "harness.input.answer", "harness.input.records"})
_SETTLED = "harness.input.settled"
_STARTED = "harness.turn.started"
_FINISHED = "harness.turn.finished"

CONTROL_TYPES = _INPUTS | {_SETTLED, _STARTED, _FINISHED}
"""The record types ``SessionState.ended`` depends on."""


def ended_from_control(records: Iterable[tuple[str, Mapping[str, Any]]]) -> bool:
    """``fold(...).ended`` from (type, fields) of a session's control records in log order.

    Records of other types are ignored.
    """
    inputs: dict[str, list[bool]] = {}  # input id -> [settled, started a turn]
    finished: list[bool] = []  # per turn
    for record_type, fields in records:
        if record_type in _INPUTS:
            inputs.setdefault(fields["input_id"], [False, False])  # the first one counts
        elif record_type == _SETTLED:
            inp = inputs.get(fields["input_id"])
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
    return not active and not pending
