"""A harness: a model, its tools, a system prompt, hooks, durability and history options."""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from types import MappingProxyType
from typing import Any, TypeVar

from harness.clock import duration_seconds
from harness.errors import DefinitionError
from harness.models.base import Model, model_keywords
from harness.replay.planner import ToolPolicy
from harness.tools import Tool

__all__ = [
    "DEFAULT_CUT_CALL_ERROR",
    "DEFAULT_TRUNCATED_CALL_ERROR",
    "Durability",
    "Harness",
    "History",
    "Hooks",
    "ToolCallEvent",
    "ToolOutcome",
    "check_durability",
    "check_history",
    "check_hooks",
    "check_model",
    "check_system_prompt",
    "define_harness",
    "parameter_list",
    "tools_by_name",
]

MAX_HARNESS_NAME = 128
"""The longest harness name (the gateway filters by names of up to 200 characters)."""

DEFAULT_TRUNCATED_CALL_ERROR = (
    "This tool call was not run: the response that asked for it was cut off at the model's "
    "output limit, so its arguments may be incomplete. Ask for it again, with shorter output."
)

DEFAULT_CUT_CALL_ERROR = (
    "This tool call was cut off by a crash and was not run again: nobody knows whether "
    "it ran, in whole or in part. Check its effects before trying again."
)


def parameter_list(signature: inspect.Signature) -> str:
    """``(a, b=1, *rest)``: a function's parameters as an error message shows them (no
    annotations: under ``from __future__ import annotations`` they are quoted strings)."""
    return f"({', '.join(str(p.replace(annotation=p.empty)) for p in signature.parameters.values())})"


@dataclass(frozen=True, slots=True)
class ToolCallEvent:
    """What a hook is told about a tool call."""

    session_id: str | None
    tool_call_id: str
    name: str
    arguments: Any
    attempt: int


@dataclass(frozen=True, slots=True)
class ToolOutcome:
    """A tool call's result as the model will see it (unless a hook replaces it)."""

    content: Any
    is_error: bool = False
    code: str | None = None


BeforeHook = Callable[[ToolCallEvent], Any]
AfterHook = Callable[[ToolCallEvent, ToolOutcome], Any]


@dataclass(frozen=True, slots=True)
class Hooks:
    """Hooks around tool calls; each may be sync or async.

    ``on_before_tool_call(event)``: return None to run the tool, or a
    ``ToolOutcome`` (or a plain JSON value) to answer for it without running it.
    ``on_after_tool_call(event, outcome)``: return None to keep the outcome, or a
    replacement (``ToolOutcome`` or a plain JSON value). A replacement wins, also
    when the tool raised (SPEC 5.6), and it is what the log keeps.
    """

    on_before_tool_call: BeforeHook | None = None
    on_after_tool_call: AfterHook | None = None

    def __post_init__(self) -> None:
        for hook_name, arguments in (("on_before_tool_call", ("event",)), ("on_after_tool_call", ("event", "outcome"))):
            hook = getattr(self, hook_name)
            if hook is None:
                continue
            call = f"{hook_name}({', '.join(arguments)})"
            if not callable(hook):
                raise DefinitionError(f"hooks: {hook_name} takes a function {call}, sync or async, "
                                      f"not {type(hook).__name__}")
            try:
                signature = inspect.signature(hook)
            except (TypeError, ValueError):
                continue  # (a builtin without a signature: called as it is)
            try:
                signature.bind(*arguments)
            except TypeError:
                raise DefinitionError(
                    f"hooks: {hook_name} is called as {call}; this one takes {parameter_list(signature)}"
                ) from None


