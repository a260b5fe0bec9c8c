"""Pure replay: records -> session state -> the next action. No I/O here, ever."""

from harness.replay.conversation import conversation
from harness.replay.history import trim_history
from harness.replay.planner import (
    AbortTurn,
    CallDecision,
    CallModel,
    CloseSettledTurn,
    CompleteTurn,
    FailTurn,
    RunBatch,
    ToolPolicy,
    TurnAction,
    decide_call,
    first_runs,
    is_parked,
    plan_turn,
)
from harness.replay.probe import CONTROL_TYPES, control_fields, ended_from_control
from harness.replay.state import (
    FINAL_OUTCOMES,
    AppEntry,
    AskState,
    CallState,
    InputState,
    SessionState,
    TurnState,
    UsageTotals,
    fold,
)

__all__ = [
    "CONTROL_TYPES",
    "FINAL_OUTCOMES",
    "AbortTurn",
    "AppEntry",
    "AskState",
    "CallDecision",
    "CallModel",
    "CallState",
    "CloseSettledTurn",
    "CompleteTurn",
    "FailTurn",
    "InputState",
    "RunBatch",
    "SessionState",
    "ToolPolicy",
    "TurnAction",
    "TurnState",
    "UsageTotals",
    "control_fields",
    "conversation",
    "decide_call",
    "ended_from_control",
    "first_runs",
    "fold",
    "is_parked",
    "plan_turn",
    "trim_history",
]
