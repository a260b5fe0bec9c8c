"""The history policy: which messages of a conversation a model request carries. PURE.

A long session's conversation grows with every turn until the provider refuses it as
longer than the model's context window. :func:`trim_history` bounds what one request
sends (never what the log holds), from the messages alone, so a session resumed in
another process sends the same request:

* the leading system message(s) are always kept;
* the rest is cut into turns, each from a user message up to the next one (messages
  before the first user message make a group of their own);
* the current turn (from the last user message on) is kept whole, even when it alone is
  over the bounds (the provider then decides), unless ``trim_current_turn``: then, when
  it alone is over them, its oldest tool rounds go too (below);
* older turns are kept newest first while the bounds hold; the first one that does not
  fit is dropped with every turn before it.

Dropping only whole turns never separates an assistant message with ``tool_calls`` from
its tool results (a tool result without its call is a 400 at every provider), and the
first message after the system prompt is always a user message (Anthropic requires it).

``trim_current_turn`` (opt-in) is for turns that loop over many tool calls, above all an
``agent_tool`` sub-agent's, whose whole run is ONE turn (its prompt, then its tool calls
and results). The current turn is cut into its head (the user message and any messages
before its first assistant message) and rounds (an assistant message with the tool
results that follow it). When the turn alone is over the bounds, every older turn is
dropped, the head and the latest round are always kept, and older rounds are kept newest
first while the bounds hold, the first that does not fit going with every round before
it. A round goes whole, so a tool call still never travels without its result, and the
kept rounds follow the prompt with no hole after them. The model no longer sees what the
dropped rounds did (it may do some of it again): it is a way to keep going, not a memory.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

from harness.jsonvalues import dumps

__all__ = ["message_chars", "trim_history"]

M = TypeVar("M", bound=Mapping[str, Any])


def message_chars(message: Mapping[str, Any]) -> int:
    """The characters a message counts for ``max_chars``: its content (text, or its JSON
    when it is not a string), plus each tool call's name and JSON arguments.

    An assistant message's ``thinking`` blocks do not count: the provider takes earlier
    turns' reasoning out of the context window itself (Anthropic: "previous thinking
    blocks are automatically stripped from the context window calculation", docs,
    Context windows), and the current turn, whose blocks do count there, is kept whole
    anyway. They still travel in the request's body (an HTTP 413 counts them:
    ``RequestTooLarge``)."""
    content = message.get("content")
    size = len(content) if isinstance(content, str) else len(dumps(content)) if content is not None else 0
    for call in message.get("tool_calls") or ():
        if isinstance(call, Mapping):
            size += len(str(call.get("name") or "")) + len(dumps(call.get("arguments") or {}))
    return size


def _turns(messages: Sequence[M]) -> list[list[M]]:
    turns: list[list[M]] = []
    for message in messages:
        if not turns or message.get("role") == "user":
            turns.append([])
        turns[-1].append(message)
    return turns


def _rounds(turn: Sequence[M]) -> tuple[list[M], list[list[M]]]:
    """A turn's head (its user message and what comes before its first assistant message)
    and its rounds (each an assistant message and the messages up to the next one)."""
    head: list[M] = []
    rounds: list[list[M]] = []
    for message in turn:
        if message.get("role") == "assistant":
            rounds.append([])
        (rounds[-1] if rounds else head).append(message)
    return head, rounds


def _over(count: int, chars: int, max_messages: int | None, max_chars: int | None) -> bool:
    return (max_messages is not None and count > max_messages) or (max_chars is not None and chars > max_chars)


def _trim_turn(turn: list[M], max_messages: int | None, max_chars: int | None) -> list[M]:
    """The current turn without its oldest rounds, its head and latest round always kept."""
    head, rounds = _rounds(turn)
    if len(rounds) < 2:
        return turn
    kept = [*head, *rounds[-1]]
    first = _first_that_fits(rounds, len(kept), sum(map(message_chars, kept)), max_messages, max_chars)
    return [*head, *(m for r in rounds[first:] for m in r)]


def _first_that_fits(
    groups: Sequence[Sequence[M]], count: int, chars: int, max_messages: int | None, max_chars: int | None
) -> int:
    """The first of ``groups`` kept when the last one is kept anyway (its ``count`` messages
    and ``chars`` characters with what else is kept) and the others newest first while the
    bounds hold: the first that does not fit goes with every one before it."""
    first_kept = len(groups) - 1
    for i in range(len(groups) - 2, -1, -1):
        count += len(groups[i])
        chars += sum(message_chars(m) for m in groups[i])
        if _over(count, chars, max_messages, max_chars):
            break
        first_kept = i
    return first_kept


def trim_history(
    messages: Sequence[M],
    *,
    max_messages: int | None = None,
    max_chars: int | None = None,
    trim_current_turn: bool = False,
) -> list[M]:
    """``messages`` without their oldest whole turns, so that what follows the system
    prompt holds at most ``max_messages`` messages and ``max_chars`` characters
    (:func:`message_chars`), the current turn excepted (see the module doc); with
    ``trim_current_turn``, a current turn over the bounds on its own loses its oldest tool
    rounds too (its user message and latest round always stay).

    None bounds nothing; with both None the messages come back as they are (a new list
    of the same objects). Deterministic: the same messages give the same result.
    """
    head = 0
    while head < len(messages) and messages[head].get("role") == "system":
        head += 1
    turns = _turns(messages[head:])
    if not turns or (max_messages is None and max_chars is None):
        return list(messages)
    current = turns[-1]
    count, chars = len(current), sum(message_chars(m) for m in current)
    if trim_current_turn and _over(count, chars, max_messages, max_chars):
        return [*messages[:head], *_trim_turn(current, max_messages, max_chars)]
    first_kept = _first_that_fits(turns, count, chars, max_messages, max_chars)
    return [*messages[:head], *(m for turn in turns[first_kept:] for m in turn)]
