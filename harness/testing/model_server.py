"""A local HTTP server that speaks the parts of the OpenAI Chat Completions and Anthropic
Messages APIs the adapters use, streaming (SSE) and not, scripted per test.

The real SDKs talk to it through ``base_url`` (``server.openai_url`` /
``server.anthropic_url``), so tests see the exact request bodies the adapters send
and the SDKs parse real provider-shaped answers. No network: it listens on 127.0.0.1.

    with ModelServer() as server:
        server.script(Reply(text="hello"), Fail(429, "slow down", headers={"retry-after": "2"}))
        model = OpenAIChat(model="gpt-test", base_url=server.openai_url, api_key="sk-test")

Each request takes the next scripted answer (or ``server.handler(request)`` when set):

* :class:`Reply`: text and tool calls in provider-neutral terms, rendered as the
  endpoint's JSON, or as its SSE stream when the request asks to stream; its faults:
  ``cut_after=n`` closes the connection after n events (a stream cut half-way),
  ``pause_after=n`` stops after n events until :meth:`ModelServer.release`;
  ``error_after=n`` sends an error event after n events (``error_type``, ``error_message``;
  OpenAI streams: a ``data:`` chunk ``{"error": {...}}``, with ``error_code`` when set,
  as vLLM and llama.cpp send it; ``error_bare=True``: the object itself, ``{"object":
  "error", ...}``, as older vLLM builds send it); ``end_after=n`` ends the body
  cleanly after n events (the answer's last events never come); as older OpenAI-compatible
  servers do, ``send_finish=False`` leaves every chunk's ``finish_reason`` null and
  ``send_done=False`` ends the stream without ``data: [DONE]``;
  ``thinking``: Anthropic thinking / redacted_thinking blocks, first in the answer (streamed
  as ``thinking_delta`` pieces and one ``signature_delta``; a redacted block whole);
* :class:`Fail`: an HTTP error status with the provider's error body and headers (or,
  ``html=``, a proxy's error page; ``bare=True``, OpenAI-compatible: the error object not
  wrapped in ``"error"``, ``{"object": "error", "message": ..., "code": 400}``, as older
  vLLM builds answer);
* :class:`Hang`: no answer at all until released (for client timeouts).

As the real Messages API does, a request with extended thinking enabled whose last
assistant message holds a ``tool_use`` but does not start with a thinking block is
answered 400 (``invalid_request_error``), without taking a scripted answer.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any

from harness.observability.server import QuietHTTPServer

__all__ = ["Fail", "Hang", "ModelServer", "Reply", "Request"]


@dataclass(frozen=True)
class Reply:
    """A model answer. ``tool_calls``: ``(id, name, arguments)``; arguments a dict or raw text.

    ``finish``: ``stop`` / ``tool_calls`` / ``length`` (provider-neutral), by default
    ``tool_calls`` when there are calls, else ``stop``.
    """

    text: str | None = None
    tool_calls: tuple[tuple[str, str, dict[str, Any] | str], ...] = ()
    finish: str | None = None
    usage: tuple[Any, Any] = (11, 7)  # (input, output) tokens; odd values (None, "n/a") are sent as they are
    model: str | None = None  # default: the model the request named
    chunk: int = 4  # characters per streamed piece
    cut_after: int | None = None
    pause_after: int | None = None
    error_after: int | None = None
    error_type: str = "overloaded_error"
    error_message: str = "the server failed during the stream"
    error_code: Any = None  # OpenAI streams: the error object's ``code`` (vLLM, llama.cpp: 400)
    error_bare: bool = False  # OpenAI streams: the error object not wrapped in "error" (older vLLM)
    end_after: int | None = None  # end the body cleanly after n events: an answer without its end
    send_finish: bool = True  # OpenAI streams: False = no chunk carries a finish_reason
    send_done: bool = True  # OpenAI streams: False = no closing "data: [DONE]"
    thinking: tuple[dict[str, str], ...] = ()  # Anthropic: {"type": "thinking", ...} / {"type": "redacted_thinking", ...}

    @property
    def finish_reason(self) -> str:
        return self.finish or ("tool_calls" if self.tool_calls else "stop")


@dataclass(frozen=True)
class Fail:
    """An HTTP error answer in the provider's shape."""

    status: int
    message: str
    headers: dict[str, str] = field(default_factory=dict)
    error_type: str | None = None
    code: str | None = None  # OpenAI's ``error.code`` (e.g. ``context_length_exceeded``)
    html: str | None = None  # a body that is no JSON but this page (a proxy's error page)
    bare: bool = False  # OpenAI-compatible: the error object not wrapped in "error" (older vLLM)


