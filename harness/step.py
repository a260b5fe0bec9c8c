"""``ctx.step``: durable steps, sleeps and asks (and their plain-mode twins).

A durable step's value is committed to the session log before ``step.do``
returns (SPEC 2.1); a finished step returns its stored value without calling
``fn`` again (SPEC 2.3). The rules about values (JSON only, size limit, no
secrets) are checked before anything is written, so a refused value leaves no
trace in the log.

A sync ``fn`` never runs on the event loop: it runs on the host's bounded thread
pool (``HarnessHost(sync_threads=)``), so a blocking call does not stop lease
renewals, the Kafka group or the other sessions. In a sync tool (already on a pool
thread) it runs on the tool's own thread. An ``async def`` fn runs on the loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import inspect
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from datetime import datetime, timedelta
from types import FunctionType, MethodType
from typing import Any, Protocol, TypeVar

from pydantic import BaseModel, ValidationError

from harness import ids
from harness.clock import Clock, SystemClock, duration_seconds
from harness.errors import (
    AskExpired,
    DuplicateStepName,
    NaiveDatetime,
    NotDurableError,
    NoToolCallError,
    RecordTooLarge,
    SecretInStepValue,
    StepError,
    StepNotAwaited,
    StepValueError,
    StepValueTooLarge,
)
from harness.jsonvalues import check_text, dumps, json_copy, loads
from harness.observability import metrics
from harness.records import AskOpened, ModelUsage, Record, SleepScheduled, StepResult
from harness.replay.state import CallState
from harness.secrets import SecretScrubber
from harness.sync_pool import lend_thread
from harness.tools import json_schema_problem
from harness.words import with_article

__all__ = ["CallScope", "DurableStep", "HandedSteps", "PlainStep", "SleepDuration", "StepInfo", "SyncStep"]

M = TypeVar("M", bound=BaseModel)
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class StepInfo:
    """Passed to a step's ``fn`` when it takes one argument."""

    idempotency_key: str
    """``<log id>:<tool call id>:<step name>``: the same on every run (SPEC 2.4)."""
    name: str
    tool_call_id: str
    attempt: int


@dataclass(slots=True)
class CallScope:
    """What a durable step needs from the session that runs the call."""

    session_id: str
    tool_call_id: str
    log_id: str
    attempt: int
    call: CallState  # live: the session folds every commit into it
    clock: Clock
    scrubber: SecretScrubber
    value_limit: int
    commit: Callable[[list[Record]], Awaitable[None]]
    wait_answer: Callable[[str, float | None], Awaitable[None]]
    run_sync: RunSync | None = None  # the host's thread pool (None: the loop's default executor)
    ask_models: dict[tuple[str, str], type[BaseModel]] | None = None  # asks' pydantic models, by (call, name)
    harness_name: str = ""  # for metrics (a bounded label)
    # told True when the call starts a durable wait (a sleep; an ask waits through
    # ``wait_answer``) and False when it ends: a draining owner stops such a call at once
    on_wait: Callable[[bool], None] | None = None
    # asked before each new step's fn runs: None to go on, or an awaitable that never
    # ends (a draining owner stops a replay="safe" call there: nothing of it is lost)
    at_boundary: Callable[[], Awaitable[None] | None] | None = None


class RunSync(Protocol):
    """Runs a blocking callable off the event loop and returns its result. ``quick``: a
    call that is usually over at once and never needs the loop while it runs (a sync step
    fn; not a sync tool, whose steps go through the loop), which the loop may wait for a
    moment instead of being woken for (``HarnessHost.run_sync``)."""

    def __call__(self, fn: Callable[[], Any], *, quick: bool = False) -> Awaitable[Any]: ...


async def _default_run_sync(fn: Callable[[], Any], *, quick: bool = False) -> Any:
    return await asyncio.get_running_loop().run_in_executor(None, fn)


def _is_async(fn: Callable[..., Any]) -> bool:
    if type(fn) is FunctionType:  # the common case, read from its code object
        return bool(fn.__code__.co_flags & inspect.CO_COROUTINE)
    while isinstance(fn, functools.partial):
        fn = fn.func
    call = type(fn).__call__ if not inspect.isfunction(fn) and not inspect.ismethod(fn) else None
    return inspect.iscoroutinefunction(fn) or (call is not None and inspect.iscoroutinefunction(call))


