"""A model that answers from a script: for tests, demos and crash drills."""

from __future__ import annotations

import copy
import inspect
from collections.abc import Callable, Sequence
from typing import Any

from harness.errors import DefinitionError
from harness.models.base import ModelResponse, ToolSpec

__all__ = ["KEEP_REQUESTS", "ScriptedModel"]

Script = Sequence[ModelResponse] | Callable[[list[dict[str, Any]]], Any]


KEEP_REQUESTS = 1000
"""How many of its latest requests a scripted model keeps by default."""


class ScriptedModel:
    """Answers ``responses[k]``, k = the number of assistant messages in the request.

    Counting assistant messages (not calls) makes the script resumable: a session
    resumed in a new process continues where the log says it was. A history policy
    (``History``) that drops old turns from a request lowers k too: script such a
    session with a function. With a
    function, it is called with the messages (sync or async) and returns a
    ``ModelResponse``.

    ``requests`` keeps a copy of the messages of every call, oldest first: of the last
    ``keep_requests`` calls (1000 by default; ``None``: all). A worker or a demo that
    runs a scripted model for hours would otherwise hold a copy of every request it
    ever answered.
    """

    def __init__(self, responses: Script, *, keep_requests: int | None = KEEP_REQUESTS) -> None:
        if keep_requests is not None and (isinstance(keep_requests, bool) or not isinstance(keep_requests, int)
                                          or keep_requests < 0):
            raise ValueError(f"keep_requests must be a number of requests (0 or more) or None, not {keep_requests!r}")
        _check_script(responses)
        self._responses = responses
        self._keep = keep_requests
        self.requests: list[list[dict[str, Any]]] = []

    async def complete(
        self, messages: list[dict[str, Any]], tools: Sequence[ToolSpec] = ()
    ) -> ModelResponse:
        keep = self._keep
        if keep is None or keep > 0:
            self.requests.append(copy.deepcopy(messages))
            if keep is not None and len(self.requests) > keep:
                del self.requests[0]  # (a move of at most ``keep`` pointers)
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


_FIX = "give a list of ModelResponse(...) or a function of the messages, e.g. ScriptedModel([ModelResponse(text='hi')])"


def _check_script(responses: object) -> None:
    """Refuse, when the model is made, a script it could never answer from (not at the first turn)."""
    if callable(responses):
        return
    if isinstance(responses, str | bytes):
        raise DefinitionError(f"ScriptedModel(responses) takes a list, not a {type(responses).__name__}: {_FIX}")
    if not isinstance(responses, Sequence):
        raise DefinitionError(f"ScriptedModel(responses) takes a list, not {type(responses).__name__}: {_FIX}")
    for k, response in enumerate(responses):
        if not isinstance(response, ModelResponse):
            raise DefinitionError(f"ScriptedModel: responses[{k}] is a {type(response).__name__}, not a "
                                  f"ModelResponse: {_FIX}")