@dataclass(frozen=True, slots=True)
class Durability:
    """How durable sessions of this harness behave."""

    max_attempts: int = 10
    """How many owners may take up one turn before it fails with ``attempts_exhausted``."""
    step_value_limit: int = 256 * 1024
    """Largest encoded step value, in bytes (SPEC 2.8)."""
    cut_call_error: str = DEFAULT_CUT_CALL_ERROR
    """The text of the tool error a cut, non-replayable call gets (SPEC 5.3)."""
    max_model_calls: int = 50
    """Model calls in one turn before it fails with ``too_many_model_calls``."""
    truncated_call_error: str = DEFAULT_TRUNCATED_CALL_ERROR
    """The text of the tool error each call of a response cut at the model's output limit
    gets instead of running (like TanStack's ``truncatedToolResult``)."""
    model_retries: int = 6
    """Retries of one model call after transient errors (429, 5xx, timeouts, connection
    resets, a stream cut half-way) before the turn fails with ``model_error``; 0: none."""
    model_backoff: timedelta = timedelta(seconds=1)
    """The wait before the first retry (a timedelta, or seconds: ``model_backoff=0.5``); each retry doubles it (with jitter: a wait is
    drawn between half and all of it), up to ``model_backoff_max``."""
    model_backoff_max: timedelta = timedelta(seconds=60)
    """The longest wait between two tries of a model call, ``Retry-After`` included (a
    provider asking for a longer wait gets this long, then the next try)."""
    timeout: timedelta | None = None
    """How long a turn may take (a timedelta, or seconds: ``timeout=300``), from its first start (takeovers included), before it
    stops at its next boundary and fails with code ``timeout``; None: no limit. A final
    answer already logged still completes the turn."""

    def __post_init__(self) -> None:
        for field_name in ("cut_call_error", "truncated_call_error"):
            text = getattr(self, field_name)
            if not isinstance(text, str) or not text.strip():
                raise DefinitionError(f"durability.{field_name} is the text the model gets: a non-empty string, "
                                      f"not {type(text).__name__ if not isinstance(text, str) else repr(text)}")
        for field_name, least in (("max_attempts", 1), ("step_value_limit", 1), ("max_model_calls", 1),
                                  ("model_retries", 0)):
            value = getattr(self, field_name)
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise DefinitionError(
                    f"durability.{field_name} must be a whole number of at least {least}, not {value!r}"
                )
        for field_name in ("model_backoff", "model_backoff_max", "timeout"):  # seconds as a number too
            value = getattr(self, field_name)
            if value is None or isinstance(value, timedelta):
                continue
            try:
                seconds = duration_seconds(value, f"durability.{field_name}")
            except ValueError as exc:
                raise DefinitionError(str(exc)) from None
            object.__setattr__(self, field_name, timedelta(seconds=seconds))
        if self.model_backoff <= timedelta(0) or self.model_backoff_max < self.model_backoff:
            raise DefinitionError("durability.model_backoff must be positive and at most model_backoff_max")
        if self.timeout is not None and (
            not isinstance(self.timeout, timedelta) or self.timeout <= timedelta(0)
        ):
            raise DefinitionError(
                f"durability.timeout must be positive (a timedelta or seconds) or None, "
                f"not {self.timeout.total_seconds():g} s"
            )


