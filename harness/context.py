"""``ctx``: what a tool's execute function gets besides its arguments."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from harness.errors import InvalidRecord, NotDurableError, NoToolCallError, ReservedRecordType
from harness.jsonvalues import json_copy
from harness.secrets import SecretScrubber
from harness.step import DurableStep, PlainStep, SyncStep

__all__ = ["ToolContext", "check_app_records"]


def check_app_records(records: Any) -> list[dict[str, Any]]:
    """Validate app records at once: JSON objects with a string ``type`` not in ``harness.``."""
    if not isinstance(records, (list, tuple)):
        raise InvalidRecord("records must be a list of JSON objects")
    out: list[dict[str, Any]] = []
    for i, record in enumerate(records):
        if not isinstance(record, dict) or not isinstance(record.get("type"), str) or not record["type"]:
            raise InvalidRecord(f"record {i} must be a JSON object with a non-empty string 'type'")
        if record["type"].startswith("harness."):
            raise ReservedRecordType(record["type"])
        out.append(json_copy(record, path=f"$[{i}]", what="app record"))
    return out


class ToolContext:
    """The context of one tool call.

    Attributes:
        step: durable steps, sleeps and asks (``ctx.step.do(name, fn)``).
        tool_call_id: the model's id of this call.
        session_id: the session (None in plain mode).
        log_id: the session's log id, the first part of every idempotency key.
        secrets: the session's secrets, read-only.
    """

    def __init__(
        self,
        *,
        step: DurableStep | PlainStep | SyncStep,
        tool_call_id: str,
        session_id: str | None,
        log_id: str | None,
        secrets: Mapping[str, str],
        scrubber: SecretScrubber,
        durable: bool,
    ) -> None:
        self.step = step
        self.tool_call_id = tool_call_id
        self.session_id = session_id
        self.log_id = log_id
        self.secrets = secrets
        self._scrubber = scrubber
        self._durable = durable
        self._staged: list[dict[str, Any]] = []
        self._closed = False

    def close(self) -> None:
        """The call is over: a later ``append`` raises NoToolCallError (SPEC 2.11), as the
        steps do; its result, which staged records land with, is out already."""
        self._closed = True

    def append(self, records: list[dict[str, Any]]) -> None:
        """Stage app records; they land atomically with this call's result (SPEC 4.1).

        Raises ReservedRecordType / InvalidRecord at once; NotDurableError in plain mode;
        NoToolCallError once the call returned (a ctx kept after its tool returned).
        """
        if self._closed:
            raise NoToolCallError(
                "ctx.append used outside a running tool call (a ctx kept after its tool returned): records "
                "land with the call's result; append them with session.append_records() instead",
                session_id=self.session_id,
                tool_call_id=self.tool_call_id,
            )
        if not self._durable:
            raise NotDurableError("ctx.append needs a durable session: records land in the session log")
        checked = check_app_records(records)
        self._staged.extend(self._scrubber.redact(r) for r in checked)

    @property
    def staged_records(self) -> list[dict[str, Any]]:
        return list(self._staged)
