"""One durable model call: stream, classify errors, retry with a logged backoff, log the answer.

The session driver hands each ``CallModel`` action of the planner to :func:`call_model`,
which makes ONE try and logs what came of it, then returns; the driver asks the
planner again. So a first run and a run after a crash take the same path:

* success: the response (with its ``finish_reason``) and, when the model reports it,
  its usage are appended in one atomic batch, before any tool runs (SPEC 5.7), with
  whatever the caller's ``along`` adds to that append (the driver: the batch's
  ``harness.tool.started`` records, or the end of the turn after a final answer). A
  truncated response (``finish_reason="length"``) is logged like any other; the
  planner then gives each of its calls the truncated-call error instead of running it.
* a transient error (429, 5xx, timeout, connection reset, a stream cut half-way) with
  retries left: a ``harness.model.retry`` record is appended BEFORE the backoff wait,
  holding the retry count and the time the wait ends. The planner's next ``CallModel``
  carries both, and this function waits until then, so a process that dies during the
  backoff is followed by one that resumes with the same count and the same deadline.
* any other error, or no retries left: the turn fails with code ``model_error`` and the
  provider's message (session secrets removed; adapters remove their credentials); a
  request refused as longer than the context window (``ContextTooLong``) fails it at once
  with code ``context_too_long``, one over the provider's size limit (``RequestTooLarge``,
  HTTP 413) with ``request_too_large``, the message saying how to fix it. An answer that
  came back but cannot be logged (a text the log cannot hold; or, in the driver, an append
  over the log's record limit) still has its usage logged, with the turn's end.

What the model is sent is the log's conversation, bounded by the harness's ``history``
policy when it has one (:mod:`harness.replay.history`); the log itself keeps everything.

Text deltas of a streamed answer go to ``publish`` as :class:`~harness.live.LiveEvent`
objects, never to the log.

The first model call of a turn runs beside the turn's ``harness.turn.started``
(``start``, :mod:`harness.runtime.turn_start`): an answer within ``RIDE_S`` is logged in
one append with it; otherwise the start is appended alone and awaited as soon as the
model answered (or failed), before anything is logged or checked, and its failure
cancels the call at once.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from harness.clock import Clock
from harness.definition import Durability, Harness
from harness.errors import ContextTooLong, ModelError, StepValueError
from harness.ids import id_problem, model_call_id
from harness.jsonvalues import INT64_MAX, check_text, json_copy, storable_text
from harness.live.events import LiveEvent
from harness.models.base import ModelResponse, ToolCall, Usage, call_complete, thinking_copy
from harness.observability import metrics
from harness.records import ModelResponseRecord, ModelRetry, ModelUsage, Record
from harness.replay import CallModel, SessionState, conversation, trim_history
from harness.runtime.arguments import refuse_secret_arguments
from harness.runtime.turn_start import RIDE_S, TurnStart
from harness.secrets import SecretScrubber

__all__ = ["ErrorVerdict", "ModelRetrier", "backoff_seconds", "call_model", "classify_error", "model_messages"]

T = TypeVar("T")

log = logging.getLogger("harness.model")

Commit = Callable[[list[Record]], Awaitable[None]]
Fail = Callable[[str, str, list[Record]], Awaitable[None]]
"""Fail the turn: code, message, and records for the same append (the usage of an answer
that came back but cannot be logged)."""
Publish = Callable[[LiveEvent], None]
CheckName = Callable[[str, str], None]
Along = Callable[[list[Record]], list[Record]]
"""The records of a successful answer -> more records for the same append."""


@dataclass(frozen=True, slots=True)
class ErrorVerdict:
    """How a failed model call is treated."""

    transient: bool
    message: str
    status: int | None = None
    retry_after: float | None = None
    kind: str | None = None
    code: str = "model_error"
    """The code of the turn it fails (when permanent or out of retries)."""


def classify_error(exc: BaseException) -> ErrorVerdict:
    """Transient or permanent: a ``ModelError`` says so itself; a bare timeout or a
    connection error is transient; anything else (a bug in a model, a bad value) is not.
    A ``ContextTooLong`` is permanent, with the turn's code its own (``context_too_long``;
    ``request_too_large`` for its subclass ``RequestTooLarge``)."""
    if isinstance(exc, ContextTooLong):
        return ErrorVerdict(False, exc.message, exc.status, exc.retry_after, exc.kind, code=exc.code)
    if isinstance(exc, ModelError):
        return ErrorVerdict(exc.transient, exc.message, exc.status, exc.retry_after, exc.kind)
    if isinstance(exc, TimeoutError):
        return ErrorVerdict(True, f"the model call timed out: {exc}".rstrip(": "), kind="timeout")
    if isinstance(exc, ConnectionError):
        return ErrorVerdict(True, f"{type(exc).__name__}: {exc}", kind="connection")
    return ErrorVerdict(False, f"{type(exc).__name__}: {exc}")


def backoff_seconds(
    retry: int, durability: Durability, retry_after: float | None, rng: random.Random
) -> float:
    """The wait before retry number ``retry`` (1 = first).

    ``Retry-After`` when the provider gave one above 0; else exponential backoff with
    jitter: ``model_backoff * 2**(retry-1)``, capped at ``model_backoff_max``, and a wait
    drawn between half and all of that. Never more than ``model_backoff_max``. A
    ``Retry-After`` of 0 (or a date already past) gets the backoff, as the providers' own
    SDKs do: taken as "now", every retry of an overloaded provider went at once.
    """
    cap = durability.model_backoff_max.total_seconds()
    if retry_after is not None and retry_after > 0:
        return min(retry_after, cap)
    base = min(durability.model_backoff.total_seconds() * 2 ** (retry - 1), cap)
    return rng.uniform(base / 2, base)


def model_messages(harness: Harness, state: SessionState, *, starting: str | None = None) -> list[dict[str, Any]]:
    """What the model is sent: the system prompt, then the conversation the log holds
    (``starting``: the message whose turn is being started, see ``conversation``), its
    oldest turns dropped as the harness's ``history`` policy says (when it has one)."""
    messages: list[dict[str, Any]] = []
    if harness.system_prompt:
        messages.append({"role": "system", "content": harness.system_prompt})
    messages.extend(conversation(state, starting=starting))
    if harness.history is not None:
        messages = trim_history(
            messages,
            max_messages=harness.history.max_messages,
            max_chars=harness.history.max_chars,
            trim_current_turn=harness.history.trim_current_turn,
        )
    return messages