def _bare_async(fn: Callable[..., Any]) -> bool:
    """Whether ``fn`` is the common step fn: a plain ``async def`` function or lambda-made
    coroutine function that takes no argument (no StepInfo), without attributes that
    could change its signature (``__wrapped__``, ``__signature__``): it is awaited as it
    is, on the loop (what ``_call_fn`` does for it, without asking three questions)."""
    if type(fn) is not FunctionType or fn.__dict__:
        return False
    code = fn.__code__
    return bool(code.co_flags & _CO_COROUTINE) and code.co_argcount - len(fn.__defaults__ or ()) < 1


_CO_COROUTINE = inspect.CO_COROUTINE


def _ms(seconds: float) -> int:
    return round(seconds * 1000)


SleepDuration = timedelta | int | float
"""What ``step.sleep`` takes as its duration: a timedelta or a number of seconds."""


def _wake_time(now: float, duration: SleepDuration | None, until: datetime | None, call: str | None) -> float:
    """When a sleep of ``duration`` from ``now`` (or ``until``) wakes, in epoch seconds.

    Raises:
        ValueError: both or neither given, or a duration that is not a finite timedelta or
            number of seconds (the caller turns it into a StepError naming the sleep).
        NaiveDatetime: ``until`` has no timezone.
    """
    if (duration is None) == (until is None):
        raise ValueError("step.sleep takes a duration or until=, one of them")
    if until is not None:
        return _to_epoch(until, "until", call)
    return now + duration_seconds(duration, "step.sleep")


def _to_epoch(when: datetime, argument: str, tool_call_id: str | None = None) -> float:
    """Seconds since the epoch of an AWARE datetime; a naive one is refused.

    A naive datetime names no clock: ``datetime.now()`` in New York taken as UTC would
    expire an ask five hours early. So it is refused rather than guessed.
    """
    if not isinstance(when, datetime):
        raise TypeError(f"{argument} must be a datetime with a timezone, not {type(when).__name__}")
    if when.tzinfo is None or when.utcoffset() is None:
        raise NaiveDatetime(
            f"{argument}={when.isoformat()} has no timezone; give an aware datetime, "
            "e.g. datetime.now(UTC) + timedelta(days=1)",
            argument=argument,
            tool_call_id=tool_call_id,
        )
    return when.timestamp()


def _takes_info(fn: Callable[..., Any]) -> bool:
    """Whether ``fn`` has a required positional parameter (for the StepInfo)."""
    # Fast path for a plain function, lambda or bound method with no attributes
    # (no __wrapped__/__signature__): its code object says what inspect.signature
    # would, at a tenth of the cost (signature() was the dearest part of a step).
    func, bound = (fn.__func__, 1) if type(fn) is MethodType else (fn, 0)
    if type(func) is FunctionType and not func.__dict__:
        code = func.__code__
        return code.co_argcount - bound - len(func.__defaults__ or ()) >= 1
    try:
        params = [
            p
            for p in inspect.signature(fn).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty
        ]
    except (TypeError, ValueError):
        return False
    return len(params) >= 1


def on_thread(call: Callable[[], Any]) -> Any:
    """``call()``, run on a pool thread (a sync step fn or a sync tool).

    A ``SystemExit`` there (``sys.exit()`` in the code or in a library it calls, e.g.
    argparse) would be handed to the event loop, which ends the whole process without a
    word, and every restart would run it again: it becomes this code's error instead.
    """
    try:
        return call()
    except SystemExit as exc:
        raise StepError(
            f"sync code called sys.exit({exc.code!r}) on a harness thread: it cannot end the process "
            "from there; raise an exception instead"
        ) from exc


async def _call_fn(fn: Callable[..., Any], info: StepInfo, run_sync: RunSync | None) -> Any:
    """``fn``'s value: an async fn on the loop, a sync one on the thread pool."""
    takes = _takes_info(fn)
    if _is_async(fn):
        out = fn(info) if takes else fn()
    else:
        call = functools.partial(fn, info) if takes else fn
        out = await (run_sync or _default_run_sync)(functools.partial(on_thread, call), quick=True)
    if inspect.isawaitable(out):  # a sync callable that returned a coroutine
        out = await out
    return out


def _call_fn_here(fn: Callable[..., Any], info: StepInfo, loop: asyncio.AbstractEventLoop) -> Any:
    """``fn``'s value, called on this (non-loop) thread; a coroutine it returns runs on the loop."""
    out = fn(info) if _takes_info(fn) else fn()
    if inspect.isawaitable(out):
        out = asyncio.run_coroutine_threadsafe(_await(out), loop).result()
    return out


