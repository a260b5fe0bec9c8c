"""Model adapters: the Protocol, a scripted model for tests and demos."""

from harness.models.base import Model, ModelResponse, ToolCall, ToolSpec
from harness.models.scripted import ScriptedModel

__all__ = ["Model", "ModelResponse", "ScriptedModel", "ToolCall", "ToolSpec"]
