"""The model adapter contract and the shapes a model returns."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

__all__ = ["Model", "ModelResponse", "ToolCall", "ToolSpec"]


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One tool call the model asks for."""

    id: str
    name: str
    arguments: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ModelResponse:
    """What a model answers: text, tool calls, or both."""

    text: str | None = None
    tool_calls: Sequence[ToolCall] = ()


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """A tool as the model sees it."""

    name: str
    description: str
    parameters: dict[str, Any]


@runtime_checkable
class Model(Protocol):
    """A chat model. ``messages`` are chat-completions shaped dicts (system first)."""

    async def complete(
        self, messages: list[dict[str, Any]], tools: Sequence[ToolSpec]
    ) -> ModelResponse: ...