@dataclass(frozen=True, slots=True)
class History:
    """What of a session's conversation each model request carries (opt-in; the log always
    keeps everything).

    The system prompt and the current turn (from its user message on) are always sent
    whole; older turns are sent newest first while both bounds hold, and the first that
    does not fit is dropped with every turn before it. A turn is dropped whole, so a tool
    call is never sent without its result, nor a result without its call. When the
    current turn alone is over a bound it is sent anyway (the provider decides), unless
    ``trim_current_turn``. The choice depends only on the log, so a session taken over by
    another process sends the same requests.

    A sub-agent of ``agent_tool`` uses its own harness's policy for its requests, but its
    whole run is ONE turn (its prompt, then its tool calls and results): only
    ``trim_current_turn=True`` can shorten it.

    Note: ``ScriptedModel([...])`` answers ``responses[k]``, k = the assistant messages in
    the request: dropped turns lower k, so script a trimmed session with a function.
    """

    max_messages: int | None = None
    """Most messages after the system prompt (user, assistant and tool messages); None: any."""
    max_chars: int | None = None
    """Most characters after the system prompt: message texts, tool results, tool call names
    and arguments (as JSON); None: any. About 4 characters make a token in English."""
    trim_current_turn: bool = False
    """When the current turn alone is over a bound, drop its oldest tool rounds too (a round:
    an assistant message with its tool results, always whole), keeping its user message and
    its latest round, and newer rounds first while the bounds hold; every older turn goes.
    For long tool loops (an ``agent_tool`` sub-agent's run is one turn). The model then
    no longer sees what the dropped rounds did. Default False: the current turn is sent whole."""

    def __post_init__(self) -> None:
        for field_name in ("max_messages", "max_chars"):
            value = getattr(self, field_name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise DefinitionError(f"history.{field_name} must be a whole number of at least 1 or None, not {value!r}")
        if not isinstance(self.trim_current_turn, bool):
            raise DefinitionError(f"history.trim_current_turn must be True or False, not {self.trim_current_turn!r}")
        if self.max_messages is None and self.max_chars is None:
            raise DefinitionError(
                "History() bounds nothing: give max_messages= or max_chars= (or both), or leave history= out"
            )


@dataclass(frozen=True, slots=True)
class Harness:
    name: str
    model: Model
    tools: Mapping[str, Tool]
    system_prompt: str | None = None
    hooks: Hooks = field(default_factory=Hooks)
    durability: Durability = field(default_factory=Durability)
    history: History | None = None
    """What of the conversation each model request carries; None: all of it."""
    model_keywords: frozenset[str] = frozenset()
    """The optional keywords (``stream``, ``secrets``) the model's ``complete`` takes:
    read once, when the harness is defined."""

    @property
    def policies(self) -> Mapping[str, ToolPolicy]:
        return MappingProxyType({name: t.policy for name, t in self.tools.items()})


def check_model(model: object, what: str) -> None:
    """Refuse a model that the harness cannot call (``what`` names whose it is).

    Raises:
        DefinitionError: a class (not a model made of it), no ``complete()`` method, or one
            that is not ``async def``.
    """
    if isinstance(model, type):
        raise DefinitionError(
            f"model of {what} is the class {model.__name__}, not a model: make one, e.g. {model.__name__}(...)"
        )
    complete = getattr(model, "complete", None)
    if not callable(complete):
        raise DefinitionError(
            f"model of {what} has no complete() method ({type(model).__name__}): give a model of "
            "harness.models, e.g. ScriptedModel([...]) or from_uri('openai:gpt-4.1-mini')"
        )
    if (inspect.isfunction(complete) or inspect.ismethod(complete)) and not (
        inspect.iscoroutinefunction(complete) or inspect.iscoroutinefunction(inspect.unwrap(complete))
    ):
        raise DefinitionError(
            f"model of {what}: complete() must be 'async def' (the harness awaits it; blocking "
            "client code inside it goes in await asyncio.to_thread(...))"
        )


def tools_by_name(tools: object, what: str) -> dict[str, Tool]:
    """The tools of ``what`` by name.

    Raises:
        DefinitionError: ``tools`` is not a list of tools (one tool alone, None ...), or
            two have one name.
    """
    if isinstance(tools, Tool | str | bytes | Mapping) or not isinstance(tools, Iterable):
        alone = f"; one tool goes in a list too: tools=[{tools.name}]" if isinstance(tools, Tool) else ""
        raise DefinitionError(f"{what}: tools= takes a list of tools, not {type(tools).__name__}{alone}")
    by_name: dict[str, Tool] = {}
    for t in tools:
        if not isinstance(t, Tool):
            raise DefinitionError(f"{what}: {t!r} is not a tool (use tool() or durable_tool())")
        if t.name in by_name:
            raise DefinitionError(f"{what} has two tools named {t.name!r}")
        by_name[t.name] = t
    return by_name


def check_hooks(hooks: object, what: str) -> Hooks:
    """``hooks`` of ``what`` as ``Hooks``: a ``Hooks``, a dict of its fields, or None.

    Raises:
        DefinitionError: anything else, a dict key that names no hook, or a hook that is
            not a function taking the hook's arguments.
    """
    if hooks is None:
        return Hooks()
    if isinstance(hooks, Hooks):
        return hooks
    names = ("on_before_tool_call", "on_after_tool_call")
    if isinstance(hooks, Mapping):
        for key in hooks:
            if key not in names:
                raise DefinitionError(f"{what}: hooks= has no hook {key!r}; the hooks are {' and '.join(names)}")
        return Hooks(**hooks)
    raise DefinitionError(
        f"{what} takes hooks= as Hooks(on_before_tool_call=..., on_after_tool_call=...) or a dict of them, "
        f"not {type(hooks).__name__}"
    )


def check_durability(durability: object, what: str) -> Durability:
    """``durability`` of ``what`` as ``Durability``: a ``Durability``, a dict of its
    fields, or None (the defaults).

    Raises:
        DefinitionError: anything else, a dict key that is no field, or a field's value
            that ``Durability`` refuses.
    """
    if durability is None:
        return Durability()
    names = ", ".join(f.name for f in dataclasses.fields(Durability))
    return _of_fields(Durability, durability, what, "durability", f"Durability(...) or a dict of its fields ({names})")


def check_history(history: object, what: str) -> History | None:
    """``history`` of ``what`` as ``History``: a ``History``, a dict of its fields, or None
    (no policy: every request carries the whole conversation).

    Raises:
        DefinitionError: anything else, a dict key that is no field, or a field's value
            that ``History`` refuses.
    """
    if history is None:
        return None
    return _of_fields(History, history, what, "history", "History(max_messages=..., max_chars=...) or a dict of its fields")


_D = TypeVar("_D")


def _of_fields(cls: type[_D], value: object, what: str, keyword: str, takes: str) -> _D:
    """``value`` as a ``cls`` (a dataclass): one already, or a dict of its fields."""
    if isinstance(value, cls):
        return value
    if isinstance(value, Mapping):
        names = [f.name for f in dataclasses.fields(cls)]  # type: ignore[arg-type]
        for key in value:
            if key not in names:
                raise DefinitionError(f"{what}: {keyword}= has no field {key!r}; its fields are {', '.join(names)}")
        try:
            return cls(**value)
        except DefinitionError as exc:  # a value it refuses: say whose
            raise DefinitionError(f"{what}: {exc}") from None
    raise DefinitionError(f"{what} takes {keyword}= as {takes}, not {type(value).__name__}")


def check_system_prompt(system_prompt: object, what: str) -> str | None:
    """``system_prompt`` if it is a string or None.

    Raises:
        DefinitionError: anything else (a list of lines ...).
    """
    if system_prompt is not None and not isinstance(system_prompt, str):
        raise DefinitionError(f"{what} takes system_prompt= as a string or None, not {type(system_prompt).__name__}")
    return system_prompt


def define_harness(
    *,
    name: str,
    model: Model,
    tools: Sequence[Tool] = (),
    system_prompt: str | None = None,
    hooks: Hooks | Mapping[str, Any] | None = None,
    durability: Durability | Mapping[str, Any] | None = None,
    history: History | Mapping[str, Any] | None = None,
) -> Harness:
    """Put a model and its tools together under a stable name.

    The name is written into each session's log, so a worker can find the
    harness of a session it takes over: keep it stable. ``hooks``, ``durability`` and
    ``history`` are a ``Hooks`` / ``Durability`` / ``History`` or a dict of their fields.
    ``history`` bounds what each model request carries of a long conversation (see
    ``History``); by default every request carries all of it, until the provider refuses
    one and the turn fails with ``context_too_long``.

    Raises:
        DefinitionError: a name that is empty, too long or unprintable; a model without an
            async ``complete()``; ``tools`` that is not a list of tools; a ``system_prompt``
            that is not a string; ``hooks``, ``durability`` or ``history`` that is neither.
    """
    if not isinstance(name, str) or not name.strip():
        raise DefinitionError("a harness needs a non-empty name")
    if name != name.strip() or len(name) > MAX_HARNESS_NAME or not name.isprintable():
        raise DefinitionError(
            f"harness name {name[:40]!r}{'...' if len(name) > 40 else ''}: at most {MAX_HARNESS_NAME} printable "
            "characters, no space at either end (it is in every input record, --harness and the gateway's filter)"
        )
    check_model(model, f"harness {name!r}")
    by_name = tools_by_name(tools, f"harness {name!r}")
    return Harness(
        name=name,
        model=model,
        tools=MappingProxyType(by_name),
        system_prompt=check_system_prompt(system_prompt, f"harness {name!r}"),
        hooks=check_hooks(hooks, f"harness {name!r}"),
        durability=check_durability(durability, f"harness {name!r}"),
        history=check_history(history, f"harness {name!r}"),
        model_keywords=model_keywords(model),
    )