async def _beside(answer: Coroutine[Any, Any, ModelResponse], start: TurnStart) -> asyncio.Future[ModelResponse]:
    """Run the model call ``answer`` beside the turn's ``start``.

    Returns the call's future, done, once the start is in the log: with the answer when
    the call succeeded within ``RIDE_S`` (the caller then appends both at once), else on
    its own, appended alone and awaited. The start's failure raises here and cancels
    the call (whose outcome then matters to nobody).
    """
    task = asyncio.ensure_future(answer)
    try:
        await asyncio.wait([task], timeout=RIDE_S)
        if task.done() and not task.cancelled() and task.exception() is None:
            return task  # rides: the caller appends the start with the answer
        started: asyncio.Future[Any] = start.alone()
        await asyncio.wait([task, started], return_when=asyncio.FIRST_COMPLETED)
        if not started.done():
            await asyncio.wait([started])  # the answer waits until its turn is in the log
        started.result()
        if not task.done():
            await asyncio.wait([task])
    except BaseException:
        task.cancel()
        raise
    return task


class _Deltas:
    """The stream sink given to the model: redacts, numbers and publishes each delta live.

    The session's secrets are redacted as in the log. A secret may arrive split over
    two deltas, so the end of the text that could still grow into one is held back
    until the next delta (or the end) shows it cannot; the deltas joined are exactly
    the text the log keeps.
    """

    def __init__(
        self,
        session_id: str,
        action: CallModel,
        clock: Clock,
        publish: Publish | None,
        scrubber: SecretScrubber,
        secrets: Mapping[str, str],
        state: SessionState | None = None,
    ) -> None:
        self._session_id = session_id
        self._action = action
        self._clock = clock
        self._publish = publish
        self._scrubber = scrubber
        self._secrets = [v for v in secrets.values() if v]
        self._pending = ""
        self._state = state
        self._held: list[str] | None = None
        self.position = 0

    def hold_until(self, started: asyncio.Future[None]) -> None:
        """Publish nothing until ``started`` (the turn's ``harness.turn.started`` append)
        settles: then what came meanwhile, in order (dropped if the start failed). Live
        text of a turn never comes before its start is in the log, whichever model
        answers how fast (a quick answer riding with the start: :meth:`drop_held`)."""
        self._held = []

        def landed(done: asyncio.Future[None]) -> None:
            held, self._held = self._held or [], None
            if not done.cancelled() and done.exception() is None:
                for text in held:
                    self._emit(text)

        started.add_done_callback(landed)

    def drop_held(self) -> None:
        """The answer rides with the turn's start: its text is logged with it whole, so
        the held deltas are dropped (else they would come after the response that holds them)."""
        if self._held is not None:
            self._held.clear()

    def __call__(self, text: str) -> None:
        if not isinstance(text, str) or not text:
            return
        if not self._secrets:
            self._emit(text)
            return
        redacted = self._scrubber.redact_text(self._pending + text)
        hold = max((k for s in self._secrets for k in range(1, len(s)) if redacted.endswith(s[:k])), default=0)
        self._pending = redacted[len(redacted) - hold:] if hold else ""
        self._emit(redacted[: len(redacted) - hold])

    def flush(self) -> None:
        """The answer is complete: what was held back cannot become a secret any more."""
        pending, self._pending = self._pending, ""
        self._emit(self._scrubber.redact_text(pending))

    def _emit(self, text: str) -> None:
        if not text:
            return
        if self._held is not None:
            self._held.append(text)
            return
        position, self.position = self.position, self.position + len(text)
        if self._publish is None:
            return
        event = LiveEvent(
            session_id=self._session_id,
            turn=self._action.turn,
            index=self._action.index,
            retry=self._action.retries,
            position=position,
            text=text,
            ts=round(self._clock.now() * 1000),
            # (what the log holds now, the turn's start at least: readers show this after it)
            after=self._state.last_seq if self._state is not None and self._state.last_seq >= 0 else None,
        )
        try:
            self._publish(event)
        except Exception:  # live delivery is best effort; the answer goes on
            log.debug("a live event could not be published", exc_info=True)


