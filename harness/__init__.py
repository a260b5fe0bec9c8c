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
    from harness.client import HarnessClient as HarnessClient
    from harness.client import InputReceipt as InputReceipt
    from harness.clock import Clock as Clock
    from harness.clock import FakeClock as FakeClock
    from harness.clock import SystemClock as SystemClock
    from harness.context import ToolContext as ToolContext
    from harness.definition import Durability as Durability
    from harness.definition import Harness as Harness
    from harness.definition import History as History
    from harness.definition import Hooks as Hooks
    from harness.definition import ToolCallEvent as ToolCallEvent
    from harness.definition import ToolOutcome as ToolOutcome
    from harness.definition import define_harness as define_harness
    from harness.errors import ContextTooLong as ContextTooLong
    from harness.errors import HarnessError as HarnessError
    from harness.errors import StepNotAwaited as StepNotAwaited
    from harness.log import LogEntry as LogEntry
    from harness.log import SessionLog as SessionLog
    from harness.log import open_log as open_log
    from harness.runtime import HarnessHost as HarnessHost
    from harness.runtime import OpenAsk as OpenAsk
    from harness.runtime import Session as Session
    from harness.runtime import TurnResult as TurnResult
    from harness.runtime.agent import agent_tool as agent_tool
    from harness.runtime.chat import chat as chat
    from harness.runtime.worker import Worker as Worker
    from harness.step import StepInfo as StepInfo
    from harness.tools import Tool as Tool
    from harness.tools import ToolDefinition as ToolDefinition
    from harness.tools import durable_tool as durable_tool
    from harness.tools import tool as tool
    from harness.tools import tool_definition as tool_definition

_EXPORTS = {
    "Clock": "harness.clock",
    "ContextTooLong": "harness.errors",
    "Durability": "harness.definition",
    "FakeClock": "harness.clock",
    "Harness": "harness.definition",
    "HarnessClient": "harness.client",
    "HarnessError": "harness.errors",
    "HarnessHost": "harness.runtime",
    "History": "harness.definition",
    "Hooks": "harness.definition",
    "InputReceipt": "harness.client",
    "LogEntry": "harness.log",
    "OpenAsk": "harness.runtime",
    "Session": "harness.runtime",
    "SessionLog": "harness.log",
    "StepInfo": "harness.step",
    "StepNotAwaited": "harness.errors",
    "SystemClock": "harness.clock",
    "Tool": "harness.tools",
    "ToolCallEvent": "harness.definition",
    "ToolContext": "harness.context",
    "ToolDefinition": "harness.tools",
    "ToolOutcome": "harness.definition",
    "TurnResult": "harness.runtime",
    "Worker": "harness.runtime.worker",
    "agent_tool": "harness.runtime.agent",
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
