"""Model adapters: the Protocol, a scripted model for tests and demos, real providers.

``OpenAIChat`` (``harness.models.openai``, extra ``[openai]``) and
``AnthropicMessages`` (``harness.models.anthropic``, extra ``[anthropic]``) import
their SDK only when made; ``from_uri("openai:gpt-4.1-mini")`` picks one from a string.
"""

from harness.models.base import (
    FINISH_REASONS,
    Model,
    ModelResponse,
    Pricing,
    StreamSink,
    ToolCall,
    ToolSpec,
    Usage,
)
from harness.models.scripted import ScriptedModel
from harness.models.uri import from_uri

__all__ = [
    "FINISH_REASONS",
    "Model",
    "ModelResponse",
    "Pricing",
    "ScriptedModel",
    "StreamSink",
    "ToolCall",
    "ToolSpec",
    "Usage",
    "from_uri",
]
