"""The gateway's ASGI middleware: the client address behind trusted proxies, the Host check,
the body size limit, request metrics, security headers, and session ids holding a ``/`` (sent percent-encoded) kept as one path
segment."""

from __future__ import annotations

import time
from typing import Any
from urllib.parse import quote, unquote, unquote_to_bytes

from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from harness.services.gateway.hosts import host_allowed
from harness.services.gateway.proxies import TrustedProxies

__all__ = [
    "CONSOLE_CSP",
    "SESSIONS_PATH",
    "AllowedHosts",
    "BodyLimit",
    "EncodedSlashes",
    "ForwardedClient",
    "RequestMetrics",
    "SecurityHeaders",
    "session_path",
    "session_url_path",
]


class ForwardedClient:
    """Sets the request's client address (``scope["client"]``) to the one a trusted proxy
    names in ``X-Forwarded-For``, and its scheme to ``X-Forwarded-Proto`` (see
    :mod:`harness.services.gateway.proxies`); from any other peer both headers are ignored.
    (It replaces uvicorn's ``proxy_headers``, which the gateway turns off: the app decides
    whom it trusts, whatever server runs it, and a malformed entry is refused at start.)
    """

    def __init__(self, app: ASGIApp, proxies: TrustedProxies) -> None:
        self.app = app
        self.proxies = proxies

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        client = scope.get("client")
        peer = client[0] if client else None
        if self.proxies.trusts(peer):
            forwarded: list[str] = []
            proto: str | None = None
            for name, value in scope.get("headers", ()):
                if name == b"x-forwarded-for":
                    forwarded.append(value.decode("latin-1"))
                elif name == b"x-forwarded-proto":
                    proto = value.decode("latin-1").strip().lower()
            host = self.proxies.client(peer, forwarded)
            changed: dict[str, Any] = {}
            if host != peer:
                changed["client"] = (host, 0)
            if proto in ("http", "https"):
                changed["scheme"] = proto if scope["type"] == "http" else proto.replace("http", "ws")
            if changed:
                scope = {**scope, **changed}
        await self.app(scope, receive, send)


class AllowedHosts:
    """400 for a request whose ``Host`` header names no host of ``patterns`` (see
    :mod:`harness.services.gateway.hosts`: a DNS-rebinding page sends its own name).

    The answer says which Host was refused (shortened, as a quoted string) and which option
    allows it, not the names that are allowed; nothing is logged (the header is the caller's).
    """

    def __init__(self, app: ASGIApp, patterns: tuple[str, ...]) -> None:
        self.app = app
        self.patterns = patterns

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        host: str | None = None
        for name, value in scope.get("headers", ()):
            if name == b"host":
                host = value.decode("latin-1")
                break
        if host_allowed(host, self.patterns):
            await self.app(scope, receive, send)
            return
        if host is None or not host.strip():  # (an HTTP/1.0 client may send none: no name to add)
            detail = ("a request without a Host header is not served here: send the host you reach the gateway "
                      "by as Host (any HTTP/1.1 client does); --allowed-hosts names the hosts served")
        else:
            detail = (f"Host {host[:100]!r} is not served here: add the name to --allowed-hosts "
                      "(HARNESS_GATEWAY_ALLOWED_HOSTS)")
        if scope["type"] == "websocket":  # (the gateway has none; refused all the same)
            await send({"type": "websocket.close", "code": 1008})
            return
        await JSONResponse({"detail": detail}, status_code=400)(scope, receive, send)


class BodyLimit:
    """413 for a body over ``limit`` bytes, by Content-Length or as it streams in."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                try:
                    too_big = int(value) > self.limit
                except ValueError:
                    too_big = False
                if too_big:
                    await self._refuse(scope, receive, send)
                    return
        # A body without a Content-Length (chunked) is counted as it streams in. Past the
        # limit the route is told the body ended there and its answer is replaced by the 413
        # (an exception raised here would reach the route's body parsing as a 400).
        seen = 0
        too_big = False
        refused = False

        async def limited() -> Message:
            nonlocal seen, too_big
            if too_big:
                return {"type": "http.request", "body": b"", "more_body": False}
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    too_big = True
                    return {"type": "http.request", "body": b"", "more_body": False}
            return message

        async def sending(message: Message) -> None:
            nonlocal refused
            if not too_big:
                await send(message)
            elif not refused:
                refused = True
                await self._refuse(scope, receive, send)

        await self.app(scope, limited, sending)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        response = JSONResponse({"detail": f"request body over {self.limit} bytes"}, status_code=413)
        await response(scope, receive, send)


class RequestMetrics:
    """Counts each request by its route template (pure ASGI: streams pass through untouched)."""

    def __init__(self, app: ASGIApp, metrics: Any) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500

        async def sending(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            template = getattr(scope.get("route"), "path", "other")
            self.metrics.http_request(template, scope.get("method", "GET"), status, time.perf_counter() - started)


CONSOLE_CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
               "form-action 'self'; base-uri 'none'; frame-ancestors 'none'")
"""The console's Content-Security-Policy: its own script and style only (it has no inline
script, style or handler), fetches to the gateway only, never in a frame. It renders every
value as text (``el()`` in ``app.js``); this makes an injected ``<script>`` or ``onerror=`` inert
should that ever change, and keeps the token in its localStorage from other origins' frames."""
API_CSP = "default-src 'none'; frame-ancestors 'none'"
"""JSON and event streams are data: a browser that opens one directly runs nothing from it."""
DOCS_CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
            "form-action 'self'; base-uri 'none'; frame-ancestors 'none'")