def _response_records(
    session_id: str,
    state: SessionState,
    action: CallModel,
    response: ModelResponse,
    now: int,
    scrubber: SecretScrubber,
    check_name: CheckName | None,
) -> list[Record]:
    """The records of a completed answer; raises (the call fails) on a value the log
    cannot hold or a tool call id holding a session secret (a usable id is never
    rewritten: one that is no usable id, or repeated, is renamed before anything is logged)."""
    if response.text is not None:
        check_text(response.text, what="the model's text")
    problem = _usage_problem(response.usage)
    if problem is not None:
        raise StepValueError(f"the model's {problem}")
    thinking = thinking_copy(response.thinking)  # (secrets are replaced in it as in the text, when committed)
    for pos, block in enumerate(thinking):
        for key, value in block.items():
            check_text(value, what="the model's thinking", path=f"$[{pos}].{key}")
    seen = set(state.calls)
    calls = []
    if not isinstance(response.tool_calls, Sequence) or isinstance(response.tool_calls, str):
        raise StepValueError(f"the model's tool_calls is a {type(response.tool_calls).__name__}, not a list: "
                             "answer ModelResponse(tool_calls=[ToolCall(id=..., name=..., arguments={...})])")
    for pos, call in enumerate(response.tool_calls):
        if not isinstance(call, ToolCall):  # (a model of the user's own: say what, not an AttributeError)
            raise StepValueError(f"the model's tool_calls[{pos}] is a {type(call).__name__}, not a ToolCall: "
                                 "answer ModelResponse(tool_calls=[ToolCall(id=..., name=..., arguments={...})])")
        # An id that is no usable id (empty, a newline ...) or is repeated is renamed here, once:
        # the logged response holds the new one (a usable id holding a secret is refused).
        call_id = model_call_id(call.id, f"{action.turn}.{action.index}.{pos}", seen)
        if check_name is not None and id_problem(call.id, "tool call id") is None:  # the model's id is kept
            check_name("tool call id", call.id)
        check_text(call.name, what="a tool call's name")
        seen.add(call_id)
        calls.append({"id": call_id, "name": call.name, "arguments": json_copy(call.arguments, what="tool arguments")})
    finish = response.finish_reason if isinstance(response.finish_reason, str) else None
    records: list[Record] = [
        ModelResponseRecord(session_id, now, action.turn, action.index, response.text, tuple(calls), finish, thinking)
    ]
    # A call whose arguments hold a session secret never runs (SPEC 7.6): its logged
    # arguments are redacted with the rest of the record, and its result is the
    # refusal, in the same append. (A truncated response's calls never run anyway.)
    if finish != "length":
        records.extend(refuse_secret_arguments(session_id, now, calls, scrubber))
    records.extend(_usage_records(session_id, action, response, now))
    return records


