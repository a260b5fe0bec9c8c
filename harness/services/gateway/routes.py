"""The gateway's HTTP routes (FastAPI) and their path and query parameters. The request and
response bodies (pydantic models, 422 on error) are in ``bodies``; who calls (authentication,
rate limits) in ``caller``."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable
from typing import Annotated, Any
from urllib.parse import unquote

from fastapi import FastAPI, Header, HTTPException, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, Response, StreamingResponse
from fastapi.routing import APIRoute
from pydantic import AfterValidator, BeforeValidator
from starlette.background import BackgroundTask

from harness.build import build_info
from harness.ids import MAX_ID, answer_input_id, session_id_problem
from harness.replay.conversation import conversation
from harness.services.gateway.auth import Principal
from harness.services.gateway.bodies import (
    AnswerIn,
    CancelIn,
    MessageIn,
    ReceiptOut,
    RecordsIn,
    SessionDetail,
    SessionPage,
    SummaryOut,
)
from harness.services.gateway.caller import Caller
from harness.services.gateway.hosts import allowed_hosts
from harness.services.gateway.middleware import (
    AllowedHosts,
    BodyLimit,
    EncodedSlashes,
    ForwardedClient,
    RequestMetrics,
    SecurityHeaders,
    session_url_path,
)
from harness.services.gateway.problems import Problem, install_problems
from harness.services.gateway.proxies import TrustedProxies
from harness.services.gateway.sessions import SessionView
from harness.services.gateway.sse import session_stream
from harness.services.gateway.state import GatewayState, TenantSlots, console_dir
from harness.services.gateway.waits import wait_while_served
from harness.views import SessionStateName, SessionSummary, open_sleeps, summarize, timeline

__all__ = ["SummaryOut", "install_head", "install_routes"]  # (SummaryOut: moved to bodies; the tests still take it from here)

SESSION_ID_HELP = (
    f"the session's id (yours; tenant-scoped): 1 to {MAX_ID} printable characters, no space at either end "
    "(harness.ids.session_id_problem, as the library and the CLI take it); in a URL it is one path segment, "
    "percent-encoded (a '/' in it as %2F)"
)


def _from_path(value: Any) -> Any:
    """A session id as the route got it, decoded: :class:`~harness.services.gateway.middleware.EncodedSlashes` sent its ``/`` and
    ``%`` as ``%2F`` and ``%25``; a segment without ``%`` comes as it is (unquote keeps it)."""
    return unquote(value) if isinstance(value, str) and "%" in value else value


def _session_id(value: str) -> str:
    """``value`` if the library takes it as a session id (its one rule and its words).

    Raises:
        ValueError: it does not (a 422 saying why).
    """
    problem = session_id_problem(value)
    if problem is not None:
        raise ValueError(problem)
    return value


SessionId = Annotated[
    str,
    Path(description=SESSION_ID_HELP),
    BeforeValidator(_from_path),
    AfterValidator(_session_id),
]
RETRY_AFTER_S = 5
"""What a 429 (a tenant holding its most streams or waiting requests) says in Retry-After."""
MAX_WAIT_S = 600.0
"""The longest a message or answer POST waits for its turn (``?wait=``); many proxies cut
idle requests sooner, so clients that wait long stream the events instead."""
WaitQuery = Annotated[
    float | None,
    Query(gt=0, le=MAX_WAIT_S, allow_inf_nan=False,
          description="seconds to wait for the turn to settle or to wait for a person"),
]


_ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": Problem, "description": "missing or invalid credentials"},
    404: {"model": Problem, "description": "no such session (for this tenant)"},
    413: {"model": Problem, "description": "request body too large"},
    429: {"model": Problem, "description": "this tenant holds its most open event streams or waiting requests, or "
          "sent more than --rate-limit allows, or this client address failed to authenticate more often than "
          "--auth-failure-limit allows (Retry-After says when to try again)"},
    503: {"model": Problem, "description": "the session log cannot be reached"},
}
_ANY_SESSION_ERRORS = {status: answer for status, answer in _ERRORS.items() if status != 404}
"""A route that takes any session id (a message starts a session; a stream waits for one's first
record) or none: never a 404 of its own."""
_POST_ERRORS: dict[int | str, dict[str, Any]] = {
    **_ERRORS,
    415: {"model": Problem, "description": "the body is not sent as 'Content-Type: application/json'"},
}


def install_routes(app: FastAPI, gw: GatewayState) -> None:
    app.add_middleware(BodyLimit, limit=gw.settings.max_body_bytes)

    patterns = allowed_hosts(gw.settings.allowed_hosts, gw.settings.host)
    if patterns is not None:  # before the body is read; a refusal is counted and has the headers below
        app.add_middleware(AllowedHosts, patterns=patterns)

    app.add_middleware(RequestMetrics, metrics=gw.metrics)

    app.add_middleware(EncodedSlashes)

    app.add_middleware(SecurityHeaders)  # a 413 has them too

    # Outermost: every part after it sees the client a trusted proxy names (the limits by address).
    app.add_middleware(ForwardedClient, proxies=TrustedProxies(gw.settings.forwarded_allow_ips))

    install_problems(app, gw.breaker)

    def log_id(who: Principal, session_id: str) -> str:
        """The log's id of the caller's ``session_id``.

        Raises:
            RequestValidationError: 422 for an id too long for the caller's tenant (the
                log's id holds the tenant: ``harness.ids.session_id_problem``).
            RequestValidationError: 422 for an id that would name another tenant's session: with no
                tenant (open access) the log's id is the id itself, and ``t/<tenant>/<id>``
                is how the log names a tenant's session (``harness.ids.tenant_session_id``).
        """
        problem = session_id_problem(session_id, who.tenant)  # (its log id: the tenant's prefix counts)
        if problem is not None:
            raise RequestValidationError([{"loc": ("path", "session_id"), "msg": problem, "type": "value_error"}])
        log_session_id = gw.log_id(who, session_id)
        if gw.owns(who, log_session_id) != session_id:
            raise _invalid(("path", "session_id"), f"session id {session_id!r} has the form t/<tenant>/<id>, which "
                           "is kept for the sessions of tenants: use another id")
        return log_session_id

    async def existing(who: Principal, session_id: str) -> SessionView:
        view = await gw.sessions.get(log_id(who, session_id))
        if not view.entries:
            raise HTTPException(404, f"no session {session_id!r}")
        return view

    def slot(slots: TenantSlots, who: Principal, what: str) -> Callable[[], None]:
        """A slot of ``slots`` for the caller's tenant (its release).

        Raises:
            HTTPException: 429 when the tenant holds all of them already.
        """
        release = slots.take(who.tenant)
        if release is None:
            raise HTTPException(429, f"too many {what} at once for this tenant (at most {slots.limit} per gateway): "
                                "close one, or try again later", headers={"Retry-After": str(RETRY_AFTER_S)})
        return release

    def receipt(r: Any) -> dict[str, Any]:
        out: dict[str, Any] = r.to_json()
        return out

    # -- health and console ----------------------------------------------------------------------

    @app.get("/healthz", include_in_schema=True, tags=["health"])
    async def healthz() -> dict[str, str | None]:
        """Alive; and which build answers (the package version, the source commit or null)."""
        build = build_info()
        return {"status": "ok", "version": build.version, "commit": build.commit}

    @app.get("/readyz", tags=["health"], responses={503: {"model": Problem}})
    async def readyz() -> JSONResponse:
        """Ready once the log answers (Kafka: its sessions topic exists; the gateway never creates it)."""
        if await gw.check_ready():
            return JSONResponse({"status": "ready"})
        return JSONResponse({"detail": f"not ready: {gw.not_ready}"}, status_code=503)

    @app.get("/", include_in_schema=False)
    async def console_index() -> FileResponse:
        return FileResponse(str(console_dir() / "index.html"), media_type="text/html")

    # HEAD too: a load balancer's probe may send it (a GET route of FastAPI takes only GET;
    # one route of both would be two operations of one id in the OpenAPI document).
    for probe, answer in (("/healthz", healthz), ("/readyz", readyz)):
        app.add_api_route(probe, answer, methods=["HEAD"], include_in_schema=False)

    @app.api_route("/favicon.ico", methods=["GET", "HEAD"], include_in_schema=False)
    async def favicon() -> Response:
        # A browser asks for it on every console page: no icon, and no 404 in its console.
        return Response(status_code=204, headers={"Cache-Control": "max-age=86400"})

    @app.get("/console/{name}", include_in_schema=False)
    async def console_file(name: Annotated[str, Path(pattern=r"^[a-z]+\.(js|css|html)$")]) -> FileResponse:
        path = console_dir() / name
        if not path.is_file():
            raise HTTPException(404, "no such file")
        media = {"js": "text/javascript", "css": "text/css", "html": "text/html"}[name.rsplit(".", 1)[1]]
        return FileResponse(str(path), media_type=media)

    # -- inputs ----------------------------------------------------------------------------------

    @app.post("/v1/sessions/{session_id}/messages", response_model=ReceiptOut, response_model_exclude_none=True, tags=["inputs"],
              responses={status: answer for status, answer in _POST_ERRORS.items() if status != 404})
    async def send_message(
        request: Request,
        session_id: SessionId,
        body: MessageIn,
        who: Caller,
        wait: WaitQuery = None,
    ) -> dict[str, Any]:
        """Send a user message (starts a turn, or waits behind the running one). With
        ``?wait=SECONDS`` the answer also says how the turn ended (``settlement``)."""
        input_id = body.input_id or f"in-{uuid.uuid4().hex}"
        log_session_id = log_id(who, session_id)
        release = slot(gw.wait_slots, who, "requests waiting (?wait=)") if wait is not None else None  # before a write
        try:
            sent = await gw.inputs.message(log_session_id, body.text, body.harness, input_id)
            out = receipt(sent)
            if wait is not None and sent.status != "rejected":
                settling = gw.inputs.wait(log_session_id, input_id, wait)
                out["settlement"] = (await wait_while_served(settling, receive=request.receive,
                                                             stopping=gw.stopping)).to_json()
            return out
        finally:
            if release is not None:
                release()

    @app.post("/v1/sessions/{session_id}/answers", response_model=ReceiptOut, response_model_exclude_none=True, tags=["inputs"],
              responses=_POST_ERRORS)
    async def send_answer(request: Request, session_id: SessionId, body: AnswerIn, who: Caller,
                          wait: WaitQuery = None) -> dict[str, Any]:
        """Answer an open ask; the answer is checked against the ask's schema first. With
        ``?wait=SECONDS`` the answer also says how the turn it resumed ended (``settlement``;
        ``rejected`` if the session's owner refused the answer)."""
        view = await existing(who, session_id)
        input_id = body.input_id or answer_input_id(body.tool_call_id, body.name, body.value)
        release = slot(gw.wait_slots, who, "requests waiting (?wait=)") if wait is not None else None  # before a write
        try:
            sent = await gw.inputs.answer(view, body.tool_call_id, body.name, body.value, input_id)
            out = receipt(sent)
            if wait is not None and sent.status != "rejected":
                settling = gw.inputs.wait(view.session_id, input_id, wait, answer=True)
                out["settlement"] = (await wait_while_served(settling, receive=request.receive,
                                                             stopping=gw.stopping)).to_json()
            return out
        finally:
            if release is not None:
                release()

    @app.post("/v1/sessions/{session_id}/records", response_model=ReceiptOut, response_model_exclude_none=True, tags=["inputs"],
              responses=_POST_ERRORS)
    async def send_records(session_id: SessionId, body: RecordsIn, who: Caller) -> dict[str, Any]:
        """Append app records to the session (once per input_id)."""
        view = await existing(who, session_id)
        input_id = body.input_id or f"rec-{uuid.uuid4().hex}"
        return receipt(await gw.inputs.records(view, list(body.records), input_id))

    @app.post("/v1/sessions/{session_id}/cancel", response_model=ReceiptOut, response_model_exclude_none=True, tags=["inputs"],
              responses=_POST_ERRORS)
    async def send_cancel(session_id: SessionId, body: CancelIn, who: Caller) -> dict[str, Any]:
        """Cancel an input: a running turn stops at its next boundary, a queued one never runs."""
        view = await existing(who, session_id)
        return receipt(await gw.inputs.cancel(view, body.input_id))

    # -- reads -----------------------------------------------------------------------------------

    @app.get("/v1/harnesses", tags=["sessions"], responses=_ANY_SESSION_ERRORS)
    async def list_harnesses(who: Caller) -> dict[str, list[str]]:
        """The harnesses this deployment knows by name (empty: not loaded in the gateway)."""
        return {"harnesses": sorted(gw.harnesses)}

    @app.get("/v1/sessions", response_model=SessionPage, tags=["sessions"], responses=_ANY_SESSION_ERRORS)
    async def list_sessions(
        request: Request,
        who: Caller,
        state: Annotated[SessionStateName | None, Query()] = None,
        harness: Annotated[str | None, Query(max_length=200)] = None,
        limit: Annotated[int, Query(ge=1, le=500)] = 50,
        cursor: Annotated[str | None, Query(max_length=400, description="next_cursor of the previous page")] = None,
    ) -> dict[str, Any]:
        """This tenant's sessions, most recently active first, paged (``harness sessions --json``)."""
        rows: list[tuple[tuple[bool, int, str], dict[str, Any]]] = []
        for summary in await gw.list_sessions():
            mine = gw.owns(who, summary.session_id)
            if mine is None:
                continue
            if state is not None and summary.state != state:
                continue
            if harness is not None and summary.harness != harness:
                continue
            row = _public(summary, mine)
            row["path"] = session_url_path(mine, request.scope.get("root_path", ""))
            rows.append((_order(summary, mine), row))
        rows.sort(key=lambda row: row[0])  # the catalog's order, by the caller's ids
        after = _parse_cursor(cursor)
        page = [row for row in rows if after is None or row[0] > after][:limit]
        more = bool(page) and rows[-1][0] > page[-1][0]
        return {"sessions": [row[1] for row in page], "next_cursor": _cursor(page[-1][0]) if more else None}

    @app.get("/v1/sessions/{session_id}", response_model=SessionDetail, tags=["sessions"], responses=_ERRORS)
    async def get_session(
        session_id: SessionId,
        who: Caller,
        timeline_limit: Annotated[int | None, Query(ge=1, le=100_000, description=(
            "only the last N timeline items and transcript messages (a long session's page stays small; "
            "the events stream gives the rest)"))] = None,
    ) -> dict[str, Any]:
        """State, open asks with their schemas, sleeps, usage, transcript and timeline."""
        view = await existing(who, session_id)
        state, entries = view.state, view.entries
        now = gw.now_ms()
        damaged = 1 if log_id(who, session_id) in gw.unreadable else 0  # (the view says so: never a made-up "waiting")
        summary = _public(
            summarize(state, now_ms=now, last_activity_ms=entries[-1].record.ts, unreadable=damaged), session_id
        )
        sleeps = [sleep.to_json(now_ms=now) for sleep in open_sleeps(state)]
        items, messages = timeline(entries), conversation(state)
        keep = timeline_limit if timeline_limit is not None else max(len(items), len(messages))
        return {
            "summary": summary,
            "open_asks": summary["open_asks"],
            "sleeps": sleeps,
            "usage": summary["usage"],
            "transcript": messages[-keep:],
            "timeline": [item.to_json() for item in items[-keep:]],
            "last_position": entries[-1].seq,
            "timeline_skipped": max(0, len(items) - keep),
            "transcript_skipped": max(0, len(messages) - keep),
        }

    @app.get(
        "/v1/sessions/{session_id}/events",
        tags=["sessions"],
        responses={**_ANY_SESSION_ERRORS, 200: {"content": {"text/event-stream": {}}, "description": "the event stream"}},
    )
    async def session_events(
        session_id: SessionId,
        who: Caller,
        after: Annotated[int | None, Query(ge=0, le=2**62, description="resume strictly after this position")] = None,
        last_event_id: Annotated[str | None, Header(alias="Last-Event-ID")] = None,
    ) -> StreamingResponse:
        """Server-Sent Events: a hello, then every committed record (id = its position), live.

        A session with no record yet streams too (open it, then send the first message: every
        event comes); ``GET /v1/sessions/{id}`` stays 404 until its first record."""
        cursor = after
        if last_event_id is not None and last_event_id.strip():
            # ASCII digits only: int() also takes '1_0' (10), '+5' and other scripts' digits.
            text = last_event_id.strip()
            if not (text.isascii() and text.isdigit() and int(text) <= 2**62):
                raise _invalid(("header", "Last-Event-ID"), "Last-Event-ID must be the id of the last event you "
                               "got (a log position: digits, at most 2**62), or left out to start at the beginning")
            cursor = int(text)
        log_session_id = log_id(who, session_id)
        gw.breaker.check()  # a log known to be down: 503 now, as a read would answer
        # A session with no record yet is streamed like any other: its records come from
        # the shared reader of the log (of its partition on Kafka) once they are written,
        # so a subscriber before the first message costs a key in that reader's table.
        position, known = 0, None
        if cursor:
            # A cursor past what this process read of the session may be past its end:
            # read (an empty session's end is 0). One within it (a client resuming, or
            # streaming the answer to the message it just posted) needs no read. With no
            # cursor there is nothing to read first: the stream starts at the beginning.
            view = gw.sessions.known(log_session_id)
            if view is None or cursor > view.position:
                view = await gw.sessions.get(log_session_id)
            position, known = view.position, view.state
        # A cursor past the session's last record (the view is caught up now) is none a
        # client was given: from another log, or one made up. Resuming after it would
        # hold back every new record until the log passed it, so it resumes at the end.
        release = slot(gw.stream_slots, who, "open event streams")
        stream = session_stream(
            gw.log,
            gw.live,
            log_session_id=log_session_id,
            public_session_id=session_id,
            after=min(cursor or 0, position),
            heartbeat_s=gw.settings.heartbeat_s,
            register=gw.register_stream,
            known=known,
        )

        async def held() -> AsyncIterator[bytes]:
            try:
                async for chunk in stream:
                    yield chunk
            finally:
                release()
                await stream.aclose()

        return StreamingResponse(
            held(),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
            background=BackgroundTask(release),  # (also when the stream never started)
        )


def install_head(app: FastAPI) -> None:
    """``HEAD`` on every ``GET`` route of ``app`` that has none (RFC 9110: a server that takes
    GET takes HEAD; ``curl -I`` on a session got 405 "it takes GET"). The route runs as for
    GET, its checks and its status too; the server sends no body. Not the event stream: it
    never ends, and a HEAD of it would hold a stream slot for nothing (405, naming GET)."""
    has_head = {getattr(route, "path", "") for route in app.routes if "HEAD" in (getattr(route, "methods", None) or ())}
    for route in list(app.routes):
        if not isinstance(route, APIRoute) or "GET" not in (route.methods or ()) or route.path in has_head:
            continue
        if route.path.endswith("/events"):
            continue
        app.add_api_route(route.path, route.endpoint, methods=["HEAD"], include_in_schema=False,
                          response_model=route.response_model, response_class=route.response_class,
                          response_model_exclude_none=route.response_model_exclude_none)


def _invalid(loc: tuple[str, str], msg: str) -> RequestValidationError:
    """A 422 in the one shape the OpenAPI document declares for it (``detail``: a list of
    ``{loc, msg, type}``), for a check a route makes itself."""
    return RequestValidationError([{"loc": loc, "msg": msg, "type": "value_error"}])


def _public(summary: SessionSummary, public_id: str) -> dict[str, Any]:
    """The summary as the caller sees it: its own session id, never the log's."""
    out = summary.to_json()
    out["session_id"] = public_id
    return out


def _order(summary: SessionSummary, public_id: str) -> tuple[bool, int, str]:
    """The catalog's order (most recent activity first; ids known only by name last)."""
    return (summary.last_activity is None, -(summary.last_activity or 0), public_id)


def _cursor(key: tuple[bool, int, str]) -> str:
    """The position after a row, as text: ``<last activity ms, or -1>.<session id>``."""
    return f"{-1 if key[0] else -key[1]}.{key[2]}"


def _parse_cursor(cursor: str | None) -> tuple[bool, int, str] | None:
    """A cursor back as an order key.

    Raises:
        RequestValidationError: 422 for one this API did not give (read as the start, it would
            serve the first page again: a client paging on it would never end).
    """
    if not cursor:
        return None
    ts, dot, public_id = cursor.partition(".")
    try:
        last = int(ts)
    except ValueError:
        last = None
    if last is None or not dot or not public_id:
        raise _invalid(("query", "cursor"), "cursor must be the next_cursor of a previous page (or left out for the first)")
    return (last < 0, -max(last, 0), public_id)
