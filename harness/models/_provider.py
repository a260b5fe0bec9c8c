"""What the provider adapters share: credentials, options, error classification.

Credentials: ``api_key=`` (a literal), ``api_key_secret=`` (the name of a session
secret holding it, read on each call), or neither: then the provider's SDK finds
it where it always does (``OPENAI_API_KEY``, ``ANTHROPIC_API_KEY`` ...). The harness
itself never reads the environment. A key never reaches a record, an error
message or a log line: adapters remove it (and masked fragments of keys that
providers echo back) from every message they raise.
"""

from __future__ import annotations

import asyncio
import email.utils
import importlib
import inspect
import json
import math
import re
from collections.abc import Mapping
from types import ModuleType
from typing import Any, ClassVar

from pydantic import SecretStr

from harness.errors import ContextTooLong, DefinitionError, MissingExtra, ModelError, RequestTooLarge
from harness.models.base import Pricing

__all__ = [
    "ProviderModel", "Utf16Joiner", "context_overflow", "key_problem", "load_sdk", "parse_arguments", "retry_after_seconds",
    "tokens", "utf16_text",
]

_USERINFO = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*://)[^/@]*@")


def _without_userinfo(url: str) -> str:
    """``url`` with its user info (``user:password@``) shown as ``***@``."""
    return _USERINFO.sub(r"\1***@", url)


_KEY_LIKE = re.compile(r"\b(?:sk|pk|rk|key)-[A-Za-z0-9_\-*.]{4,}")
"""Tokens shaped like API keys (``sk-...``, ``sk-ant-...``, masked ``sk-abc***xyz``)."""
_MASKED = re.compile(r"[A-Za-z0-9_\-]+\*{3,}[A-Za-z0-9_\-]*|\*{3,}[A-Za-z0-9_\-]+")
"""A key of any shape as a provider echoes it masked (``gsk_0123****WXYZ``, ``****WXYZ``)."""

_KINDS = {
    400: "bad_request", 401: "auth", 402: "payment_required", 403: "forbidden", 404: "not_found",
    408: "timeout", 409: "conflict", 413: "too_large", 422: "unprocessable", 425: "too_early",
    429: "rate_limited", 529: "overloaded",
}
_TRANSIENT_STATUS = frozenset({408, 409, 425, 429})


def key_problem(key: str) -> str | None:
    """Why ``key`` cannot go into a request header (never the key itself), or None.

    A key read from a file or a mounted secret often ends with a newline: the HTTP client
    refuses the header and says so with the whole header, key included, in its message.
    """
    if key != key.strip() or any(ord(c) < 32 or ord(c) == 127 for c in key):
        return "has a space or a line break at an end (or a control character): strip it, e.g. open(path).read().strip()"
    return None


