"""The chat messages a session's state stands for (what the model is sent). PURE."""

from __future__ import annotations

from typing import Any

from harness.jsonvalues import dumps
from harness.records import InputMessage
from harness.replay.state import SessionState

__all__ = ["conversation"]

_UNFINISHED = {
    "error": "turn_ended",
    "message": "the turn ended before this tool call finished; it may or may not have run",
}


def conversation(state: SessionState, *, starting: str | None = None) -> list[dict[str, Any]]:
    """Messages in the chat-completions shape, oldest first, without a system prompt.

    Each turn gives its user message, then for each model response the
    assistant message and the results of its calls that have one, in call order.

    ``starting``: the input id of a message whose turn is being started (its
    ``harness.turn.started`` not folded yet: the first model call overlaps that
    append); its user message ends the conversation, exactly as folding that record
    makes it (tested), whether or not it is folded yet.
    """
    messages: list[dict[str, Any]] = []
    for turn in state.turns:
        record = state.inputs[turn.input_id].record
        assert isinstance(record, InputMessage)
        messages.append({"role": "user", "content": record.text})
        for response in turn.responses:
            assistant: dict[str, Any] = {"role": "assistant", "content": response.text or ""}
            if response.thinking:  # the model's reasoning blocks, from the log: sent back as they are
                assistant["thinking"] = [dict(b) for b in response.thinking]
            if response.tool_calls:
                assistant["tool_calls"] = [
                    {"id": c["id"], "name": c["name"], "arguments": c.get("arguments") or {}}
                    for c in response.tool_calls
                ]
            messages.append(assistant)
            for call in state.batch(response):
                if call.result is not None:
                    content, is_error = dumps(call.result.content), call.result.is_error
                elif turn.finished is not None:
                    # The turn ended (failed) before this call did: the model must still
                    # get a reply for every call id it made.
                    content, is_error = dumps(_UNFINISHED), True
                else:
                    continue
                messages.append(
                    {
                        "role": "tool",
                        "tool_call_id": call.tool_call_id,
                        "name": call.name,
                        "content": content,
                        "is_error": is_error,
                    }
                )
    if starting is not None and state.inputs[starting].turn is None:  # (not folded yet)
        record = state.inputs[starting].record
        assert isinstance(record, InputMessage)
        messages.append({"role": "user", "content": record.text})
    return messages