@dataclass(frozen=True)
class Hang:
    """No answer until :meth:`ModelServer.release` (or the server closes)."""


Script = Reply | Fail | Hang


@dataclass(frozen=True)
class Request:
    """A request the server received."""

    path: str
    headers: dict[str, str]
    body: dict[str, Any]

    @property
    def api(self) -> str:
        return "anthropic" if self.path.endswith("/messages") else "openai"


_OPENAI_FINISH = {"stop": "stop", "tool_calls": "tool_calls", "length": "length"}
_ANTHROPIC_FINISH = {"stop": "end_turn", "tool_calls": "tool_use", "length": "max_tokens"}
_OPENAI_ERROR_TYPES = {400: "invalid_request_error", 401: "invalid_request_error", 403: "permission_error",
                       404: "invalid_request_error", 429: "rate_limit_error"}
_ANTHROPIC_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                          404: "not_found_error", 429: "rate_limit_error", 529: "overloaded_error"}


def _args_text(arguments: dict[str, Any] | str) -> str:
    return arguments if isinstance(arguments, str) else json.dumps(arguments, separators=(",", ":"))


def _total(i: Any, o: Any) -> Any:
    """``total_tokens`` of a usage whose counts may be odd on purpose (null, text ...)."""
    return i + o if isinstance(i, int) and isinstance(o, int) else None


def _pieces(text: str, size: int) -> list[str]:
    return [text[i:i + size] for i in range(0, len(text), max(1, size))]


# -- rendering: OpenAI Chat Completions -------------------------------------------------------


def openai_json(reply: Reply, model: str, n: int) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": reply.text}
    if reply.tool_calls:
        message["tool_calls"] = [
            {"id": cid, "type": "function", "function": {"name": name, "arguments": _args_text(args)}}
            for cid, name, args in reply.tool_calls
        ]
    i, o = reply.usage
    return {
        "id": f"chatcmpl-{n}", "object": "chat.completion", "created": 1_700_000_000, "model": reply.model or model,
        "choices": [{"index": 0, "message": message, "finish_reason": _OPENAI_FINISH[reply.finish_reason], "logprobs": None}],
        "usage": {"prompt_tokens": i, "completion_tokens": o, "total_tokens": _total(i, o)},
    }


