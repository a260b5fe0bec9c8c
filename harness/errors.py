"""Every error the harness raises, under one root.

::

    HarnessError
    ├── DefinitionError            misuse caught when a tool, harness, host, worker or client is set up
    │                              or called (define_harness, HarnessHost, host.open, chat, Worker,
    │                              HarnessClient), before anything runs or is written
    ├── StepError                  a step was used wrongly or its value is refused
    │   ├── DuplicateStepName      the same step/sleep/ask name twice in one tool call
    │   ├── StepNotAwaited         a step.do/sleep/ask a tool called but never awaited
    │   ├── StepValueError         (also a TypeError) a value that is not JSON
    │   ├── NaiveDatetime          (also a TypeError) a datetime without a timezone
    │   ├── StepValueTooLarge      a value over the configured size limit
    │   ├── SecretInStepValue      a value holding one of the session's secrets
    │   └── NoToolCallError        step.* or ctx.append used outside a running tool call
    ├── NotDurableError            a durable-only feature used in plain mode
    ├── AskError
    │   ├── AskExpired             the ask passed its expiry
    │   └── InvalidAnswer          an answer that fails the ask's schema / matches no ask
    ├── ReservedRecordType         an app record type starting with ``harness.``
    ├── InvalidRecord              an app record that is not {"type": str, ...}
    ├── LogError                   the session log failed
    │   ├── FencedError            this writer lost ownership; nothing was written
    │   ├── SessionBusy            another live owner holds the session's lease
    │   ├── CorruptRecord          a stored record cannot be decoded
    │   └── LogUnavailable         the backend cannot be reached / configured
    │       ├── TopicNotFound      a Kafka topic of the log does not exist (a client never creates it)
    │       └── LogClosed          a call on a log object after its close()
    ├── CodecError                 encoding/decoding a record failed
    ├── SessionClosed              a call on a session handle after its close()
    ├── SecretInName               a name or id holding a session secret (never rewritten)
    ├── InvalidId                  (also a ValueError) a session or input id that is empty, too long or unprintable
    ├── UnknownHarness             a session names a harness this host does not run
    ├── ModelError                 a model call failed: ``transient`` (retried) or not
    │   └── ContextTooLong         the provider refused the request as longer than its context window
    │       └── RequestTooLarge    the provider refused the request's body as over its size limit (HTTP 413)
    ├── StreamCallbackError        the app's ``stream=`` callback raised (never retried, not a ModelError)
    ├── SessionNotFound            a log holds no record of the session asked for
    ├── ConfigError                a setting given to a command or a service is wrong
    └── MissingExtra               an optional dependency is not installed

Errors carry structured fields (session id, tool call id, step name, position)
so callers and services can act on them without parsing messages.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "AskError",
    "AskExpired",
    "CodecError",
    "ConfigError",
    "ContextTooLong",
    "CorruptRecord",
    "DefinitionError",
    "DuplicateStepName",
    "EmptyMessage",
    "FencedError",
    "HarnessError",
    "HostClosed",
    "InvalidAnswer",
    "InvalidId",
    "InvalidRecord",
    "LogClosed",
    "LogConfigError",
    "LogError",
    "LogUnavailable",
    "MissingExtra",
    "ModelError",
    "NaiveDatetime",
    "NoToolCallError",
    "NotDurableError",
    "RecordTooLarge",
    "RequestTooLarge",
    "ReservedRecordType",
    "SecretInName",
    "SecretInStepValue",
    "SessionBusy",
    "SessionClosed",
    "SessionNotFound",
    "StepError",
    "StepNotAwaited",
    "StepValueError",
    "StepValueTooLarge",
    "StreamCallbackError",
    "TopicNotFound",
    "UnknownHarness",
]


class HarnessError(Exception):
    """Root of every error raised by the harness."""


class DefinitionError(HarnessError):
    """A tool or harness definition is wrong, or a host, a worker, a client, a session or
    ``chat()`` was given something it cannot use (caught at that call, before anything runs
    or is written)."""


class StepError(HarnessError):
    """A durable step was used wrongly or its value was refused."""

    def __init__(
        self,
        message: str,
        *,
        session_id: str | None = None,
        tool_call_id: str | None = None,
        step_name: str | None = None,
    ) -> None:
        super().__init__(message)
        self.session_id = session_id
        self.tool_call_id = tool_call_id
        self.step_name = step_name


class DuplicateStepName(StepError):
    """The same step name was used twice in one tool call (SPEC 2.6): a step with a stored
    value or still running holds its name; a step that stored nothing (its fn raised) does not,
    so a retry under the same name, with the same idempotency key, is no duplicate."""


class StepNotAwaited(StepError):
    """A tool called ``step.do`` / ``step.sleep`` / ``step.ask`` and returned (or raised)
    without awaiting it: the step never ran. ``kind`` is ``do``, ``sleep`` or ``ask``;
    ``step_name`` the first such step (``names``: all of them, in call order)."""

    def __init__(self, message: str, *, kind: str = "do", names: tuple[str, ...] = (), **kw: Any) -> None:
        super().__init__(message, **kw)
        self.kind = kind
        self.names = names


class StepValueError(StepError, TypeError):
    """A step value is not plain JSON; ``path`` names the bad part (SPEC 2.7)."""

    def __init__(self, message: str, *, path: str = "$", **kw: Any) -> None:
        super().__init__(message, **kw)
        self.path = path


class NaiveDatetime(StepError, TypeError):
    """A datetime without a timezone (``until``, ``expires_at``): which clock would it be on?"""

    def __init__(self, message: str, *, argument: str, **kw: Any) -> None:
        super().__init__(message, **kw)
        self.argument = argument


class StepValueTooLarge(StepError):
    """A step value is larger than the configured limit (SPEC 2.8)."""

    def __init__(self, message: str, *, size: int = 0, limit: int = 0, **kw: Any) -> None:
        super().__init__(message, **kw)
        self.size = size
        self.limit = limit


class SecretInStepValue(StepError):
    """A step value contains one of the session's secrets (SPEC 2.9)."""

    def __init__(self, message: str, *, secret_name: str = "", path: str = "$", **kw: Any) -> None:
        super().__init__(message, **kw)
        self.secret_name = secret_name
        self.path = path