def _usage_problem(usage: object) -> str | None:
    """What makes ``usage`` (an answer's ``ModelResponse.usage``) unfit for its record, or None."""
    if usage is None:
        return None
    if not isinstance(usage, Usage):
        return f"usage must be a harness.models.Usage or None, not {type(usage).__name__}"
    for field in ("input_tokens", "output_tokens"):
        value = getattr(usage, field)
        whole = isinstance(value, int) and not isinstance(value, bool)
        if not (whole or (isinstance(value, float) and math.isfinite(value))) or not abs(value) <= INT64_MAX:
            return f"usage.{field} must be a whole number of tokens, not {value!r:.40}"
    cost = usage.cost
    if cost is not None and (isinstance(cost, bool) or not isinstance(cost, int | float) or not math.isfinite(cost)):
        return f"usage.cost must be a number of dollars or None, not {cost!r:.40}"
    if usage.model is not None and not (isinstance(usage.model, str) and storable_text(usage.model) == usage.model):
        return f"usage.model must be a string (the model's name) or None, not {usage.model!r:.60}"
    return None


def _usage_records(session_id: str, action: CallModel, response: ModelResponse, now: int) -> list[ModelUsage]:
    """The ``harness.model.usage`` record of an answer that reports its usage (else none).

    Logged with the answer; and also when the answer itself is refused (too large for the
    log, a text it cannot hold): the provider was paid for those tokens all the same."""
    usage = response.usage
    if usage is None or _usage_problem(usage) is not None:  # (an unreadable one: not known)
        return []
    return [
        ModelUsage(
            session_id, now, action.turn, action.index,
            model=str(usage.model) if usage.model is not None else None,
            input_tokens=max(0, int(usage.input_tokens)),
            output_tokens=max(0, int(usage.output_tokens)),
            cost=float(usage.cost) if usage.cost is not None else None,
        )
    ]


async def call_model(
    action: CallModel,
    *,
    harness: Harness,
    state: SessionState,
    session_id: str,
    secrets: Mapping[str, str],
    scrubber: SecretScrubber,
    clock: Clock,
    commit: Commit,
    fail: Fail,
    publish: Publish | None = None,
    check_name: CheckName | None = None,
    rng: random.Random | None = None,
    starting: str | None = None,
    start: TurnStart | None = None,
    along: Along | None = None,
) -> None:
    """Make one try of the model call ``action`` names and log its outcome (see the module doc).

    Only the log's errors (and cancellation) escape: every failure of the model
    becomes a retry record or a failed turn.

    Args:
        starting: the input id of the message whose turn this call starts, when its
            ``harness.turn.started`` is not folded yet (its user message is sent).
        start: that turn's start, not in the log yet: it rides with a quick answer,
            else it is appended alone and awaited before anything is logged.
        along: more records for the append of a successful answer.
    """
    if action.not_before is not None:
        await clock.sleep_until(action.not_before / 1000)  # the logged backoff, even after a crash
    messages = model_messages(harness, state, starting=starting)
    specs = [t.definition.spec() for t in harness.tools.values()]
    sink = _Deltas(session_id, action, clock, publish, scrubber, secrets, state)
    if start is not None:
        sink.hold_until(start.done)
    began = time.perf_counter()
    answer = call_complete(
        harness.model, messages, specs, keywords=harness.model_keywords, stream=sink, secrets=secrets
    )
    response: ModelResponse | None = None
    try:
        if start is not None:
            response = (await _beside(answer, start)).result()
        else:
            response = await answer
        records = _response_records(
            session_id, state, action, response, round(clock.now() * 1000), scrubber, check_name
        )
        sink.flush()
    except Exception as exc:  # a model failure is retried or fails the turn, never the owner
        if start is not None:
            started = start.alone()  # (an answer the log cannot hold: its start goes alone)
            if not started.done():
                await asyncio.wait([started])
            if started.cancelled() or started.exception() is not None:
                raise  # the turn's start failed: the log's error, not the model's
        # An answer that came back but cannot be logged was paid for: its usage is logged
        # with the failure (what _response_records refuses is permanent: no retry).
        used = _usage_records(session_id, action, response, round(clock.now() * 1000)) if response is not None else []
        _metered(harness.name, began, used)
        await _failed(action, exc, harness.durability, session_id, scrubber, clock, commit, fail, rng, used)
        return
    _metered(harness.name, began, [r for r in records if isinstance(r, ModelUsage)])
    if along is not None:
        records.extend(along(records))
    if start is not None and not start.issued:
        sink.drop_held()
        await start.with_answer(records)  # [turn.started, the answer's records] in one append
    else:
        await commit(records)