async def _await(awaitable: Awaitable[Any]) -> Any:
    return await awaitable


class HandedSteps(list):  # type: ignore[type-arg]
    """The step coroutines a tool call was handed (``step.do(...)``, ``step.sleep(...)``,
    ``step.ask(...)`` called), so that one it never awaited is an error of the call
    (:class:`~harness.errors.StepNotAwaited`) rather than a side effect that silently never
    happens, and Python's "coroutine was never awaited" warning on top.

    A list of the coroutines, so that handing one out is an append (a step is the hot
    path: ``do`` appends in line, and calls :meth:`prune` once the list reaches
    ``prune_at``; the list at most doubles between two prunes). Only the ones not started
    yet are kept by a prune; awaited ones, gathered ones and tasks that started are fine.
    The kind and name of one never started are read from it when needed (its code's name,
    its ``name`` argument). Nothing is written here: a correct tool runs and replays
    exactly as before.
    """

    __slots__ = ("_scope", "prune_at")

    def __init__(self, session_id: str | None, tool_call_id: str) -> None:
        super().__init__()
        self.prune_at = 32
        self._scope = (session_id, tool_call_id)

    def keep(self, coro: Coroutine[Any, Any, T]) -> Coroutine[Any, Any, T]:
        self.append(coro)
        if len(self) >= self.prune_at:
            self.prune()
        return coro

    def prune(self) -> None:
        """Drop the coroutines that finished (one not started yet, or still running in a
        task the tool may not await, is kept for :meth:`check`)."""
        self[:] = [c for c in self if not _finished(c)]
        self.prune_at = max(32, 2 * len(self))

    def _stop_left(self) -> tuple[list[tuple[str, Any]], list[tuple[str, Any]]]:
        """Stop the steps the tool left behind: ``(never started, still running)``, each
        ``(kind, name)``. One never started is closed (it never will run, and Python does
        not warn); one in a task (``asyncio.create_task(step.do(...))`` not awaited) has its
        task cancelled, so the task neither fails on a closed coroutine nor goes on to
        write after the call ended."""
        unstarted: list[tuple[str, Any]] = []
        running: list[tuple[str, Any]] = []
        tasks: dict[Any, asyncio.Task[Any]] | None = None
        for coro in self:
            state = inspect.getcoroutinestate(coro)
            if state == inspect.CORO_CLOSED:
                continue
            (unstarted if state == inspect.CORO_CREATED else running).append(_kind_and_name(coro))
            if tasks is None:
                tasks = _tasks_by_coroutine()
            task = tasks.get(coro)
            if task is not None:
                task.cancel()
            elif state != inspect.CORO_RUNNING:
                coro.close()
        self.clear()
        return unstarted, running

    def check(self, cause: BaseException | None = None) -> None:
        """The tool returned (or raised ``cause``): raise ``StepNotAwaited`` if one of its
        steps never started, or (the tool returned) one was still running."""
        unstarted, running = self._stop_left()
        if unstarted:
            left, what = unstarted, "was never awaited: write `await step.{kind}(...)`; it did not run"
        elif running and cause is None:  # (a tool that raised: its own error tells more)
            left, what = running, ("was still running when the tool returned: it was stopped; await every "
                                   "step, or the task or gather that runs it, before the tool returns")
        else:
            return
        kind, name = left[0]
        more = f" ({len(left) - 1} more step{'s' if len(left) > 2 else ''} too)" if len(left) > 1 else ""
        raise StepNotAwaited(
            f"step.{kind}({name!r}) {what.format(kind=kind)}{more}",
            session_id=self._scope[0],
            tool_call_id=self._scope[1] or None,
            step_name=name if isinstance(name, str) else None,
            kind=kind,
            names=tuple(n for _, n in left),
        ) from cause

    def close(self) -> None:
        """The call is over (or parked, or cancelled): a step left behind is stopped quietly."""
        self._stop_left()


def _tasks_by_coroutine() -> dict[Any, asyncio.Task[Any]]:
    try:
        return {task.get_coro(): task for task in asyncio.all_tasks()}
    except RuntimeError:  # no running loop: no task can hold a step
        return {}


