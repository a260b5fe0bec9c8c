"""A durable agent harness: tool calls whose side effects survive crashes.

Tools do their side effects in durable steps; each finished step is in the
session log (Kafka, or an embedded SQLite file) before it returns, so after a
crash the finished steps return their stored values and only the rest run.
"""

from harness.clock import Clock, FakeClock, SystemClock
from harness.context import ToolContext
from harness.definition import Durability, Harness, Hooks, ToolCallEvent, ToolOutcome, define_harness
from harness.errors import HarnessError
from harness.log import LogEntry, SessionLog, open_log
from harness.runtime import HarnessHost, OpenAsk, Session, TurnResult, chat
from harness.step import StepInfo
from harness.tools import Tool, ToolDefinition, durable_tool, tool, tool_definition

__all__ = [
    "Clock",
    "Durability",
    "FakeClock",
    "Harness",
    "HarnessError",
    "HarnessHost",
    "Hooks",
    "LogEntry",
    "OpenAsk",
    "Session",
    "SessionLog",
    "StepInfo",
    "SystemClock",
    "Tool",
    "ToolCallEvent",
    "ToolContext",
    "ToolDefinition",
    "ToolOutcome",
    "TurnResult",
    "chat",
    "define_harness",
    "durable_tool",
    "open_log",
    "tool",
    "tool_definition",
]