class NoToolCallError(StepError):
    """``step.*`` or ``ctx.append`` was used outside a running tool call, e.g. on a ``ctx``
    kept after its tool returned (SPEC 2.11)."""


class NotDurableError(HarnessError):
    """A feature that needs a session log was used in plain mode (SPEC 6.1)."""


class AskError(HarnessError):
    """Base of errors about ``step.ask``."""

    def __init__(
        self,
        message: str,
        *,
        session_id: str | None = None,
        tool_call_id: str | None = None,
        name: str | None = None,
    ) -> None:
        super().__init__(message)
        self.session_id = session_id
        self.tool_call_id = tool_call_id
        self.name = name


class AskExpired(AskError):
    """The ask passed its ``expires_at`` before an answer came (SPEC 3.3)."""


class InvalidAnswer(AskError):
    """An answer that fails the ask's schema, or answers no open ask (SPEC 3.2)."""

    def __init__(self, message: str, *, reason: str = "invalid", **kw: Any) -> None:
        super().__init__(message, **kw)
        self.reason = reason


class ReservedRecordType(HarnessError):
    """An app record's type starts with ``harness.`` (SPEC 4.2)."""

    def __init__(self, record_type: str) -> None:
        super().__init__(
            f"record type {record_type!r} is reserved: types starting with 'harness.' "
            "belong to the harness itself; choose another prefix"
        )
        self.record_type = record_type


class InvalidRecord(HarnessError):
    """An app record is not a JSON object with a string ``type``."""


class LogError(HarnessError):
    """The session log failed."""