def openai_events(reply: Reply, model: str, n: int, include_usage: bool) -> Iterator[tuple[str | None, str]]:
    def chunk(delta: dict[str, Any], finish: str | None = None) -> tuple[None, str]:
        body = {"id": f"chatcmpl-{n}", "object": "chat.completion.chunk", "created": 1_700_000_000,
                "model": reply.model or model, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
        return None, json.dumps(body)

    yield chunk({"role": "assistant", "content": ""})
    for piece in _pieces(reply.text or "", reply.chunk):
        yield chunk({"content": piece})
    for index, (cid, name, args) in enumerate(reply.tool_calls):
        yield chunk({"tool_calls": [{"index": index, "id": cid, "type": "function", "function": {"name": name, "arguments": ""}}]})
        for piece in _pieces(_args_text(args), reply.chunk):
            yield chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
    yield chunk({}, _OPENAI_FINISH[reply.finish_reason] if reply.send_finish else None)
    if include_usage:
        i, o = reply.usage
        body = {"id": f"chatcmpl-{n}", "object": "chat.completion.chunk", "created": 1_700_000_000,
                "model": reply.model or model, "choices": [],
                "usage": {"prompt_tokens": i, "completion_tokens": o, "total_tokens": _total(i, o)}}
        yield None, json.dumps(body)
    if reply.send_done:
        yield None, "[DONE]"


# -- rendering: Anthropic Messages ---------------------------------------------------------------


def anthropic_json(reply: Reply, model: str, n: int) -> dict[str, Any]:
    content: list[dict[str, Any]] = [dict(b) for b in reply.thinking]
    if reply.text:
        content.append({"type": "text", "text": reply.text})
    for cid, name, args in reply.tool_calls:
        content.append({"type": "tool_use", "id": cid, "name": name, "input": args if isinstance(args, dict) else {}})
    i, o = reply.usage
    return {
        "id": f"msg_{n}", "type": "message", "role": "assistant", "model": reply.model or model, "content": content,
        "stop_reason": _ANTHROPIC_FINISH[reply.finish_reason], "stop_sequence": None,
        "usage": {"input_tokens": i, "output_tokens": o},
    }


def anthropic_events(reply: Reply, model: str, n: int) -> Iterator[tuple[str | None, str]]:
    def event(kind: str, body: dict[str, Any]) -> tuple[str, str]:
        return kind, json.dumps({"type": kind, **body})

    i, o = reply.usage
    message: dict[str, Any] = {"id": f"msg_{n}", "type": "message", "role": "assistant", "model": reply.model or model, "content": [],
               "stop_reason": None, "stop_sequence": None, "usage": {"input_tokens": i, "output_tokens": 1}}
    yield event("message_start", {"message": message})
    index = 0
    for thought in reply.thinking:
        if thought["type"] == "thinking":
            yield event("content_block_start", {"index": index, "content_block": {"type": "thinking", "thinking": ""}})
            for piece in _pieces(thought["thinking"], reply.chunk):
                yield event("content_block_delta", {"index": index, "delta": {"type": "thinking_delta", "thinking": piece}})
            yield event("content_block_delta", {"index": index, "delta": {"type": "signature_delta", "signature": thought["signature"]}})
        else:
            yield event("content_block_start", {"index": index, "content_block": dict(thought)})
        yield event("content_block_stop", {"index": index})
        index += 1
    if reply.text:
        yield event("content_block_start", {"index": index, "content_block": {"type": "text", "text": ""}})
        for piece in _pieces(reply.text, reply.chunk):
            yield event("content_block_delta", {"index": index, "delta": {"type": "text_delta", "text": piece}})
        yield event("content_block_stop", {"index": index})
        index += 1
    for cid, name, args in reply.tool_calls:
        block = {"type": "tool_use", "id": cid, "name": name, "input": {}}
        yield event("content_block_start", {"index": index, "content_block": block})
        for piece in _pieces(_args_text(args), reply.chunk):
            yield event("content_block_delta", {"index": index, "delta": {"type": "input_json_delta", "partial_json": piece}})
        yield event("content_block_stop", {"index": index})
        index += 1
    yield event("message_delta", {"delta": {"stop_reason": _ANTHROPIC_FINISH[reply.finish_reason], "stop_sequence": None},
                                  "usage": {"output_tokens": o}})
    yield event("message_stop", {})


# -- the server -------------------------------------------------------------------------------------


class ModelServer:
    """The scripted provider server (see the module doc). Thread-safe; start() or use ``with``."""

    def __init__(self) -> None:
        self.requests: list[Request] = []
        self.handler: Callable[[Request], Script] | None = None
        self.paused = threading.Event()  # a stream reached its pause_after point
        self._script: list[Script] = []
        self._lock = threading.Lock()
        self._release = threading.Event()
        self._stopping = threading.Event()
        self._httpd: QuietHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle --

    def start(self) -> ModelServer:
        server = self

        class Handler(_Handler):
            owner = server

        self._httpd = QuietHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="model-server", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        self._stopping.set()
        self._release.set()
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None

    def __enter__(self) -> ModelServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def url(self) -> str:
        assert self._httpd is not None, "start() the server first"
        return f"http://127.0.0.1:{self._httpd.server_address[1]}"

    @property
    def openai_url(self) -> str:
        """``base_url`` for the OpenAI SDK (and ``openai+<url>:<model>`` URIs)."""
        return f"{self.url}/v1"

    @property
    def anthropic_url(self) -> str:
        """``base_url`` for the Anthropic SDK."""
        return self.url

    # -- the script --

    def script(self, *answers: Script) -> None:
        """Queue answers for the next requests, in order."""
        with self._lock:
            self._script.extend(answers)

    @property
    def pending(self) -> int:
        with self._lock:
            return len(self._script)

    def release(self) -> None:
        """Let every paused stream and hung request go on (a paused stream then finishes)."""
        self._release.set()

    def _next(self, request: Request) -> Script:
        with self._lock:
            self.requests.append(request)
            if self.handler is not None:
                return self.handler(request)
            if not self._script:
                return Fail(500, "the test server has no scripted answer for this request", error_type="api_error")
            return self._script.pop(0)

    def _wait_release(self) -> bool:
        """Block until released; False if the server is closing."""
        self._release.wait()
        return not self._stopping.is_set()


def _thinking_problem(body: dict[str, Any]) -> str | None:
    """The Messages API's refusal of a tool-use continuation without its thinking blocks."""
    if not isinstance(body.get("thinking"), dict) or body["thinking"].get("type") != "enabled":
        return None
    messages = body.get("messages") or []
    last = max((i for i, m in enumerate(messages) if m.get("role") == "assistant"), default=None)
    if last is None or not isinstance(messages[last].get("content"), list):
        return None
    content = messages[last]["content"]
    if not any(b.get("type") == "tool_use" for b in content):
        return None
    first = content[0].get("type") if content else None
    if first in ("thinking", "redacted_thinking"):
        return None
    return (f"messages.{last}.content.0.type: Expected `thinking` or `redacted_thinking`, but found `{first}`. "
            "When `thinking` is enabled, a final `assistant` message must start with a thinking block")


class _Handler(BaseHTTPRequestHandler):
    owner: ModelServer
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:  # quiet
        pass

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b"{}"
        try:
            body = json.loads(raw)
        except ValueError:
            body = {"_raw": raw.decode("utf-8", "replace")}
        path = self.path.split("?", 1)[0]
        request = Request(path=path, headers={k.lower(): v for k, v in self.headers.items()}, body=body)
        if not (path.endswith("/chat/completions") or path.endswith("/messages")):
            self._json(404, {"error": {"message": f"no route {path}", "type": "not_found_error"}})
            return
        problem = _thinking_problem(body) if request.api == "anthropic" else None
        if problem is not None:
            with self.owner._lock:
                self.owner.requests.append(request)
            self._fail(request, Fail(400, problem))
            return
        answer = self.owner._next(request)
        if isinstance(answer, Hang):
            self.owner._wait_release()
            self.close_connection = True
            return
        if isinstance(answer, Fail):
            self._fail(request, answer)
            return
        model = str(body.get("model") or "test-model")
        n = len(self.owner.requests)
        if not body.get("stream"):
            rendered = openai_json(answer, model, n) if request.api == "openai" else anthropic_json(answer, model, n)
            self._json(200, rendered)
            return
        if request.api == "openai":
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            events = list(openai_events(answer, model, n, include_usage))
        else:
            events = list(anthropic_events(answer, model, n))
        self._stream(request, answer, events)

    # -- writing --

    def _json(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
        data = json.dumps(body).encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(data)

    def _fail(self, request: Request, fail: Fail) -> None:
        if fail.html is not None:
            data = fail.html.encode("utf-8")
            self.send_response(fail.status)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return
        if request.api == "openai" and fail.bare:  # older vLLM: {"object": "error", "message": ..., "code": 400}
            body: dict[str, Any] = {"object": "error", "message": fail.message,
                                    "type": fail.error_type or "BadRequestError", "param": None,
                                    "code": fail.code if fail.code is not None else fail.status}
        elif request.api == "openai":
            kind = fail.error_type or _OPENAI_ERROR_TYPES.get(fail.status, "server_error")
            body = {"error": {"message": fail.message, "type": kind, "param": None, "code": fail.code}}
        else:
            kind = fail.error_type or _ANTHROPIC_ERROR_TYPES.get(fail.status, "api_error")
            body = {"type": "error", "error": {"type": kind, "message": fail.message}}
        self._json(fail.status, body, fail.headers)

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def _stream(self, request: Request, reply: Reply, events: list[tuple[str | None, str]]) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        try:
            self._events(request, reply, events)
        except OSError:  # the client went away (killed, timed out): nothing to answer
            self.close_connection = True

    def _events(self, request: Request, reply: Reply, events: list[tuple[str | None, str]]) -> None:
        for count, (kind, data) in enumerate(events):
            if count == reply.cut_after:
                self._cut()
                return
            if count == reply.error_after:
                self._error_event(request, reply)
                break
            if count == reply.end_after:
                break
            if count == reply.pause_after:
                self.owner.paused.set()
                if not self.owner._wait_release():
                    self._cut()
                    return
            self._chunk((f"event: {kind}\n" if kind else "").encode() + f"data: {data}\n\n".encode())
        self._chunk(b"")  # the last chunk: the stream ends cleanly

    def _error_event(self, request: Request, reply: Reply) -> None:
        error: dict[str, Any] = {"type": reply.error_type, "message": reply.error_message}
        if request.api == "openai":
            if reply.error_code is not None:
                error["code"] = reply.error_code
            if reply.error_bare:  # older vLLM: the error object itself, "object": "error"
                self._chunk(f"data: {json.dumps({'object': 'error', **error, 'param': None})}\n\n".encode())
            else:
                self._chunk(f"data: {json.dumps({'error': error})}\n\n".encode())
        else:
            self._chunk(f"event: error\ndata: {json.dumps({'type': 'error', 'error': error})}\n\n".encode())

    def _cut(self) -> None:
        """Drop the connection mid-body (an incomplete chunked stream)."""
        self.close_connection = True
        try:
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
