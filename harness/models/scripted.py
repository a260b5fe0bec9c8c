"""A model that answers from a script: for tests, demos and crash drills."""

from __future__ import annotations

import copy
import inspect
from collections.abc import Callable, Sequence
from typing import Any

from harness.models.base import ModelResponse, ToolSpec

__all__ = ["ScriptedModel"]

Script = Sequence[ModelResponse] | Callable[[list[dict[str, Any]]], Any]


class ScriptedModel:
    """Answers ``responses[k]``, k = the number of assistant messages in the request.

    Counting assistant messages (not calls) makes the script resumable: a session
    resumed in a new process continues where the log says it was. With a
    function, it is called with the messages (sync or async) and returns a
    ``ModelResponse``. ``requests`` keeps a copy of the messages of every call.
    """

    def __init__(self, responses: Script) -> None:
        self._responses = responses
        self.requests: list[list[dict[str, Any]]] = []

    async def complete(
        self, messages: list[dict[str, Any]], tools: Sequence[ToolSpec] = ()
    ) -> ModelResponse:
        self.requests.append(copy.deepcopy(messages))
        if callable(self._responses):
            out = self._responses(messages)
            if inspect.isawaitable(out):
                out = await out
            if not isinstance(out, ModelResponse):
                raise TypeError(f"the script function returned {type(out).__name__}, not ModelResponse")
            return out
        k = sum(1 for m in messages if m.get("role") == "assistant")
        if k >= len(self._responses):
            raise IndexError(
                f"ScriptedModel has {len(self._responses)} responses; the request already "
                f"holds {k} assistant messages"
            )
        return self._responses[k]