"""The API reference page ``/docs`` (:mod:`harness.services.gateway.apidocs`): Swagger UI's files
and its start script come from the gateway (no CDN, no inline script); its "Try it out" calls
go to the gateway only; never in a frame."""


class SecurityHeaders:
    """Adds ``X-Content-Type-Options: nosniff``, ``X-Frame-Options: DENY``, ``Referrer-Policy:
    no-referrer`` and a Content-Security-Policy (:data:`CONSOLE_CSP` for the console, stricter
    for the API) to every response that does not set them itself. No CORS header is ever
    sent: a page of another origin cannot read the API (nor send it JSON: the preflight fails)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "")
        if path == "/" or path.startswith("/console/"):
            csp = CONSOLE_CSP
        elif path == "/docs" or path.startswith("/docs/"):
            csp = DOCS_CSP
        else:
            csp = API_CSP
        extra = [
            (b"x-content-type-options", b"nosniff"),
            (b"x-frame-options", b"DENY"),
            (b"referrer-policy", b"no-referrer"),
            (b"content-security-policy", csp.encode("ascii")),
        ]

        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", ()))
                present = {name.lower() for name, _ in headers}
                headers.extend((name, value) for name, value in extra if name not in present)
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, sending)


SESSIONS_PATH = "/v1/sessions/"


class EncodedSlashes:
    """Lets a session id hold a ``/``: in a URL it is sent percent-encoded, ``team%2Falice``.

    The ASGI server decodes the path before routing, so ``/v1/sessions/team%2Falice/events``
    reaches the router as ``/v1/sessions/team/alice/events``, which no route takes. The
    undecoded ``raw_path`` still tells an encoded ``/`` from a separator: this puts the
    session id's segment back as ONE segment, its ``%`` and ``/`` encoded (``%25``, ``%2F``),
    and the routes' ``SessionId`` decodes it. A path whose session segment holds no ``%``
    is left as it is (nothing to tell apart), and so is one whose ``raw_path`` does not
    decode to the server's ``path`` (a server that rewrote it: trust the server).
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            raw = scope.get("raw_path")
            if raw and b"%" in raw and SESSIONS_PATH in scope["path"]:
                if not _session_segment_is_utf8(raw.decode("latin-1")):
                    await JSONResponse({"detail": [{"loc": ["path", "session_id"], "msg": NOT_UTF8, "type": "value_error"}]},
                                       status_code=422)(scope, receive, send)
                    return
                path = session_path(raw.decode("latin-1"), scope["path"])
                if path is not None:
                    scope = {**scope, "path": path}
        await self.app(scope, receive, send)


NOT_UTF8 = ("the session id in the path is not UTF-8 once percent-decoded: percent-encode the id's UTF-8 bytes "
            "('é' as %C3%A9, not %E9)")


def _session_segment_is_utf8(raw: str) -> bool:
    """Whether the session id's segment of the undecoded path decodes as UTF-8. The server
    decodes it with replacement: ``%FF`` and ``%FE`` would both be the session ``'\ufffd'``,
    neither the one the client named."""
    segments = raw.split("?", 1)[0].split("/")
    for at in range(2, len(segments)):
        if segments[at - 2:at] == ["v1", "sessions"]:
            try:
                unquote_to_bytes(segments[at]).decode("utf-8")
            except UnicodeDecodeError:
                return False
            return True
    return True


def session_path(raw: str, path: str) -> str | None:
    """``path`` with its session id's segment kept as one segment (see :class:`EncodedSlashes`),
    or None to leave it as it is."""
    segments = raw.split("/")
    if unquote("/".join(segments)) != path:
        return None
    for at in range(2, len(segments)):
        if segments[at - 2:at] == ["v1", "sessions"]:
            if "%" not in segments[at]:
                return None
            decoded = [unquote(segment) for segment in segments]
            decoded[at] = decoded[at].replace("%", "%25").replace("/", "%2F")
            return "/".join(decoded)
    return None


def session_url_path(session_id: str, root_path: str = "") -> str:
    """The URL path of a session: its id percent-encoded as one path segment (``/`` as ``%2F``)."""
    return f"{root_path}{SESSIONS_PATH}{quote(session_id, safe='')}"
