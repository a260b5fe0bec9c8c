"""Pure replay: records -> session state -> the next action. No I/O here, ever."""

from harness.replay.conversation import conversation
from harness.replay.planner import (
    CallDecision,
    CallModel,
    CompleteTurn,
    FailTurn,
    RunBatch,
    ToolPolicy,
    TurnAction,
    decide_call,
    plan_turn,
)
from harness.replay.state import AppEntry, AskState, CallState, InputState, SessionState, TurnState, fold

__all__ = [
    "AppEntry",
    "AskState",
    "CallDecision",
    "CallModel",
    "CallState",
    "CompleteTurn",
    "FailTurn",
    "InputState",
    "RunBatch",
    "SessionState",
    "ToolPolicy",
    "TurnAction",
    "TurnState",
    "conversation",
    "decide_call",
    "fold",
    "plan_turn",
]
