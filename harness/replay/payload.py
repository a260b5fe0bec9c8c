"""What an input says, for telling a resend from a conflicting reuse of its id. PURE.

Resending an input with the same ``input_id`` and the same payload has no second
effect (SPEC 7.2); the same ``input_id`` with another payload is a conflict, settled
``rejected`` / ``input_conflict``. The payload is compared as canonical JSON (sorted
keys), so ``1`` and ``true`` differ and key order does not matter. The message's
``harness`` name and every timestamp are not part of it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from harness.records import Record, record_data

__all__ = ["PAYLOAD_FIELDS", "input_payload", "record_payload"]

PAYLOAD_FIELDS: dict[str, tuple[str, ...]] = {
    "harness.input.message": ("text",),
    "harness.input.answer": ("tool_call_id", "name", "value"),
    "harness.input.records": ("records",),
    "harness.input.cancel": ("target_input_id",),
}
_JSON_FIELDS = frozenset({"value", "records"})


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def input_payload(record_type: str, fields: Mapping[str, Any], *, json_as_text: bool = False) -> tuple[Any, ...]:
    """A comparable form of an input's payload (``fields`` as read: JSON fields as text
    when ``json_as_text``, as values otherwise)."""
    out: list[Any] = [record_type]
    for name in PAYLOAD_FIELDS.get(record_type, ()):
        value = fields.get(name)
        if name in _JSON_FIELDS:
            value = _canonical(json.loads(value) if json_as_text and isinstance(value, str) else value)
        out.append(value)
    return tuple(out)


def record_payload(record: Record) -> tuple[Any, ...]:
    """:func:`input_payload` of an input record as it is held (its JSON fields as values)."""
    return input_payload(record.TYPE, record_data(record))