def _kind_and_name(coro: Coroutine[Any, Any, Any]) -> tuple[str, Any]:
    """``("do", "charge")`` for the coroutine of ``step.do("charge", ...)`` not started yet
    (its frame holds its arguments)."""
    frame = coro.cr_frame  # type: ignore[attr-defined]
    return coro.cr_code.co_name.lstrip("_"), frame.f_locals.get("name") if frame is not None else None  # type: ignore[attr-defined]


def _finished(coro: Coroutine[Any, Any, Any]) -> bool:
    return inspect.getcoroutinestate(coro) == inspect.CORO_CLOSED


class _Names:
    """Step, sleep and ask names share one namespace per run of a call (SPEC 2.6, 3.4).

    A name holding a session secret is refused (SPEC 2.12): it would go into the log
    as it is, and a rewritten name would not find its stored value after a crash.
    """

    __slots__ = ("_scope", "_scrubber", "_used", "closed")

    def __init__(self, session_id: str | None, tool_call_id: str, scrubber: SecretScrubber | None = None) -> None:
        self._used: set[str] = set()
        self._scope = (session_id, tool_call_id)
        self._scrubber = scrubber
        self.closed = False

    def check_fn(self, name: str, fn: object) -> None:
        """Refuse a step ``fn`` that is not a function, before its name is taken or anything
        is written: on every run, a stored value or not."""
        if callable(fn):
            return
        given = type(fn).__name__
        if inspect.iscoroutine(fn):
            fn.close()  # it never ran: no "never awaited" warning on top of this error
            given = "a coroutine object (the call of an async function)"
        elif inspect.isawaitable(fn):
            given = f"an awaitable {given} (the call of a function)"
        raise StepError(
            f"step.do({name!r}, fn) takes a function, not {given}: pass the function, not its call: "
            f"step.do({name!r}, fetch) or step.do({name!r}, lambda: fetch(x))",
            session_id=self._scope[0],
            tool_call_id=self._scope[1] or None,
            step_name=name if isinstance(name, str) else None,
        )

    def take(self, name: str, kind: str) -> str:
        """Take ``name`` for this run of the call; returns it as plain text (a ``(str, Enum)``
        member as its value: the name the log, the key and a later run all use)."""
        if self.closed or not self._scope[1]:
            raise NoToolCallError(
                f"step.{'do' if kind == 'step' else kind} used outside a running tool call (a ctx kept after its tool "
                "returned, or no tool call id)",
                session_id=self._scope[0],
                tool_call_id=self._scope[1] or None,
                step_name=name if isinstance(name, str) else None,
            )
        if type(name) is not str or not name.isascii() or not name:  # (else nothing to check: a hot path)
            if not isinstance(name, str) or not name:
                raise StepError(
                    f"{with_article(kind)} name must be a non-empty string",
                    session_id=self._scope[0],
                    tool_call_id=self._scope[1],
                )
            name = check_text(name, what=f"{with_article(kind)} name")
        scrubber = self._scrubber
        if scrubber is not None and scrubber.active:
            scrubber.check_name(f"{kind} name", name, session_id=self._scope[0])
        if name in self._used:
            raise DuplicateStepName(
                f"{kind} name {name!r} was already used in this tool call; names must be "
                "unique and stable per call (e.g. include the item id: 'charge:42')",
                session_id=self._scope[0],
                tool_call_id=self._scope[1],
                step_name=name,
            )
        self._used.add(name)
        return name

    def free(self, name: str) -> None:
        """Give back the name of a step that stored nothing (its fn raised, its value was
        refused or its commit failed): a retry under the same name, hence the same
        idempotency key, is what a run after a crash does too."""
        self._used.discard(name)