def _metered(harness: str, began: float, used: list[ModelUsage]) -> None:
    metrics.model_call(
        harness, time.perf_counter() - began,
        input_tokens=sum(u.input_tokens for u in used), output_tokens=sum(u.output_tokens for u in used),
    )


async def _failed(
    action: CallModel,
    exc: Exception,
    durability: Durability,
    session_id: str,
    scrubber: SecretScrubber,
    clock: Clock,
    commit: Commit,
    fail: Fail,
    rng: random.Random | None,
    used: list[ModelUsage] | None = None,
) -> None:
    verdict = classify_error(exc)
    message = scrubber.redact_text(verdict.message)
    if verdict.transient and action.retries < durability.model_retries:
        retry = action.retries + 1
        wait = backoff_seconds(retry, durability, verdict.retry_after, rng or random.Random())
        wait_until = round((clock.now() + wait) * 1000)
        log.info(
            "session %s: model call %s.%s failed (%s); retry %d of %d in %.1f s",
            session_id, action.turn, action.index, message, retry, durability.model_retries, wait,
        )
        await commit(
            [
                *(used or ()),
                ModelRetry(
                    session_id, round(clock.now() * 1000), action.turn, action.index, retry, wait_until,
                    message, verdict.status, verdict.kind,
                )
            ]
        )
        return
    if verdict.transient:
        message = f"the model call failed {action.retries + 1} times (durability.model_retries={durability.model_retries}); last: {message}"
    log.warning("session %s: model call %s.%s failed: %s", session_id, action.turn, action.index, message)
    await fail(verdict.code, message, list(used or ()))


class ModelRetrier:
    """Model calls retried on transient errors with :func:`backoff_seconds`, the count kept
    in memory only: for the calls that are not a session's own (plain ``chat()``, a
    sub-agent's call inside a step), whose retries no record holds."""

    def __init__(self, durability: Durability, clock: Clock | None, scrubber: SecretScrubber) -> None:
        self._durability = durability
        self._scrubber = scrubber
        self._clock = clock
        self._rng = random.Random()

    async def call(self, make: Callable[[], Awaitable[T]]) -> T:
        """``await make()``, made again after each transient error until the retries run out."""
        retry = 0
        while True:
            try:
                return await make()
            except Exception as exc:
                verdict = classify_error(exc)
                if not verdict.transient or retry >= self._durability.model_retries:
                    raise
                retry += 1
                wait = backoff_seconds(retry, self._durability, verdict.retry_after, self._rng)
                log.warning(
                    "model call failed (%s); retry %d of %d in %.1f s",
                    self._scrubber.redact_text(verdict.message), retry, self._durability.model_retries, wait,
                )
                if self._clock is None:
                    await asyncio.sleep(wait)
                else:
                    await self._clock.sleep_until(self._clock.now() + wait)
