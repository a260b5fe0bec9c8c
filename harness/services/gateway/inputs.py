"""Sending inputs for the API: judge, write once, answer with a receipt derived from the log.

The gateway never drives a turn: it only appends input records (``log.submit``)
that the session's owner takes. What it can judge without the owner it judges
before writing (the harness name, an answer against the open ask's schema, a
cancel of an unknown input), so a bad request is refused at once with a reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Collection
from typing import Any

from harness.context import check_app_records
from harness.errors import HarnessError, LogError
from harness.jsonvalues import json_copy
from harness.log.base import SessionLog
from harness.records import InputAnswer, InputMessage, InputRecords, Record
from harness.runtime.answers import judge_answer, waiting_answers
from harness.services.gateway.receipts import Receipt, receipt_for, rejected
from harness.services.gateway.sessions import Sessions, SessionView
from harness.services.gateway.settlement import RUNNING, Settlement, answer_settlement_of, settlement_of

__all__ = ["CANCEL_SUPPORTED", "Inputs", "cancel_input_id", "make_cancel"]


def make_cancel(session_id: str, ts: int, input_id: str, target: str) -> Record | None:
    """The cancel input record for ``target``, or None while the log has no such record type.

    Switch: once ``harness.records`` has the cancel input, return it here.
    """
    from harness import records

    cls = getattr(records, "InputCancel", None)
    if cls is None:
        return None
    record: Record = cls(session_id, ts, input_id, target)
    return record


CANCEL_SUPPORTED = make_cancel("s", 0, "c", "t") is not None


def cancel_input_id(target: str) -> str:
    """The id of the cancel input of ``target`` (one per target, so a repeat is idempotent)."""
    return f"cancel:{target}"


class Inputs:
    """Receipts for messages, answers, records and cancels of one log.

    Args:
        log: where inputs are appended.
        sessions: the sessions as read so far (records and folded state, caught up).
        harness_names: the harnesses this deployment runs (empty: not known here, the
            owner judges the name).
        now_ms: the clock (ms since the epoch).
    """

    def __init__(
        self,
        log: SessionLog,
        sessions: Sessions,
        *,
        harness_names: Collection[str] = (),
        now_ms: Callable[[], int] | None = None,
    ) -> None:
        self.log = log
        self.sessions = sessions
        self.harness_names = frozenset(harness_names)
        self.now_ms = now_ms or (lambda: int(time.time() * 1000))

    async def _send(self, view: SessionView, record: Record, input_id: str) -> Receipt:
        """Write ``record`` unless its id is already in the log; the receipt either way."""
        known = receipt_for(view.entries, input_id, record)
        if known is not None:
            return known
        try:
            written = await self.log.submit(record)
        except LogError:
            raise
        except (HarnessError, ValueError, UnicodeError, OverflowError) as exc:
            return rejected(input_id, "invalid_input", f"the input cannot be stored: {exc}")
        view = await self.sessions.get_through(record.session_id, written.seq)  # the input is in it
        found = receipt_for(view.entries, input_id, record)
        return found if found is not None else Receipt(input_id, "accepted", position=written.seq)

    async def message(self, session_id: str, text: str, harness: str | None, input_id: str) -> Receipt:
        view = await self.sessions.get(session_id)
        state = view.state
        name = harness or state.harness
        record = InputMessage(session_id, self.now_ms(), input_id, text, harness if harness else None)
        known = receipt_for(view.entries, input_id, record)
        if known is not None:
            return known
        if name is None:
            return rejected(input_id, "unknown_harness", "a new session needs 'harness': the name of the harness to run")
        if state.harness is not None and harness and harness != state.harness:
            return rejected(input_id, "harness_mismatch",
                            f"this session runs harness {state.harness!r}, not {harness!r}")
        if self.harness_names and name not in self.harness_names:
            return rejected(input_id, "unknown_harness",
                            f"no harness named {name!r} runs here; known: {', '.join(sorted(self.harness_names))}")
        return await self._send(view, record, input_id)

    async def wait(self, session_id: str, input_id: str, seconds: float, *, answer: bool = False) -> Settlement:
        """How ``input_id``'s turn ended, or that it waits for a person, once either is in the
        log; ``RUNNING`` if neither is within ``seconds`` (the turn goes on all the same).
        ``answer``: ``input_id`` is an answer: its refusal, or the turn it resumed."""
        judge = answer_settlement_of if answer else settlement_of
        try:
            async with asyncio.timeout(seconds):
                async with contextlib.aclosing(self.sessions.changes(session_id)) as views:
                    async for view in views:
                        found = judge(view.state, input_id, now_ms=self.now_ms())
                        if found is not None:
                            return found
        except TimeoutError:
            pass
        return RUNNING

    async def answer(self, view: SessionView, tool_call_id: str, name: str, value: Any, input_id: str) -> Receipt:
        try:
            value = json_copy(value, what="answer")
        except HarnessError as exc:
            return rejected(input_id, "invalid_answer", str(exc))
        record = InputAnswer(view.session_id, self.now_ms(), input_id, tool_call_id, name, value)
        known = receipt_for(view.entries, input_id, record)
        if known is not None and known.code != "input_conflict":
            return known
        verdict = judge_answer(view.state, tool_call_id, name, value, self.now_ms())
        if not verdict.ok:  # (a second answer to an answered ask: already_answered, not a conflict of ids)
            return rejected(input_id, verdict.code or "invalid_answer", verdict.reason or "the answer was refused")
        waiting = waiting_answers(view.state).get((tool_call_id, name))
        if waiting is not None:
            return rejected(input_id, "answer_waiting", f"the answer {waiting} to this ask waits for the session's "
                            "worker to take it")
        if known is not None:
            return known
        return await self._send(view, record, input_id)

    async def records(self, view: SessionView, records: list[Any], input_id: str) -> Receipt:
        try:
            checked = check_app_records(records)
        except HarnessError as exc:
            return rejected(input_id, "invalid_records", str(exc))
        record = InputRecords(view.session_id, self.now_ms(), input_id, checked)
        return await self._send(view, record, input_id)

    async def cancel(self, view: SessionView, target: str) -> Receipt:
        input_id = cancel_input_id(target)
        record = make_cancel(view.session_id, self.now_ms(), input_id, target)
        if record is not None:
            known = receipt_for(view.entries, input_id, record)
            if known is not None:
                return known
        inp = view.state.inputs.get(target)
        if inp is None:
            return rejected(input_id, "unknown_input", f"no input {target!r} in this session")
        if inp.settled is not None:
            return rejected(input_id, "already_settled", f"input {target!r} already settled {inp.settled.outcome}")
        if record is None:
            return rejected(input_id, "cancel_unsupported",
                            "this version of the session log has no cancel input; upgrade the harness")
        return await self._send(view, record, input_id)