class FencedError(LogError):
    """This writer lost ownership of the session; the append wrote nothing (SPEC 7.1)."""

    def __init__(self, message: str, *, session_id: str | None = None, epoch: int | None = None) -> None:
        super().__init__(message)
        self.session_id = session_id
        self.epoch = epoch


class SessionBusy(LogError):
    """Another live owner holds the session's lease.

    ``holder_pid`` is set when that lease has run out but its holder is a process still
    alive on this machine (SQLite: see ``harness.log.holder``); it keeps the session
    until ``keep_until``.
    """

    def __init__(
        self,
        message: str,
        *,
        session_id: str,
        owner: str | None = None,
        lease_until: float | None = None,
        holder_pid: int | None = None,
        keep_until: float | None = None,
    ) -> None:
        super().__init__(message)
        self.session_id = session_id
        self.owner = owner
        self.lease_until = lease_until
        self.holder_pid = holder_pid
        self.keep_until = keep_until


class CorruptRecord(LogError):
    """A stored record cannot be decoded.

    Holds where it is (session, position, and on Kafka topic/partition/offset)
    and its raw bytes, so it can be inspected or copied to a dead-letter topic.
    """

    def __init__(
        self,
        message: str,
        *,
        session_id: str | None = None,
        seq: int | None = None,
        raw: bytes = b"",
        topic: str | None = None,
        partition: int | None = None,
        offset: int | None = None,
    ) -> None:
        super().__init__(message)
        self.session_id = session_id
        self.seq = seq
        self.raw = raw
        self.topic = topic
        self.partition = partition
        self.offset = offset


class LogUnavailable(LogError):
    """The log backend cannot be reached or is misconfigured."""


class LogClosed(LogUnavailable):
    """A call on a log object after its ``close()`` (a process shutting down: what follows
    the log stops quietly on it)."""


class RecordTooLarge(LogError, ValueError):
    """A record is larger than the log accepts; that append or input wrote nothing.

    Retrying it cannot help (the gateway answers 413). The other appends of the same group
    commit are not affected. On Kafka raise ``message.max.bytes`` (clients) and
    ``max.message.bytes`` (topic) together; on SQLite and in memory the log's
    ``max_record_bytes`` (``sqlite:///harness.db?max_record_bytes=N``); or store less.

    Attributes:
        session_id: the session the record was for.
        size: the refused record's size in bytes, encoded as the log stores it.
        limit: the log's limit in bytes, when the log knows it (None on Kafka, whose
            client or broker refuses the record).
        raise_limit: how to raise the limit on this log.
    """

    KAFKA_RAISE_LIMIT = "on Kafka the topic's max.message.bytes and the clients' message.max.bytes"

    def __init__(
        self, message: str, *, session_id: str, size: int, limit: int | None = None, raise_limit: str = KAFKA_RAISE_LIMIT
    ) -> None:
        super().__init__(message)
        self.session_id = session_id
        self.size = size
        self.limit = limit
        self.raise_limit = raise_limit

    def explained(self, what: str, fix: str = "store large data elsewhere (a blob store, a database) and keep its id") -> str:
        """What a user is told: ``what`` was refused, how big it is and what to do."""
        accepts = "accepts" if self.limit is None else f"accepts ({self.limit} bytes)"
        return (
            f"{what} is {self.size} bytes as a log record, more than the session log {accepts}; nothing of it was "
            f"written: {fix}, or raise the log's record limit ({self.raise_limit})"
        )


class TopicNotFound(LogUnavailable):
    """A topic of the Kafka log does not exist; clients never create it (workers and
    ``harness topics create`` do)."""

    def __init__(self, message: str, *, topic: str) -> None:
        super().__init__(message)
        self.topic = topic


class CodecError(HarnessError):
    """A record could not be encoded or decoded; ``raw`` holds the bytes when decoding."""

    def __init__(self, message: str, *, raw: bytes = b"", record_type: str | None = None) -> None:
        super().__init__(message)
        self.raw = raw
        self.record_type = record_type