class DurableStep:
    """``ctx.step`` in a durable session."""

    def __init__(self, scope: CallScope) -> None:
        self._s = scope
        self._names = _Names(scope.session_id, scope.tool_call_id, scope.scrubber)
        self._handed = HandedSteps(scope.session_id, scope.tool_call_id)

    @property
    def clock(self) -> Clock:
        """The clock the session's sleeps and waits are timed by."""
        return self._s.clock

    def close(self) -> None:
        """The call is over: any later use raises NoToolCallError (SPEC 2.11)."""
        self._names.closed = True
        self._handed.close()

    def check_awaited(self, cause: BaseException | None = None) -> None:
        """Raise ``StepNotAwaited`` if the tool left a ``step.*`` call never awaited."""
        self._handed.check(cause)

    def _err(self, cls: type[StepError], msg: str, name: str, **kw: Any) -> StepError:
        return cls(msg, session_id=self._s.session_id, tool_call_id=self._s.tool_call_id, step_name=name, **kw)

    def _check_value(self, name: str, value: Any) -> tuple[Any, str]:
        """The JSON copy of ``value`` (the one walk of it in Python) and its JSON text;
        raises before anything is written if the log must not hold it."""
        s = self._s
        if type(value) is str and value.isascii():
            copy = value  # (what json_copy gives for it: no surrogate can be in it)
        else:
            try:
                copy = json_copy(value, what=f"the value of step {name!r}")
            except StepError as exc:
                exc.session_id, exc.tool_call_id, exc.step_name = s.session_id, s.tool_call_id, name
                raise
        found = s.scrubber.find(copy) if s.scrubber.active else None
        if found is not None:
            secret, path = found
            raise self._err(
                SecretInStepValue,
                f"the value of step {name!r} holds the session secret {secret!r} at {path}; "
                "secrets never go into the log: return a reference to it instead",
                name,
                secret_name=secret,
                path=path,
            )
        text = dumps(copy)
        size = len(text) if text.isascii() else len(text.encode("utf-8"))
        if size > s.value_limit:
            raise self._err(
                StepValueTooLarge,
                f"the value of step {name!r} is {size} bytes, over the limit of {s.value_limit}: "
                "store the data elsewhere (a blob store, a database) and return its id",
                name,
                size=size,
                limit=s.value_limit,
            )
        return copy, text

    def do(self, name: str, fn: Callable[..., Any]) -> Coroutine[Any, Any, Any]:
        """Run ``fn`` once per call and name; return the JSON copy of its value (await it)."""
        coro = self._do(name, fn)
        handed = self._handed  # (HandedSteps.keep written out: a step's hot path)
        handed.append(coro)
        if len(handed) >= handed.prune_at:
            handed.prune()
        return coro

    async def _do(self, name: str, fn: Callable[..., Any]) -> Any:
        """``do``'s body.

        (``begin``, ``_call_fn`` and ``finish``, written out: a step is the hot path, and
        on a disk every Python call after a commit's fsync runs on cold caches.)
        """
        if not callable(fn):
            self._names.check_fn(name, fn)  # (raises)
        name = self._names.take(name, "step")
        s = self._s
        steps = s.call.steps
        if name in steps:
            metrics.step(s.harness_name, "served")
            return json_copy(steps[name])
        at_boundary = s.at_boundary
        if at_boundary is not None and (pause := at_boundary()) is not None:
            await pause  # the owner is handing over: stop here, before fn runs
        started = time.perf_counter()
        try:
            raw = await fn() if _bare_async(fn) else await _call_fn(fn, self._info(name), s.run_sync)
            value, text = self._check_value(name, raw)
            await s.commit([StepResult(s.session_id, round(s.clock.now() * 1000), s.tool_call_id, name, value)])
        except BaseException:
            metrics.step(s.harness_name, "failed", time.perf_counter() - started)
            self._names.free(name)  # (nothing stored: the name may be tried again)
            raise
        metrics.step(s.harness_name, "ran", time.perf_counter() - started)
        # The caller gets a copy of its own (the session's state keeps ``value``), as in finish.
        return loads(text) if isinstance(value, (dict, list)) else value

    async def _boundary(self) -> None:
        """Before a new step's ``fn`` runs: stop here if the owner is handing over."""
        at_boundary = self._s.at_boundary
        pause = at_boundary() if at_boundary is not None else None
        if pause is not None:
            await pause

    def begin(self, name: str) -> tuple[Any, StepInfo | None]:
        """Take the name: ``(stored value, None)`` for a finished step, else ``(None, info)``."""
        name = self._names.take(name, "step")
        s = self._s
        if name in s.call.steps:
            return json_copy(s.call.steps[name]), None
        return None, self._info(name)

    def _info(self, name: str) -> StepInfo:
        s = self._s
        return StepInfo(
            idempotency_key=ids.idempotency_key(s.log_id, s.tool_call_id, name),
            name=name,
            tool_call_id=s.tool_call_id,
            attempt=s.attempt,
        )

    async def _model_call(self, name: str, index: int, fn: Callable[..., Any]) -> Any:
        """A sub-agent's model call as a step (``agent_tool``): ``do``, and the usage the
        value holds (``value["usage"]``, when the model reported it) lands with the step
        result, in the same append, as a ``harness.model.usage`` record of this tool call
        (``index``: the call's position among the sub-agent's calls)."""
        stored, info = self.begin(name)
        if info is None:
            metrics.step(self._s.harness_name, "served")
            return stored
        s = self._s
        await self._boundary()

        def usage_of(value: Any) -> list[Record]:
            used = value.get("usage") if isinstance(value, dict) else None
            if not isinstance(used, dict):
                return []
            model, cost = used.get("model"), used.get("cost")
            return [ModelUsage(
                s.session_id, _ms(s.clock.now()), s.call.turn, index,
                model=model if isinstance(model, str) else None,
                input_tokens=max(0, int(used.get("input_tokens") or 0)),
                output_tokens=max(0, int(used.get("output_tokens") or 0)),
                cost=float(cost) if isinstance(cost, int | float) else None,
                tool_call_id=s.tool_call_id,
            )]

        started = time.perf_counter()
        try:
            raw = await _call_fn(fn, info, s.run_sync)
            try:
                try:
                    value = await self.finish(name, raw, extra=usage_of)
                except (StepValueTooLarge, StepValueError, RecordTooLarge):
                    # The provider was paid for this answer though the log cannot keep it: its
                    # usage is logged on its own (as a turn's refused answer's is); the call fails.
                    usage = usage_of(raw)
                    if usage:
                        await s.commit(usage)
                    raise
            except StepValueTooLarge as exc:  # ("store the data elsewhere" does not fit a model's answer)
                raise self._err(
                    StepValueTooLarge,
                    f"the sub-agent's model answer (step {name!r}) is {exc.size} bytes, over the step value "
                    f"limit of {exc.limit}: raise it (define_harness(..., durability={{'step_value_limit': N}})) "
                    "or have the sub-agent answer in less (fewer or smaller tool calls, a shorter text)",
                    name,
                    size=exc.size,
                    limit=exc.limit,
                ) from None
        except BaseException:
            metrics.step(s.harness_name, "failed", time.perf_counter() - started)
            raise
        metrics.step(s.harness_name, "ran", time.perf_counter() - started)
        return value

    async def finish(self, name: str, raw: Any, *, extra: Callable[[Any], list[Record]] | None = None) -> Any:
        """Check ``fn``'s value, commit it (with ``extra(value)``'s records, in the same
        append), return its JSON copy."""
        s = self._s
        value, text = self._check_value(name, raw)
        records: list[Record] = [StepResult(s.session_id, _ms(s.clock.now()), s.tool_call_id, name, value)]
        if extra is not None:
            records.extend(extra(value))
        await s.commit(records)
        # The caller gets a copy of its own (the session's state keeps ``value``): a
        # container parsed back from its JSON text (C speed, no second walk here).
        return loads(text) if isinstance(value, (dict, list)) else value

    def sleep(
        self, name: str, duration: SleepDuration | None = None, *, until: datetime | None = None
    ) -> Coroutine[Any, Any, None]:
        """Wait until a wake time recorded in the log before the wait starts (SPEC 3.1);
        ``duration`` is a timedelta or a number of seconds (await it)."""
        return self._handed.keep(self._sleep(name, duration, until=until))

    async def _sleep(
        self, name: str, duration: SleepDuration | None = None, *, until: datetime | None = None
    ) -> None:
        name = self._names.take(name, "sleep")
        s = self._s
        wake_ms = s.call.sleeps.get(name)
        if wake_ms is None:
            try:
                wake_ms = _ms(_wake_time(s.clock.now(), duration, until, s.tool_call_id))
            except ValueError as exc:
                raise self._err(StepError, str(exc), name) from None
            await s.commit([SleepScheduled(s.session_id, _ms(s.clock.now()), s.tool_call_id, name, wake_ms)])
        if s.on_wait is None:
            await s.clock.sleep_until(wake_ms / 1000)
            return
        s.on_wait(True)
        try:
            await s.clock.sleep_until(wake_ms / 1000)
        finally:
            s.on_wait(False)

    def ask(
        self,
        name: str,
        *,
        message: str,
        schema: type[M],
        expires_at: datetime | None = None,
    ) -> Coroutine[Any, Any, M]:
        """Ask a person; return their answer, validated by ``schema`` (SPEC 3.2, 3.3) (await it)."""
        return self._handed.keep(self._ask(name, message=message, schema=schema, expires_at=expires_at))

    async def _ask(
        self,
        name: str,
        *,
        message: str,
        schema: type[M],
        expires_at: datetime | None = None,
    ) -> M:
        name = self._names.take(name, "ask")
        s = self._s
        if not (isinstance(schema, type) and issubclass(schema, BaseModel)):
            raise self._err(StepError, "step.ask needs schema=<a pydantic model class>", name)
        if s.ask_models is not None:  # answers are judged by this model while the tool waits
            s.ask_models[(s.tool_call_id, name)] = schema
        ask = s.call.asks.get(name)
        if ask is None:
            expires_ms = _ms(_to_epoch(expires_at, "expires_at", s.tool_call_id)) if expires_at is not None else None
            problem = json_schema_problem(schema)
            if problem is not None:  # (the question goes in the log with its JSON schema)
                raise self._err(StepError, f"the schema of ask {name!r} has no JSON schema: {problem}", name)
            try:  # what the log cannot hold, named here rather than by the codec at the commit
                check_text(message, what=f"the message of ask {name!r}")
                json_schema = json_copy(schema.model_json_schema(), what=f"the JSON schema of ask {name!r}'s model")
            except StepError as exc:
                exc.session_id, exc.tool_call_id, exc.step_name = s.session_id, s.tool_call_id, name
                raise
            await s.commit(
                [
                    AskOpened(
                        s.session_id,
                        _ms(s.clock.now()),
                        s.tool_call_id,
                        name,
                        s.scrubber.redact_text(message),
                        json_schema,
                        expires_ms,
                    )
                ]
            )
            ask = s.call.asks[name]
        if ask.answered is None:
            deadline = ask.opened.expires_at / 1000 if ask.opened.expires_at is not None else None
            if deadline is not None and s.clock.now() >= deadline:
                raise AskExpired(
                    f"ask {name!r} expired before it was answered",
                    session_id=s.session_id,
                    tool_call_id=s.tool_call_id,
                    name=name,
                )
            await s.wait_answer(name, deadline)
            ask = s.call.asks[name]
            assert ask.answered is not None
        try:
            return schema.model_validate(ask.answered.value)
        except ValidationError as exc:  # the schema changed since the answer was logged
            raise self._err(StepError, f"the logged answer of ask {name!r} no longer fits its schema: {exc}", name) from exc


