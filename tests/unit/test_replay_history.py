"""The history policy's trimming (harness.replay.history): pure, over chat-completions messages."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from harness import History, define_harness
from harness.errors import DefinitionError
from harness.models import ScriptedModel
from harness.replay.history import message_chars, trim_history

SYSTEM = {"role": "system", "content": "Be brief."}


def turn(n: int, *, calls: int = 0) -> list[dict[str, Any]]:
    """Turn ``n``: a user message, then ``calls`` tool calls with their results, then the answer."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": f"question {n}"}]
    if calls:
        ids = [f"c{n}.{i}" for i in range(calls)]
        messages.append({"role": "assistant", "content": "", "tool_calls": [
            {"id": cid, "name": "lookup", "arguments": {"q": cid}} for cid in ids]})
        messages.extend({"role": "tool", "tool_call_id": cid, "name": "lookup", "content": '"ok"',
                         "is_error": False} for cid in ids)
    messages.append({"role": "assistant", "content": f"answer {n}"})
    return messages


def conversation(*turns: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [SYSTEM, *(m for t in turns for m in t)]


def user_texts(messages: list[dict[str, Any]]) -> list[str]:
    return [m["content"] for m in messages if m["role"] == "user"]


def assert_calls_paired(messages: list[dict[str, Any]]) -> None:
    """Every tool result follows the assistant message that made its call, and every call has its result."""
    made: set[str] = set()
    answered: set[str] = set()
    for m in messages:
        if m["role"] == "assistant":
            made |= {c["id"] for c in m.get("tool_calls", ())}
        if m["role"] == "tool":
            assert m["tool_call_id"] in made, f"result of {m['tool_call_id']} without its call"
            answered.add(m["tool_call_id"])
    assert made == answered


def test_no_bound_sends_everything():
    messages = conversation(turn(1), turn(2))
    assert trim_history(messages) == messages


def test_oldest_whole_turns_go_first_and_the_system_prompt_stays():
    messages = conversation(turn(1), turn(2), turn(3), [{"role": "user", "content": "question 4"}])
    out = trim_history(messages, max_messages=4)
    assert out[0] == SYSTEM
    assert user_texts(out) == ["question 3", "question 4"]  # 1 + 2 = 3 fits, one more turn (2) does not
    assert out == [SYSTEM, *turn(3), {"role": "user", "content": "question 4"}]
    assert user_texts(trim_history(messages, max_messages=5)) == ["question 2", "question 3", "question 4"]
    assert trim_history(messages, max_messages=2) == [SYSTEM, {"role": "user", "content": "question 4"}]


def test_a_tool_call_is_never_sent_without_its_results():
    messages = conversation(turn(1, calls=2), turn(2, calls=3), turn(3, calls=1), turn(4))
    for bound in range(1, len(messages) + 1):
        out = trim_history(messages, max_messages=bound)
        assert_calls_paired(out)
        assert out[1]["role"] == "user"  # what follows the system prompt starts a turn
        assert len(out) - 1 <= max(bound, len(turn(4)))


def test_the_current_turn_is_sent_whole_even_over_the_bounds():
    current = turn(9, calls=4)[:-1]  # a turn in progress: its calls answered, no final answer yet
    messages = conversation(turn(1), current)
    assert trim_history(messages, max_messages=1, max_chars=1) == [SYSTEM, *current]


def test_max_chars_counts_text_arguments_and_results():
    assert message_chars({"role": "user", "content": "hello"}) == 5
    call = {"role": "assistant", "content": "ok", "tool_calls": [{"id": "x", "name": "lookup", "arguments": {"q": 1}}]}
    assert message_chars(call) == 2 + len("lookup") + len('{"q":1}')
    long_turn = [{"role": "user", "content": "x" * 1000}, {"role": "assistant", "content": "y" * 1000}]
    messages = conversation(long_turn, turn(2), turn(3))
    small = sum(message_chars(m) for m in turn(2) + turn(3))
    assert user_texts(trim_history(messages, max_chars=small)) == ["question 2", "question 3"]
    assert user_texts(trim_history(messages, max_chars=small - 1)) == ["question 3"]
    assert trim_history(messages, max_chars=small + 2000) == messages


def test_both_bounds_hold_together():
    messages = conversation(turn(1), turn(2), turn(3))
    assert user_texts(trim_history(messages, max_messages=100, max_chars=sum(map(message_chars, turn(3))))) == [
        "question 3"]
    assert user_texts(trim_history(messages, max_messages=2, max_chars=10**6)) == ["question 3"]


def test_a_kept_turn_is_never_followed_by_a_gap():
    """The first turn that does not fit is dropped with every turn before it, even when an
    older one would fit: the model never sees a history with holes."""
    big = [{"role": "user", "content": "x" * 500}, {"role": "assistant", "content": "y"}]
    messages = conversation(turn(1), big, turn(3))
    assert user_texts(trim_history(messages, max_chars=100)) == ["question 3"]


def test_trimming_is_deterministic_and_changes_nothing_it_is_given():
    messages = conversation(turn(1, calls=2), turn(2), turn(3, calls=1))
    before = copy.deepcopy(messages)
    first = trim_history(messages, max_messages=6, max_chars=200)
    again = trim_history(copy.deepcopy(messages), max_messages=6, max_chars=200)
    assert json.dumps(first) == json.dumps(again)
    assert messages == before


def test_no_system_prompt_and_messages_before_the_first_user_message():
    greeting = [{"role": "assistant", "content": "Hi! How can I help?"}]
    messages = [*greeting, *turn(1), *turn(2)]
    assert trim_history(messages, max_messages=len(turn(2))) == turn(2)
    assert trim_history(messages, max_messages=100) == messages
    assert trim_history([], max_messages=1) == []
    assert trim_history([SYSTEM], max_messages=1) == [SYSTEM]


def test_history_is_checked_when_the_harness_is_defined():
    model = ScriptedModel([])
    assert define_harness(name="t/h", model=model).history is None
    assert define_harness(name="t/h", model=model, history={"max_messages": 40}).history == History(max_messages=40)
    with pytest.raises(DefinitionError, match="bounds nothing"):
        History()
    with pytest.raises(DefinitionError, match=r"history\.max_chars must be a whole number"):
        History(max_chars=0)
    with pytest.raises(DefinitionError, match=r"history\.max_messages must be a whole number"):
        History(max_messages=True)
    with pytest.raises(DefinitionError, match="has no field 'max_tokens'"):
        define_harness(name="t/h", model=model, history={"max_tokens": 1000})
    with pytest.raises(DefinitionError, match="takes history= as History"):
        define_harness(name="t/h", model=model, history=40)
    with pytest.raises(DefinitionError, match=r"^harness 't/h': history\.max_messages must be a whole number"):
        define_harness(name="t/h", model=model, history={"max_messages": 0})  # a dict's value: says whose


def test_thinking_blocks_do_not_count_for_max_chars():
    """(The provider drops earlier turns' reasoning from the context window itself.)"""
    plain = {"role": "assistant", "content": "ok"}
    reasoned = {**plain, "thinking": [{"type": "thinking", "thinking": "x" * 10_000, "signature": "s"}]}
    assert message_chars(reasoned) == message_chars(plain) == 2


# -- trim_current_turn: a long tool loop (an agent_tool sub-agent's run is one turn) -------------------


def tool_loop(rounds: int, *, size: int = 10) -> list[dict[str, Any]]:
    """One turn in progress: a prompt, then ``rounds`` rounds of one call and its result each."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "research kafka"}]
    for r in range(rounds):
        messages.append({"role": "assistant", "content": "", "tool_calls": [
            {"id": f"r{r}", "name": "lookup", "arguments": {"page": r}}]})
        messages.append({"role": "tool", "tool_call_id": f"r{r}", "name": "lookup", "content": "x" * size,
                         "is_error": False})
    return messages


def test_trim_current_turn_drops_the_oldest_rounds_keeping_the_prompt_and_the_latest():
    loop = tool_loop(10)
    messages = conversation(turn(1), loop)
    out = trim_history(messages, max_messages=7, trim_current_turn=True)
    assert out == [SYSTEM, loop[0], *loop[-6:]]  # the prompt, then the 3 latest rounds (an older turn: gone)
    assert_calls_paired(out)
    round_chars = sum(message_chars(m) for m in loop[1:3])
    out = trim_history(messages, max_chars=message_chars(loop[0]) + 4 * round_chars, trim_current_turn=True)
    assert out == [SYSTEM, loop[0], *loop[-8:]]
    # the prompt and the latest round are sent even when they alone are over the bounds
    assert trim_history(messages, max_messages=1, max_chars=1, trim_current_turn=True) == [SYSTEM, loop[0], *loop[-2:]]
    # (without it, the current turn is sent whole, as ever)
    assert trim_history(messages, max_messages=7) == [SYSTEM, *loop]


def test_trim_current_turn_changes_nothing_while_the_current_turn_fits():
    messages = conversation(turn(1, calls=2), turn(2), tool_loop(2))
    for bound in range(1, 20):
        expected = trim_history(messages, max_messages=bound)
        if len(tool_loop(2)) <= bound:
            assert trim_history(messages, max_messages=bound, trim_current_turn=True) == expected


def test_trim_current_turn_keeps_calls_with_their_results_and_no_holes():
    """Rounds of several calls go whole; a round that does not fit goes with every older one."""
    loop = [*tool_loop(0), *turn(0, calls=3)[1:-1], *tool_loop(1, size=500)[1:], *turn(5, calls=2)[1:-1]]
    messages = [SYSTEM, *loop]
    for bound in range(1, 2000, 7):
        out = trim_history(messages, max_chars=bound, trim_current_turn=True)
        assert_calls_paired(out)
        assert out[:2] == [SYSTEM, loop[0]]
        assert out[2:] == loop[len(loop) - len(out) + 2:]  # a suffix of the turn: no holes
    small = trim_history(messages, max_chars=100, trim_current_turn=True)
    assert small == [SYSTEM, loop[0], *turn(5, calls=2)[1:-1]]  # the big round is dropped with the one before it


def test_trim_current_turn_is_checked():
    assert History(max_chars=10, trim_current_turn=True).trim_current_turn is True
    assert History(max_chars=10).trim_current_turn is False
    with pytest.raises(DefinitionError, match=r"history\.trim_current_turn must be True or False"):
        History(max_chars=10, trim_current_turn="yes")  # type: ignore[arg-type]
