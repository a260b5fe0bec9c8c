"""The gateway API's request and response bodies: pydantic models, their fields' checks (a 422 names
what is wrong) and the descriptions the OpenAPI document shows. No route lives here (``routes``)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, JsonValue

from harness.ids import check_id, check_sent_input_id
from harness.views import SessionStateName

__all__ = [
    "AnswerIn",
    "CancelIn",
    "ListedOut",
    "MessageIn",
    "OpenAskOut",
    "ReceiptOut",
    "RecordsIn",
    "SessionDetail",
    "SessionPage",
    "SettlementOut",
    "SummaryOut",
    "UsageOut",
]

NAME = r"^[^\x00-\x1f\x7f]{1,200}$"
InputIdField = Annotated[str, AfterValidator(lambda value: check_id(value, "input id"))]
SentInputIdField = Annotated[str, AfterValidator(check_sent_input_id)]
"""A message's or app records' own id: not one of the prefixes kept for answers and cancels."""
ToolCallIdField = Annotated[str, AfterValidator(lambda value: check_id(value, "tool call id"))]
NameField = Annotated[str, Field(pattern=NAME)]
MAX_TEXT = 256 * 1024
MAX_LIST = 500


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class MessageIn(_Body):
    text: str = Field(min_length=1, max_length=MAX_TEXT)  # (harness send refuses an empty text too)
    harness: NameField | None = None
    input_id: SentInputIdField | None = None


class AnswerIn(_Body):
    tool_call_id: ToolCallIdField
    name: NameField
    value: JsonValue
    input_id: InputIdField | None = None


class RecordsIn(_Body):
    records: list[dict[str, JsonValue]] = Field(min_length=1, max_length=MAX_LIST)
    input_id: SentInputIdField | None = None


class CancelIn(_Body):
    input_id: InputIdField


class OpenAskOut(BaseModel):
    tool_call_id: str
    name: str
    message: str
    schema_: JsonValue = Field(alias="schema", description="the JSON schema an answer must match")
    expires_at: float | None = Field(None, description="seconds since the epoch (harness.views.OpenAsk)")


class SettlementOut(BaseModel):
    outcome: Literal["completed", "failed", "aborted", "rejected", "waiting", "running"] = Field(
        description="the input's settlement; 'waiting': its turn waits for a person (see asks); "
        "'running': neither within the wait (the turn goes on: stream the events after position - 1)"
    )
    code: str | None = None
    reason: str | None = None
    text: str | None = Field(None, description="the turn's answer")
    asks: list[OpenAskOut] | None = Field(None, description="the open asks, when 'waiting'")
    queued_behind: str | None = Field(None, description="'waiting' for a message queued behind a turn that "
                                      "waits for a person: that turn's input (it runs once the ask is answered)")


class ReceiptOut(BaseModel):
    input_id: str
    status: Literal["accepted", "queued", "rejected"]
    code: str | None = None
    reason: str | None = None
    position: int | None = Field(None, description="the input's log position (resume events after position - 1)")
    settlement: SettlementOut | None = Field(
        None, description="with ?wait=: how the input ended, that its turn waits for a person, or 'running'"
    )


class UsageOut(BaseModel):
    calls: int = Field(description="completed model calls")
    input_tokens: int
    output_tokens: int
    cost: float | None = Field(None, description="US dollars, when the provider or the pricing says")


class SummaryOut(BaseModel):
    """``harness.views.SessionSummary.to_json()``, as ``harness sessions --json`` prints it."""

    model_config = ConfigDict(extra="allow")
    session_id: str
    harness: str | None
    state: SessionStateName
    last_activity: int | None = None
    sleeping_until: int | None = None
    open_asks: list[OpenAskOut] = []
    turns: int = 0
    last_outcome: str | None = None
    last_code: str | None = None
    active_input: str | None = None
    pending_inputs: int = 0
    partial: bool = Field(False, description="known by id only (Kafka: ended before its partition's checkpoint)")
    usage: UsageOut | None = None


class ListedOut(SummaryOut):
    """A row of the list: the summary and where the session is."""

    path: str = Field(description="the session's URL path, its id percent-encoded as one segment (a '/' in "
                      "it as %2F): GET it, or add /events, /messages ... to it")


class SessionPage(BaseModel):
    sessions: list[ListedOut]
    next_cursor: str | None = None


class SessionDetail(BaseModel):
    """The summary and the timeline as ``harness show --json`` prints them, and more."""

    model_config = ConfigDict(extra="allow")
    summary: SummaryOut
    open_asks: list[OpenAskOut]
    sleeps: list[dict[str, Any]]
    usage: UsageOut
    transcript: list[dict[str, Any]]
    timeline: list[dict[str, Any]] = Field(description="harness.views.TimelineItem.to_json() of every item "
                                           "(the last timeline_limit ones when asked)")
    last_position: int | None
    timeline_skipped: int = Field(0, description="earlier timeline items left out by timeline_limit")
    transcript_skipped: int = Field(0, description="earlier transcript messages left out by timeline_limit")
