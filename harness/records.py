"""The records of a session log, as plain frozen dataclasses.

Only ``harness.codec`` knows how these become Avro; everything else works with
these classes. Each class mirrors one schema in ``schemas/`` (same field names,
same order). Fields typed ``Json`` hold a JSON value in Python and travel as
JSON text in Avro. Times are integers: milliseconds since the epoch (UTC).

Record type names (``TYPE``) are part of the published contract: never rename one.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, Literal, TypeAlias

Json: TypeAlias = Any
"""A plain JSON value: None, bool, int, float, str, list, dict with str keys."""

Outcome = Literal["completed", "failed", "aborted"]
SettledOutcome = Literal["completed", "failed", "aborted", "rejected"]


@dataclass(frozen=True, slots=True)
class Record:
    """Base of every log record: the session it belongs to and when it was made."""

    TYPE: ClassVar[str] = ""
    JSON_FIELDS: ClassVar[tuple[str, ...]] = ()
    IS_INPUT: ClassVar[bool] = False

    session_id: str
    ts: int


# --- inputs: anyone may append these; the owner takes them in log order ---------------


@dataclass(frozen=True, slots=True)
class InputMessage(Record):
    """A user message that starts a turn. ``harness`` names the harness to run it."""

    TYPE: ClassVar[str] = "harness.input.message"
    IS_INPUT: ClassVar[bool] = True

    input_id: str
    text: str
    harness: str | None = None


@dataclass(frozen=True, slots=True)
class InputAnswer(Record):
    """An answer to a ``step.ask``, sent by any server or producer."""

    TYPE: ClassVar[str] = "harness.input.answer"
    JSON_FIELDS: ClassVar[tuple[str, ...]] = ("value",)
    IS_INPUT: ClassVar[bool] = True

    input_id: str
    tool_call_id: str
    name: str
    value: Json


@dataclass(frozen=True, slots=True)
class InputRecords(Record):
    """App records sent from outside a tool; they land once per ``input_id``."""

    TYPE: ClassVar[str] = "harness.input.records"
    JSON_FIELDS: ClassVar[tuple[str, ...]] = ("records",)
    IS_INPUT: ClassVar[bool] = True

    input_id: str
    records: Json  # list of {"type": str, ...}


@dataclass(frozen=True, slots=True)
class InputCancel(Record):
    """Cancel an input: its turn stops at the next boundary and settles ``aborted``."""

    TYPE: ClassVar[str] = "harness.input.cancel"
    IS_INPUT: ClassVar[bool] = True

    input_id: str  # this request's own id (``cancel:<target>`` by default)
    target_input_id: str


@dataclass(frozen=True, slots=True)
class InputSettled(Record):
    """The owner's verdict on an input: how it ended, or why it was rejected.

    ``input_seq`` names the input record it settles when that is not the first record
    with this ``input_id`` (a conflicting resend, settled ``rejected``/``input_conflict``).
    """

    TYPE: ClassVar[str] = "harness.input.settled"

    input_id: str
    outcome: str  # SettledOutcome
    code: str | None = None
    reason: str | None = None
    input_seq: int | None = None


# --- turns -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TurnStarted(Record):
    TYPE: ClassVar[str] = "harness.turn.started"

    input_id: str
    turn: int


@dataclass(frozen=True, slots=True)
class TurnResumed(Record):
    """A new owner took over an unfinished turn.

    ``attempt`` counts the takeovers that used an attempt (1 = the first owner);
    ``counted`` is False for the takeover of a parked turn (SPEC 7.5), which keeps
    the attempt number it found.
    """

    TYPE: ClassVar[str] = "harness.turn.resumed"

    input_id: str
    turn: int
    attempt: int
    counted: bool = True


@dataclass(frozen=True, slots=True)
class TurnFinished(Record):
    TYPE: ClassVar[str] = "harness.turn.finished"

    input_id: str
    turn: int
    outcome: str  # Outcome
    text: str | None = None
    code: str | None = None
    error: str | None = None


@dataclass(frozen=True, slots=True)
class ModelResponseRecord(Record):
    """A model response, logged BEFORE its tool calls run (SPEC 5.7).

    ``tool_calls`` is a tuple of dicts ``{"id": str, "name": str, "arguments": dict}``.
    ``finish_reason`` ``"length"`` marks a response cut at the model's output limit:
    its tool calls never run (the planner decides so from this field). ``thinking`` is a
    tuple of the provider's reasoning blocks (dicts ``{"type", "thinking"?, "signature"?,
    "data"?}``, only the keys the block had) to send back with this response
    (``ModelResponse.thinking``); empty for most models and for records written before it.
    """

    TYPE: ClassVar[str] = "harness.model.response"

    turn: int
    index: int
    text: str | None = None
    tool_calls: tuple[dict[str, Any], ...] = field(default_factory=tuple)
    finish_reason: str | None = None
    thinking: tuple[dict[str, str], ...] = ()  # (a tuple is immutable: a plain default, as old logs read it)

    @property
    def truncated(self) -> bool:
        return self.finish_reason == "length"


@dataclass(frozen=True, slots=True)
class ModelUsage(Record):
    """What one completed model call used; appended with its ``ModelResponseRecord``, or,
    for a call a sub-agent made inside an agent tool call (``tool_call_id``), with that
    call's step result (``index``: its position among the sub-agent's calls)."""

    TYPE: ClassVar[str] = "harness.model.usage"

    turn: int
    index: int
    model: str | None = None
    input_tokens: int = 0
    output_tokens: int = 0
    cost: float | None = None
    tool_call_id: str | None = None


@dataclass(frozen=True, slots=True)
class ModelRetry(Record):
    """A model call failed transiently; retry number ``retry`` comes at ``wait_until``.

    Logged before the backoff wait, so a new owner resumes with the same count.
    """

    TYPE: ClassVar[str] = "harness.model.retry"

    turn: int
    index: int
    retry: int
    wait_until: int
    error: str
    status: int | None = None
    kind: str | None = None


# --- tool calls ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ToolStarted(Record):
    """A tool call is about to run (``attempt`` 1 on its first run)."""

    TYPE: ClassVar[str] = "harness.tool.started"

    tool_call_id: str
    name: str
    attempt: int


@dataclass(frozen=True, slots=True)
class StepResult(Record):
    TYPE: ClassVar[str] = "harness.step.result"
    JSON_FIELDS: ClassVar[tuple[str, ...]] = ("value",)

    tool_call_id: str
    name: str
    value: Json


@dataclass(frozen=True, slots=True)
class SleepScheduled(Record):
    TYPE: ClassVar[str] = "harness.sleep.scheduled"

    tool_call_id: str
    name: str
    wake_at: int


@dataclass(frozen=True, slots=True)
class AskOpened(Record):
    TYPE: ClassVar[str] = "harness.ask.opened"
    JSON_FIELDS: ClassVar[tuple[str, ...]] = ("schema",)

    tool_call_id: str
    name: str
    message: str
    schema: Json
    expires_at: int | None = None


@dataclass(frozen=True, slots=True)
class AskAnswered(Record):
    TYPE: ClassVar[str] = "harness.ask.answered"
    JSON_FIELDS: ClassVar[tuple[str, ...]] = ("value",)

    tool_call_id: str
    name: str
    value: Json
    input_id: str | None = None


@dataclass(frozen=True, slots=True)
class ToolResult(Record):
    """What the model saw for a call: after hooks, secrets removed (SPEC 5.6).

    ``content`` is the JSON value; ``code`` classifies errors (``invalid_arguments``,
    ``unknown_tool``, ``tool_failed``, ``cut``, ``attempts_exhausted`` ...).
    """

    TYPE: ClassVar[str] = "harness.tool.result"
    JSON_FIELDS: ClassVar[tuple[str, ...]] = ("content",)

    tool_call_id: str
    name: str
    content: Json
    is_error: bool = False
    replaced_by_hook: bool = False
    code: str | None = None


@dataclass(frozen=True, slots=True)
class AppRecord(Record):
    """An app record: ``body`` is the whole record object, ``type`` included.

    Staged by ``ctx.append`` (then ``tool_call_id`` is set and it lands with the
    tool result) or sent with ``append_records`` (then ``input_id`` is set).
    """

    TYPE: ClassVar[str] = "harness.app.record"
    JSON_FIELDS: ClassVar[tuple[str, ...]] = ("body",)

    record_type: str
    body: Json
    tool_call_id: str | None = None
    input_id: str | None = None


RECORD_CLASSES: tuple[type[Record], ...] = (
    InputMessage,
    InputAnswer,
    InputRecords,
    InputCancel,
    InputSettled,
    TurnStarted,
    TurnResumed,
    TurnFinished,
    ModelResponseRecord,
    ModelUsage,
    ModelRetry,
    ToolStarted,
    StepResult,
    SleepScheduled,
    AskOpened,
    AskAnswered,
    ToolResult,
    AppRecord,
)

RECORD_TYPES: dict[str, type[Record]] = {cls.TYPE: cls for cls in RECORD_CLASSES}


def record_data(record: Record) -> dict[str, Any]:
    """The record's fields as a plain dict (JSON fields as Python values)."""
    out: dict[str, Any] = {}
    for f in fields(record):
        value = getattr(record, f.name)
        if isinstance(value, tuple):
            value = list(value)
        out[f.name] = value
    return out