class SessionClosed(HarnessError):
    """The session handle was closed: open a new one (``host.open``) to go on."""

    def __init__(self, session_id: str) -> None:
        super().__init__(f"the handle of session {session_id!r} is closed; open it again with host.open()")
        self.session_id = session_id


class HostClosed(HarnessError):
    """``host.open()`` on a ``HarnessHost`` that was closed (``close()``, or its ``async
    with`` ended): make a new host to go on."""

    def __init__(self) -> None:
        super().__init__(
            "this HarnessHost is closed (host.close() or the end of its 'async with'): make a new "
            "HarnessHost(log=...) to open sessions"
        )


class EmptyMessage(HarnessError, ValueError):
    """``send("")``: a user message with no text (a model provider refuses an empty user
    turn; the CLI and the gateway refuse it too)."""

    def __init__(self, session_id: str | None = None) -> None:
        where = f" to session {session_id!r}" if session_id else ""
        super().__init__(f"the message text{where} is empty: give the message to send, e.g. send('hello')")
        self.session_id = session_id


class InvalidId(HarnessError, ValueError):
    """A session or input id that is empty, longer than ``ids.MAX_ID`` characters, or
    holds a character that cannot be printed (a newline, a control character) or a space
    at either end: ids are keys in the log, table cells and arguments of commands."""

    def __init__(self, message: str, *, kind: str) -> None:
        super().__init__(message)
        self.kind = kind


class SecretInName(HarnessError, ValueError):
    """A name or id (step, ask or sleep name; input, session or tool call id) holds a
    session secret. Names are never rewritten (a rewritten step name would run its step
    again after a crash), so it is refused before anything is written."""

    def __init__(self, kind: str, *, secret_name: str, session_id: str | None = None) -> None:
        super().__init__(
            f"the {kind} holds the session secret {secret_name!r}; names and ids go into the log "
            "as they are: build them from ids, never from secret values"
        )
        self.kind = kind
        self.secret_name = secret_name
        self.session_id = session_id


class UnknownHarness(HarnessError):
    """A session names a harness that this host does not run."""

    def __init__(self, name: str) -> None:
        super().__init__(f"no harness named {name!r} is loaded here")
        self.name = name