class PlainStep:
    """``ctx.step`` in plain mode (SPEC 6.1): nothing is stored, nothing is skipped."""

    def __init__(
        self, tool_call_id: str, session_id: str | None = None, clock: Clock | None = None, *, chat_id: str = ""
    ) -> None:
        self._call = tool_call_id
        self._chat_id = chat_id
        self._names = _Names(session_id, tool_call_id)
        self._handed = HandedSteps(session_id, tool_call_id)
        self._clock = clock or SystemClock()

    @property
    def clock(self) -> Clock:
        """The clock sleeps are timed by."""
        return self._clock

    def close(self) -> None:
        self._names.closed = True
        self._handed.close()

    def check_awaited(self, cause: BaseException | None = None) -> None:
        """Raise ``StepNotAwaited`` if the tool left a ``step.*`` call never awaited."""
        self._handed.check(cause)

    def do(self, name: str, fn: Callable[..., Any]) -> Coroutine[Any, Any, Any]:
        return self._handed.keep(self._do(name, fn))

    async def _do(self, name: str, fn: Callable[..., Any]) -> Any:
        self._names.check_fn(name, fn)
        _, info = self.begin(name)
        assert info is not None
        try:
            return await self.finish(name, await _call_fn(fn, info, None))
        except BaseException:
            self._names.free(name)  # (as in a session: a failed step's name may be tried again)
            raise

    def begin(self, name: str) -> tuple[Any, StepInfo | None]:
        name = self._names.take(name, "step")
        key = ids.plain_idempotency_key(self._chat_id, self._call, name)
        return None, StepInfo(idempotency_key=key, name=name, tool_call_id=self._call, attempt=1)

    async def _model_call(self, name: str, index: int, fn: Callable[..., Any]) -> Any:
        """A sub-agent's model call (plain mode: no usage record, nothing stored)."""
        return await self._do(name, fn)

    async def finish(self, name: str, raw: Any, *, extra: Callable[[Any], list[Record]] | None = None) -> Any:
        return json_copy(raw)

    def sleep(
        self, name: str, duration: SleepDuration | None = None, *, until: datetime | None = None
    ) -> Coroutine[Any, Any, None]:
        return self._handed.keep(self._sleep(name, duration, until=until))

    async def _sleep(self, name: str, duration: SleepDuration | None = None, *, until: datetime | None = None) -> None:
        name = self._names.take(name, "sleep")
        try:
            wake = _wake_time(self._clock.now(), duration, until, self._call)
        except ValueError as exc:
            raise StepError(str(exc), tool_call_id=self._call, step_name=name) from None
        await self._clock.sleep_until(wake)

    def ask(
        self, name: str, *, message: str, schema: type[M], expires_at: datetime | None = None
    ) -> Coroutine[Any, Any, M]:
        return self._handed.keep(self._ask(name, message=message, schema=schema, expires_at=expires_at))

    async def _ask(self, name: str, *, message: str, schema: type[M], expires_at: datetime | None = None) -> M:
        raise NotDurableError("step.ask needs a durable session: a person's answer must be waited for in a log")