def entry_type(record: Record) -> str:
    """The type a reader sees: an app record's own type (``app.memory``), else the record's."""
    if isinstance(record, AppRecord):
        return record.record_type
    return record.TYPE


def entry_data(record: Record) -> dict[str, Any]:
    """The data a reader sees: an app record's body, else the record's fields (SPEC 4.4)."""
    if isinstance(record, AppRecord) and isinstance(record.body, dict):
        return dict(record.body)
    return record_data(record)


@dataclass(frozen=True, slots=True)
class LogEntry:
    """A committed record as read back from a log.

    ``seq`` is the record's position: increasing within a session, comparable
    within one log (a Kafka offset within the session's partition).

    ``type`` and ``data`` are what readers want (SPEC 4.4): an app record appended by a
    tool reads back with its own type and its body (``"app.memory"``,
    ``{"type": "app.memory", ...}``); the ``harness.app.record`` envelope it travels in
    is an encoding detail, still at hand as ``record_type`` and ``record``.
    """

    seq: int
    record: Record

    @property
    def type(self) -> str:
        return entry_type(self.record)

    @property
    def record_type(self) -> str:
        """The log record's own type (``harness.app.record`` for an app record)."""
        return self.record.TYPE

    @property
    def data(self) -> dict[str, Any]:
        return entry_data(self.record)

    @property
    def session_id(self) -> str:
        return self.record.session_id