def load_sdk(module: str, feature: str, extra: str) -> ModuleType:
    """Import a provider SDK, or fail with the install command."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise MissingExtra(feature, extra) from None


_SURROGATE = re.compile("[\ud800-\udfff]")


def utf16_text(text: str) -> str:
    """``text`` with surrogate pairs joined and lone surrogates as U+FFFD.

    A JSON ``\\ud83d\\ude42`` escape split over two stream events decodes as two lone
    surrogates, which no log can hold (they have no UTF-8 form): the answer would be lost.
    """
    if _SURROGATE.search(text) is None:
        return text
    return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")


class Utf16Joiner:
    """Stream deltas made whole: a high surrogate that ends a delta waits for the next one
    (whose low surrogate completes it); what is emitted joined is :func:`utf16_text` of the
    whole text."""

    def __init__(self) -> None:
        self._held = ""

    def feed(self, text: str) -> str:
        text, self._held = self._held + text, ""
        if text and "\ud800" <= text[-1] <= "\udbff":
            text, self._held = text[:-1], text[-1]
        return utf16_text(text)

    def end(self) -> str:
        held, self._held = self._held, ""
        return utf16_text(held)


def tokens(value: Any) -> int:
    """A token count as the provider reports it (a number, or a number as text); 0 when it is
    missing or unreadable: an odd usage field never costs the answer that carries it."""
    if isinstance(value, bool):
        return 0
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        return 0
    return int(number) if math.isfinite(number) else 0


def parse_arguments(raw: Any) -> dict[str, Any] | str:
    """A tool call's arguments text as a JSON object; the raw text if it is not one.

    Some OpenAI-compatible servers send the arguments as an object, not as JSON text: kept.
    """
    if isinstance(raw, Mapping):
        return dict(raw)
    text = raw if isinstance(raw, str) or raw is None else json.dumps(raw, ensure_ascii=False)
    if text is not None:
        text = utf16_text(text)
    if text is None or not text.strip():
        return {}
    try:
        value = json.loads(text)
    except ValueError:
        return text
    return value if isinstance(value, dict) else text


def retry_after_seconds(headers: Mapping[str, str] | None) -> float | None:
    """``retry-after-ms``, else ``retry-after`` (seconds, or an HTTP date read against the
    response's own ``date`` header); None when absent or unreadable."""
    if not headers:
        return None
    try:
        ms = headers.get("retry-after-ms")
        if ms is not None:
            return max(0.0, float(ms) / 1000)
        value = headers.get("retry-after")
        if value is None:
            return None
        try:
            return max(0.0, float(value))
        except ValueError:
            when = email.utils.parsedate_to_datetime(value)
            date = headers.get("date")
            if date is None:
                return None
            return max(0.0, (when - email.utils.parsedate_to_datetime(date)).total_seconds())
    except (TypeError, ValueError, IndexError, OverflowError):
        return None


def _transport_errors() -> tuple[type[BaseException], ...]:
    """The HTTP client's transport errors that can escape an SDK's stream iteration."""
    out: list[type[BaseException]] = []
    for name in ("httpx2", "httpx"):
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        for attr in ("TransportError", "TimeoutException", "StreamError"):
            cls = getattr(module, attr, None)
            if isinstance(cls, type) and issubclass(cls, BaseException):
                out.append(cls)
    return tuple(out)


class ProviderModel:
    """Base of the provider adapters: options, credentials, clients, errors."""

    provider: ClassVar[str] = ""
    extra: ClassVar[str] = ""
    sdk_module: ClassVar[str] = ""
    reserved_options: ClassVar[frozenset[str]] = frozenset()
    key_variable: ClassVar[str] = ""  # the environment variable the SDK reads the key from

    def __init__(
        self,
        *,
        model: str,
        base_url: str | None = None,
        api_key: str | SecretStr | None = None,
        api_key_secret: str | None = None,
        pricing: Pricing | None = None,
        streaming: bool = True,
        client_options: Mapping[str, Any] | None = None,
        **options: Any,
    ) -> None:
        name = type(self).__name__
        if not isinstance(model, str) or not model.strip():
            raise DefinitionError(f"{name} needs model= (the provider's model name)")
        if api_key is not None and api_key_secret is not None:
            raise DefinitionError(f"{name}: give api_key= or api_key_secret=, not both")
        if api_key_secret is not None and (not isinstance(api_key_secret, str) or not api_key_secret):
            raise DefinitionError(f"{name}: api_key_secret names a session secret (a non-empty str)")
        if pricing is not None and not isinstance(pricing, Pricing):
            raise DefinitionError(f"{name}: pricing= takes a harness.models.Pricing")
        reserved = sorted(self.reserved_options & set(options))
        if reserved:
            raise DefinitionError(f"{name}: the harness sets {', '.join(reserved)} itself; leave them out")
        client_options = dict(client_options or {})
        for key in ("api_key", "base_url", "max_retries"):
            if key in client_options:
                raise DefinitionError(f"{name}: client_options may not set {key} (use the keyword, retries are the harness')")
        self.model = model
        self.base_url = base_url
        self.api_key_secret = api_key_secret
        self.pricing = pricing
        self.streaming = streaming
        self.options: dict[str, Any] = dict(options)
        self._client_options = client_options
        self._api_key = api_key.get_secret_value() if isinstance(api_key, SecretStr) else api_key
        if isinstance(self._api_key, str) and (problem := key_problem(self._api_key)) is not None:
            raise DefinitionError(f"{name}: api_key= {problem}")
        self._clients: dict[str | None, Any] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._sdk: ModuleType | None = None
        _ = self.sdk  # a missing extra fails here, when the harness is defined, with the pip command

    def __repr__(self) -> str:  # never the key, nor a password in the base URL
        base = f", base_url={self.shown_url!r}" if self.base_url else ""
        return f"{type(self).__name__}(model={self.model!r}{base})"

    @property
    def shown_url(self) -> str | None:
        """``base_url`` as it may be shown (a repr, a message): without user info
        (``http://bob:pass@host`` -> ``http://***@host``)."""
        return None if self.base_url is None else _without_userinfo(self.base_url)

    # -- SDK and clients ------------------------------------------------------------------

    @property
    def sdk(self) -> ModuleType:
        if self._sdk is None:
            self._sdk = load_sdk(self.sdk_module, f"{type(self).__name__}", self.extra)
        return self._sdk

    def _key(self, secrets: Mapping[str, str] | None) -> str | None:
        if self.api_key_secret is None:
            return self._api_key
        key = (secrets or {}).get(self.api_key_secret)
        if not key:
            raise ModelError(
                f"{self.provider}: the session has no secret {self.api_key_secret!r} holding the API key "
                f"(pass it in host.open(..., secrets={{{self.api_key_secret!r}: ...}}))",
                transient=False,
                kind="config",
            )
        problem = key_problem(key)
        if problem is not None:
            raise ModelError(f"{self.provider}: the API key in the session secret {self.api_key_secret!r} {problem}",
                             transient=False, kind="config")
        return key

    def _make_client(self, api_key: str | None) -> Any:
        raise NotImplementedError

    def client(self, secrets: Mapping[str, str] | None = None) -> tuple[Any, str | None]:
        """The SDK client for the key in use (one per key and event loop), and that key (the
        one the SDK found in its environment variable when the model names none: an error
        that repeats it is scrubbed of it too)."""
        key = self._key(secrets)
        loop = asyncio.get_running_loop()
        if self._loop is not loop:  # an HTTP connection pool belongs to one event loop
            self._clients.clear()
            self._loop = loop
        client = self._clients.get(key)
        if client is None:
            client, problem = self._checked_client(key)
            if problem is not None:
                raise ModelError(problem, transient=False, kind="config")
            self._clients[key] = client
        if key is None:
            found = getattr(client, "api_key", None)
            key = found if isinstance(found, str) and found else None
        return client, key

    def _checked_client(self, key: str | None) -> tuple[Any, str | None]:
        """A new SDK client for ``key``, or why there is none (e.g. no key anywhere: the
        SDK found none in its environment variable either)."""
        try:
            client = self._make_client(key)
        except Exception as exc:  # noqa: BLE001 - a clear, permanent error
            if key is None and self._means_no_key(exc):
                return None, self._no_key_message()
            return None, self.scrub(f"{self.provider}: cannot make a client: {exc}", key)
        if not self._has_credentials(client):
            return None, self._no_key_message()
        found = getattr(client, "api_key", None)  # the SDK's own (from its environment variable)
        if key is None and isinstance(found, str) and (problem := key_problem(found)) is not None:
            return None, f"{self.provider}: the API key in {self.key_variable} {problem}"
        return client, None

    def config_problem(self) -> str | None:
        """Why no call of this model can work as configured, known before any call (no
        API key anywhere), or None. A key from a session secret is known per session only."""
        if self.api_key_secret is not None:
            return None
        return self._checked_client(self._api_key)[1]

    def _no_key_message(self) -> str:
        local = (f"; a server at {self.shown_url} that needs no key takes any, e.g. api_key='none'"
                 if self.base_url else "")
        return (f"{self.provider}: no API key: give the model api_key= (or api_key_secret=, the name of a "
                f"session secret), or set {self.key_variable} where the worker runs{local}")

    def _means_no_key(self, exc: Exception) -> bool:
        """Whether the SDK refused to make a client because it found no key."""
        return False

    def _has_credentials(self, client: Any) -> bool:
        return bool(getattr(client, "api_key", None))

    def split_options(self, create: Any, body: dict[str, Any]) -> dict[str, Any]:
        """``body`` as keyword arguments of the SDK's ``create``: options this SDK version
        does not name go into ``extra_body``, so every option reaches the provider as given."""
        try:
            params = inspect.signature(create).parameters
        except (TypeError, ValueError):
            return body
        if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
            return body
        known = {k: v for k, v in body.items() if k in params}
        unknown = {k: v for k, v in body.items() if k not in params}
        if unknown:
            known["extra_body"] = {**unknown, **(known.get("extra_body") or {})}
        return known

    async def aclose(self) -> None:
        """Close the HTTP clients (their connection pools); the adapter makes new ones if used again."""
        clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            await client.close()

    # -- errors ---------------------------------------------------------------------------

    def scrub(self, text: str, key: str | None) -> str:
        """``text`` without the key in use (nor anything shaped like an API key, nor the
        base URL's user info)."""
        for secret in (key, self._api_key):
            if secret:
                text = text.replace(secret, "[api key]")
        if self.base_url is not None and self.shown_url != self.base_url:
            text = text.replace(self.base_url, self.shown_url or "")
        return _MASKED.sub("[api key]", _KEY_LIKE.sub("[api key]", text))

    def not_the_api(self, body: Any, api: str) -> ModelError:
        """A 200 answer whose body is not the API's (a base_url that points at a web page)."""
        at = f" at {self.shown_url}" if self.base_url else ""
        return ModelError(
            f"{self.provider}: the server{at} answered with no {api} response (a wrong base_url?): {str(body)[:200]!r}",
            transient=False,
            kind="bad_response",
        )

    def cost(self, input_tokens: int, output_tokens: int, reported: Any) -> float | None:
        if self.pricing is not None:
            return self.pricing.cost(input_tokens, output_tokens)
        if isinstance(reported, (int, float)) and not isinstance(reported, bool):
            return float(reported)
        return None

    def _to(self, exc: BaseException) -> str:
        """'to <scheme://host:port/path> ' of the failed request ('' when the error has none): a
        refused connection says where, so a wrong base_url or a server not started is plain to see."""
        request = getattr(exc, "request", None)
        url = getattr(request, "url", None) if request is not None else None
        if url is not None and getattr(url, "host", None):  # no user info, no query: nothing secret
            port = f":{url.port}" if url.port else ""
            return f"to {url.scheme}://{url.host}{port}{url.path} "
        return ""

    def model_error(self, exc: BaseException, key: str | None) -> ModelError:
        """The SDK's exception as a classified ``ModelError`` (credentials removed)."""
        if isinstance(exc, ModelError):
            return exc
        sdk = self.sdk
        status: int | None = None
        retry_after: float | None = None
        if isinstance(exc, sdk.APIStatusError) and int(exc.status_code) < 400:
            # An error event inside a stream that began 200 OK: its type says what happened.
            body = getattr(exc, "body", None)
            message = _provider_message(body) or str(getattr(exc, "message", exc))
            like = _ERROR_TYPES.get(_error_type(body) or "", 500)
            transient = like in _TRANSIENT_STATUS or like >= 500
            kind = _KINDS.get(like, "server_error" if like >= 500 else "client_error")
            text = f"{self.provider}: error during the stream ({kind}): {message}"
            too_big = _too_big(like, body, message)
            if too_big is not None:  # refused as the same HTTP error would be: never retried
                return too_big(self.scrub(text, key))
        elif isinstance(exc, sdk.APIStatusError):
            status = int(exc.status_code)
            response = getattr(exc, "response", None)
            retry_after = retry_after_seconds(getattr(response, "headers", None))
            message = _provider_message(getattr(exc, "body", None)) or str(getattr(exc, "message", exc))
            transient = status in _TRANSIENT_STATUS or status >= 500
            kind = _KINDS.get(status, "server_error" if status >= 500 else "client_error")
            if _out_of_quota(getattr(exc, "body", None)):
                # OpenAI says "429" for a spent budget too: no wait brings it back, a person must.
                transient, kind = False, "quota"
            text = f"{self.provider}: HTTP {status} {kind}: {_plain(message)}"
            too_big = _too_big(status, getattr(exc, "body", None), message)
            if too_big is not None:
                return too_big(self.scrub(text, key), status=status)
        elif _bad_request_header(exc):
            # The HTTP client refused a header it was to send (a key with a line break ...) and its
            # message quotes that header whole: permanent, and not quoted.
            transient, kind, text = (
                False, "config", f"{self.provider}: a request header is not valid (an API key or a default_headers "
                "value with a line break or a space at an end?)")
        elif isinstance(exc, sdk.APITimeoutError):
            transient, kind, text = True, "timeout", f"{self.provider}: the request timed out"
        elif isinstance(exc, sdk.APIConnectionError):
            cause = exc.__cause__ or exc.__context__
            detail = f" ({type(cause).__name__}: {cause})" if cause is not None else ""
            transient, kind, text = True, "connection", f"{self.provider}: connection {self._to(exc)}failed{detail}"
        elif isinstance(exc, sdk.APIError):  # an error event in the middle of a stream
            body = getattr(exc, "body", None)
            message = _provider_message(body) or str(getattr(exc, "message", exc))
            transient, kind, text = True, "stream_error", f"{self.provider}: error during the stream: {message}"
            too_big = _too_big(_stream_status(body), body, message)
            if too_big is not None:  # (OpenAI-compatible servers: vLLM, llama.cpp ...)
                return too_big(self.scrub(text, key))
        elif isinstance(exc, _transport_errors()):
            transient, kind, text = (
                True, "connection", f"{self.provider}: connection {self._to(exc)}failed ({type(exc).__name__}: {exc})")
        elif isinstance(exc, (TimeoutError, ConnectionError)):
            transient, kind, text = True, "connection", f"{self.provider}: {type(exc).__name__}: {exc}"
        else:
            transient, kind, text = False, "unexpected", f"{self.provider}: {type(exc).__name__}: {exc}"
        return ModelError(self.scrub(text, key), transient=transient, status=status, retry_after=retry_after, kind=kind)


_CONTEXT_CODES = frozenset({"context_length_exceeded", "exceed_context_size_error"})
"""Error codes/types that say the request is over the context window (OpenAI, Groq ...;
llama.cpp's server)."""
_CONTEXT_WORDS = re.compile(
    r"context[ _]length|maximum context|context (?:window|size)|exceed context limit|prompt is too long", re.IGNORECASE
)
"""How the others say it: Anthropic ``prompt is too long: N tokens > M maximum`` or
``input length and max_tokens exceed context limit``; vLLM and DeepSeek ``This model's
maximum context length is N tokens``; Ollama ``... exceeds the context length``."""


def context_overflow(status: int | None, body: Any, message: str) -> bool:
    """Whether an HTTP error answer refuses the request as longer than the model's
    context window (a 400, or a 413 from some OpenAI-compatible servers)."""
    if status not in (400, 413):
        return False
    error = body.get("error", body) if isinstance(body, Mapping) else None
    if isinstance(error, Mapping) and ({error.get("code"), error.get("type")} & _CONTEXT_CODES):
        return True
    return bool(_CONTEXT_WORDS.search(message))


def _too_big(status: int | None, body: Any, message: str) -> type[ContextTooLong] | None:
    """``ContextTooLong`` for an error that refuses the request as over the context window,
    ``RequestTooLarge`` for any other 413 (a body over the provider's or a proxy's size
    limit: Anthropic's ``request_too_large``), else None."""
    if context_overflow(status, body, message):
        return ContextTooLong
    return RequestTooLarge if status == 413 else None


def _stream_status(body: Any) -> int | None:
    """The HTTP status an OpenAI-compatible server's mid-stream error object stands for: its
    numeric ``code`` (vLLM and llama.cpp send one), else its ``type`` when it is one of
    Anthropic's names, else 400 (only what :func:`context_overflow` reads depends on it)."""
    error = body.get("error", body) if isinstance(body, Mapping) else None
    if not isinstance(error, Mapping):
        return None
    code = error.get("code")
    if isinstance(code, str) and code.isdigit():
        code = int(code)
    if isinstance(code, int) and not isinstance(code, bool) and 400 <= code <= 599:
        return code
    return _ERROR_TYPES.get(str(error.get("type") or ""), 400)


_TAGS = re.compile(r"<[^>]*>")


def _plain(message: str) -> str:
    """A provider's message on one line; an HTML page (a proxy's 413, 502 ...) as its text,
    at most 300 characters of it."""
    if re.search(r"<\s*(?:html|head|body|title|h1|center)\b", message, re.IGNORECASE):
        text = " ".join(_TAGS.sub(" ", message).split())
        return text if len(text) <= 300 else text[:299] + "…"
    return " ".join(message.split()) if "\n" in message else message


def _bad_request_header(exc: BaseException) -> bool:
    """Whether the HTTP client refused to send a header of the request (``LocalProtocolError``
    of h11, raised as it is or as the cause of the SDK's connection error)."""
    for e in (exc, exc.__cause__, exc.__context__):
        if e is not None and type(e).__name__ == "LocalProtocolError" and "header" in str(e).lower():
            return True
    return False


_ERROR_TYPES = {
    "invalid_request_error": 400, "authentication_error": 401, "billing_error": 402, "permission_error": 403,
    "not_found_error": 404, "request_too_large": 413, "rate_limit_error": 429, "api_error": 500,
    "timeout_error": 504, "overloaded_error": 529,
}
"""Error types of an error event in a stream -> the HTTP status they stand for."""


def _out_of_quota(body: Any) -> bool:
    """An error body saying the account's quota or credit is spent (``insufficient_quota``)."""
    error = body.get("error", body) if isinstance(body, Mapping) else None
    return isinstance(error, Mapping) and "insufficient_quota" in (error.get("type"), error.get("code"))


def _error_type(body: Any) -> str | None:
    if isinstance(body, Mapping):
        error = body.get("error", body)
        if isinstance(error, Mapping) and isinstance(error.get("type"), str):
            return str(error["type"])
    return None


def _provider_message(body: Any) -> str | None:
    """``error.message`` of a provider's error body (OpenAI and Anthropic shapes)."""
    if isinstance(body, Mapping):
        error = body.get("error", body)
        if isinstance(error, Mapping) and isinstance(error.get("message"), str):
            return str(error["message"])
        if isinstance(body.get("message"), str):
            return str(body["message"])
    if isinstance(body, str) and body:
        return body
    return None