async def _call_on_loop(fn: Callable[..., Any], *args: Any) -> Any:
    return fn(*args)


class SyncStep:
    """``ctx.step`` for a sync tool running in a worker thread: same API, blocking calls."""

    def __init__(self, inner: DurableStep | PlainStep, loop: asyncio.AbstractEventLoop) -> None:
        self._inner = inner
        self._loop = loop
        self._loop_thread = threading.get_ident()  # (made on the loop's thread)
        self._pending: set[concurrent.futures.Future[Any]] = set()  # waits on the loop (close cancels them)
        self._lock = threading.Lock()

    def close(self) -> None:
        """The call is over (returned, raised or cancelled): a wait still pending on the
        loop (an ask, a sleep, a drain's boundary: its own task, which cancelling the call
        does not reach) is cancelled, so the tool's thread unwinds at once instead of
        waiting for good and running on after its turn ended."""
        with self._lock:
            pending, self._pending = self._pending, set()
        for future in pending:
            future.cancel()

    def _run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        if threading.get_ident() == self._loop_thread:  # (waiting here for the loop would hang it for good)
            coro.close()
            raise StepError(
                "a sync tool's ctx.step was used on the event loop (in a coroutine), where its blocking "
                "calls would wait for the loop itself: make the tool an async def and await ctx.step.do(...)",
                session_id=self._inner._names._scope[0],
                tool_call_id=self._inner._names._scope[1] or None,
            )
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        with self._lock:
            self._pending.add(future)
        try:
            return future.result()
        finally:
            with self._lock:
                self._pending.discard(future)

    def do(self, name: str, fn: Callable[..., Any]) -> Any:
        """Like ``await step.do``; ``fn`` runs on this thread (already off the loop). As
        the async one: a step stored already is served; a new one first stops here if
        the owner is handing over (the drain's boundary); both are counted in the step
        metrics."""
        inner = self._inner
        inner._names.check_fn(name, fn)
        stored, info = self._run(_call_on_loop(inner.begin, name))
        if info is not None:
            name = info.name  # (as taken: plain text)
        if not isinstance(inner, DurableStep):  # plain mode: no log, no drain, no metrics
            assert info is not None
            try:
                return self._run(inner.finish(name, _call_fn_here(fn, info, self._loop)))
            except BaseException:
                inner._names.free(name)
                raise
        if info is None:
            metrics.step(inner._s.harness_name, "served")
            return stored
        self._run(inner._boundary())
        started = time.perf_counter()
        try:
            value = self._run(inner.finish(name, _call_fn_here(fn, info, self._loop)))
        except BaseException:
            metrics.step(inner._s.harness_name, "failed", time.perf_counter() - started)
            inner._names.free(name)  # (nothing stored: the name may be tried again)
            raise
        metrics.step(inner._s.harness_name, "ran", time.perf_counter() - started)
        return value

    def sleep(self, name: str, duration: SleepDuration | None = None, *, until: datetime | None = None) -> None:
        with lend_thread():  # (a wait of hours holds this thread: it does not count meanwhile)
            self._run(self._inner._sleep(name, duration, until=until))

    def ask(self, name: str, *, message: str, schema: type[M], expires_at: datetime | None = None) -> M:
        with lend_thread():
            return self._run(self._inner._ask(name, message=message, schema=schema, expires_at=expires_at))  # type: ignore[no-any-return]
