"""A durable agent harness: tool calls whose side effects survive crashes.

Tools do their side effects in durable steps; each finished step is in the
session log (Kafka, or an embedded SQLite file) before it returns, so after a
crash the finished steps return their stored values and only the rest run.

The names below are loaded on first use (PEP 562), so importing a part of the
package (``harness.replay``, ``harness.codec``) pulls in nothing else.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from harness.clock import Clock, FakeClock, SystemClock
    from harness.context import ToolContext
    from harness.definition import Durability, Harness, Hooks, ToolCallEvent, ToolOutcome, define_harness
    from harness.errors import HarnessError
    from harness.log import LogEntry, SessionLog, open_log
    from harness.runtime import HarnessHost, OpenAsk, Session, TurnResult, chat
    from harness.step import StepInfo
    from harness.tools import Tool, ToolDefinition, durable_tool, tool, tool_definition

_EXPORTS = {
    "Clock": "harness.clock",
    "Durability": "harness.definition",
    "FakeClock": "harness.clock",
    "Harness": "harness.definition",
    "HarnessError": "harness.errors",
    "HarnessHost": "harness.runtime",
    "Hooks": "harness.definition",
    "LogEntry": "harness.log",
    "OpenAsk": "harness.runtime",
    "Session": "harness.runtime",
    "SessionLog": "harness.log",
    "StepInfo": "harness.step",
    "SystemClock": "harness.clock",
    "Tool": "harness.tools",
    "ToolCallEvent": "harness.definition",
    "ToolContext": "harness.context",
    "ToolDefinition": "harness.tools",
    "ToolOutcome": "harness.definition",
    "TurnResult": "harness.runtime",
    "chat": "harness.runtime",
    "define_harness": "harness.definition",
    "durable_tool": "harness.tools",
    "open_log": "harness.log",
    "tool": "harness.tools",
    "tool_definition": "harness.tools",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'harness' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