class ModelError(HarnessError):
    """A model call failed.

    ``transient`` errors (429, 5xx, timeouts, connection resets, a stream cut
    half-way) are retried with backoff, honouring ``retry_after`` (seconds); any
    other error fails the turn at once with code ``model_error``. The message is
    the provider's, with credentials removed. A model adapter of your own raises
    this to get the same treatment; any other exception counts as permanent.
    """

    def __init__(
        self,
        message: str,
        *,
        transient: bool,
        status: int | None = None,
        retry_after: float | None = None,
        kind: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.transient = transient
        self.status = status
        self.retry_after = retry_after
        self.kind = kind
        """A short class: rate_limited, server_error, timeout, connection, bad_request,
        auth, forbidden, not_found, stream_cut, config, context_too_long ..."""


class ContextTooLong(ModelError):
    """The provider refused the request as longer than the model's context window.

    Permanent (never retried: the same conversation is refused again), and the turn
    fails with code :attr:`code` (``context_too_long``). The built-in adapters raise it for
    OpenAI's ``context_length_exceeded``, Anthropic's ``prompt is too long``, and the
    context length errors of OpenAI-compatible servers (vLLM, llama.cpp, Ollama ...), as an
    HTTP error or as an error event in the middle of a stream; an adapter of your own may
    raise it too. The message is the provider's, then :attr:`FIX`.
    """

    code = "context_too_long"
    """The code of the turn it fails (and this error's ``kind``)."""

    FIX = (
        "to fix it, bound what each request sends with history=History(max_messages=..., max_chars=...) "
        "(define_harness() or chat(); lower the bounds if one is set), or start a new session"
    )
    """What the user is told to do, at the end of the message."""

    SUB_AGENT_FIX = (
        "to fix it, make the sub-agent's run shorter: fewer tool rounds "
        "(agent_tool(..., max_model_calls=...)), smaller tool results, or let its harness drop old "
        "rounds with history=History(max_chars=..., trim_current_turn=True) (a sub-agent's run is one "
        "turn, which a history policy sends whole otherwise)"
    )
    """What the user is told when the request was an ``agent_tool`` sub-agent's."""

    def __init__(self, message: str, *, status: int | None = None, fix: str | None = None) -> None:
        # One line: a provider's (or a proxy's) text may span several.
        said = " ".join(message.split())
        # (the provider's sentence usually ends with a full stop: "...tokens.; to fix it" read badly)
        said = said[:-1] if said.endswith(".") and not said.endswith("..") else said
        super().__init__(f"{said}; {fix or self.FIX}", transient=False, status=status, kind=self.code)
        self.provider_message = message
        """The provider's refusal alone, without the fix."""


class RequestTooLarge(ContextTooLong):
    """The provider (or a proxy in front of it) refused the request's body as over its size
    limit: HTTP 413, Anthropic's ``request_too_large`` (a Messages request is at most
    32 MB), whatever the model's context window.

    Permanent, like its base class (``except ContextTooLong`` catches both: the cure is the
    same, send less), but the turn fails with its own code ``request_too_large``. The
    message is the provider's, then :attr:`FIX`.
    """

    code = "request_too_large"

    FIX = (
        "the request is over the provider's size limit; to fix it, send less: bound the history with "
        "history=History(max_chars=...) (define_harness() or chat(); lower it if one is set), keep big tool "
        "results, files and images out of the conversation, or start a new session"
    )

    SUB_AGENT_FIX = (
        "the request is over the provider's size limit; to fix it, make the sub-agent's run send less: "
        "smaller tool results (files and images out of them), fewer tool rounds "
        "(agent_tool(..., max_model_calls=...)), or let its harness drop old rounds with "
        "history=History(max_chars=..., trim_current_turn=True)"
    )


class StreamCallbackError(HarnessError):
    """The ``stream=`` callback (the app's, given to ``chat()`` or a model's ``complete``)
    raised while a model answer streamed.

    The app's bug, not the provider's: not a :class:`ModelError`, never retried; the
    model call stops there. One line names the callback and carries the type and message
    of what it raised (API keys and session secrets removed: the callback's own
    exception is not kept as the cause, as its text may quote them).
    """

    def __init__(self, error_type: str, detail: str) -> None:
        self.error_type = error_type
        """The class name of what the callback raised (``ValueError`` ...)."""
        self.detail = " ".join(detail.split())
        """Its message, on one line, credentials removed."""
        said = f"{error_type}: {self.detail}" if self.detail else error_type
        super().__init__(
            f"the stream= callback raised {said} (a bug in the callback, not in the model or its provider; "
            "the model call was stopped and is not retried)"
        )


class ConfigError(HarnessError):
    """A setting given to a command or a service is wrong (an ``--app`` that names no
    harness, a secrets folder that does not exist ...); the message says how to fix it."""

    def __init__(self, message: str, *, setting: str | None = None) -> None:
        super().__init__(message)
        self.setting = setting


class LogConfigError(ConfigError, ValueError):
    """A session log's URL or option is wrong (``open_log``, ``KafkaSettings``: an
    unsupported scheme, a missing port, an unknown option ...); the message says how to
    fix it. A ``ValueError`` too, as it always was."""


class SessionNotFound(HarnessError):
    """The log holds no record of this session."""

    def __init__(self, message: str, *, session_id: str) -> None:
        super().__init__(message)
        self.session_id = session_id


class MissingExtra(HarnessError, ImportError):
    """An optional part is used without its extra installed."""

    def __init__(self, feature: str, extra: str) -> None:
        super().__init__(f"{feature} needs the '{extra}' extra: pip install 'durable-harness[{extra}]'")
        self.feature = feature
        self.extra = extra
