"""The gateway's HTTP routes (FastAPI). Request bodies are pydantic models (422 on error)."""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Annotated, Any, Literal
from urllib.parse import unquote

from fastapi import Depends, FastAPI, Header, HTTPException, Path, Query, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, Response, StreamingResponse
from fastapi.security import APIKeyHeader
from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, JsonValue
from starlette.background import BackgroundTask
from starlette.exceptions import HTTPException as StarletteHTTPException

from harness.errors import LogError, RecordTooLarge
from harness.ids import check_sent_input_id
from harness.replay.conversation import conversation
from harness.services.gateway.auth import AuthError, Principal
from harness.services.gateway.breaker import LogDown
from harness.services.gateway.hosts import allowed_hosts
from harness.services.gateway.middleware import (
    SESSIONS_PATH,
    AllowedHosts,
    BodyLimit,
    EncodedSlashes,
    ForwardedClient,
    RequestMetrics,
    SecurityHeaders,
    session_url_path,
)
from harness.services.gateway.proxies import TrustedProxies
from harness.services.gateway.sessions import SessionView
from harness.services.gateway.sse import session_stream
from harness.services.gateway.state import GatewayState, TenantSlots, console_dir
from harness.views import SessionStateName, SessionSummary, summarize, timeline

log = logging.getLogger("harness.gateway")

__all__ = ["install_routes"]

SESSION_ID = r"^[A-Za-z0-9][A-Za-z0-9._:@~+=-]*(?:/[A-Za-z0-9][A-Za-z0-9._:@~+=-]*)*$"
"""A session id the gateway takes: parts of letters, digits and ``._:@~+=-``, each starting
with a letter or digit, joined by ``/`` (``team/alice``, as the CLI and the library allow);
at most ``MAX_SESSION_ID`` characters. In a URL its ``/`` is sent as ``%2F`` (see
:class:`~harness.services.gateway.middleware.EncodedSlashes`)."""
MAX_SESSION_ID = 128
SESSION_ID_RULE = (
    f"a session id is 1 to {MAX_SESSION_ID} letters, digits and . _ : @ ~ + = -, in parts joined by '/', "
    "each starting with a letter or digit (in a URL, send each '/' of the id as %2F)"
)
INPUT_ID = r"^[^\x00-\x1f\x7f]{1,256}$"
NAME = r"^[^\x00-\x1f\x7f]{1,200}$"


def _from_path(value: Any) -> Any:
    """A session id as the route got it, decoded: :class:`~harness.services.gateway.middleware.EncodedSlashes` sent its ``/`` and
    ``%`` as ``%2F`` and ``%25``; a segment without ``%`` comes as it is (unquote keeps it)."""
    return unquote(value) if isinstance(value, str) and "%" in value else value


SessionId = Annotated[
    str,
    Path(pattern=SESSION_ID, max_length=MAX_SESSION_ID,
         description="the session's id (yours; tenant-scoped); a '/' in it is sent as %2F"),
    BeforeValidator(_from_path),
]
InputIdField = Annotated[str, Field(pattern=INPUT_ID)]
SentInputIdField = Annotated[str, Field(pattern=INPUT_ID), AfterValidator(check_sent_input_id)]
"""A message's or app records' own id: not one of the prefixes kept for answers and cancels."""
NameField = Annotated[str, Field(pattern=NAME)]
MAX_TEXT = 256 * 1024
MAX_LIST = 500
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


# --- request and response bodies ------------------------------------------------------------------


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class MessageIn(_Body):
    text: str = Field(min_length=1, max_length=MAX_TEXT)  # (harness send refuses an empty text too)
    harness: NameField | None = None
    input_id: SentInputIdField | None = None


class AnswerIn(_Body):
    tool_call_id: NameField
    name: NameField
    value: JsonValue
    input_id: InputIdField | None = None


class RecordsIn(_Body):
    records: list[dict[str, JsonValue]] = Field(min_length=1, max_length=MAX_LIST)
    input_id: SentInputIdField | None = None


class CancelIn(_Body):
    input_id: InputIdField


class OpenAskOut(BaseModel):
    tool_call_id: str
    name: str
    message: str
    schema_: JsonValue = Field(alias="schema", description="the JSON schema an answer must match")
    expires_at: float | None = Field(None, description="seconds since the epoch (harness.views.OpenAsk)")


class SettlementOut(BaseModel):
    outcome: Literal["completed", "failed", "aborted", "rejected", "waiting", "running"] = Field(
        description="the input's settlement; 'waiting': its turn waits for a person (see asks); "
        "'running': neither within the wait (the turn goes on: stream the events after position - 1)"
    )
    code: str | None = None
    reason: str | None = None
    text: str | None = Field(None, description="the turn's answer")
    asks: list[OpenAskOut] | None = Field(None, description="the open asks, when 'waiting'")
    queued_behind: str | None = Field(None, description="'waiting' for a message queued behind a turn that "
                                      "waits for a person: that turn's input (it runs once the ask is answered)")


class ReceiptOut(BaseModel):
    input_id: str
    status: Literal["accepted", "queued", "rejected"]
    code: str | None = None
    reason: str | None = None
    position: int | None = Field(None, description="the input's log position (resume events after position - 1)")
    settlement: SettlementOut | None = Field(
        None, description="with ?wait=: how the input ended, that its turn waits for a person, or 'running'"
    )


class UsageOut(BaseModel):
    calls: int = Field(description="completed model calls")
    input_tokens: int
    output_tokens: int
    cost: float | None = Field(None, description="US dollars, when the provider or the pricing says")


class SummaryOut(BaseModel):
    """``harness.views.SessionSummary.to_json()``, as ``harness sessions --json`` prints it."""

    model_config = ConfigDict(extra="allow")
    session_id: str
    harness: str | None
    state: SessionStateName
    last_activity: int | None = None
    sleeping_until: int | None = None
    open_asks: list[OpenAskOut] = []
    turns: int = 0
    last_outcome: str | None = None
    last_code: str | None = None
    active_input: str | None = None
    pending_inputs: int = 0
    partial: bool = Field(False, description="known by id only (Kafka: ended before its partition's checkpoint)")
    usage: UsageOut | None = None


class ListedOut(SummaryOut):
    """A row of the list: the summary and where the session is."""

    path: str = Field(description="the session's URL path, its id percent-encoded as one segment (a '/' in "
                      "it as %2F): GET it, or add /events, /messages ... to it")


class SessionPage(BaseModel):
    sessions: list[ListedOut]
    next_cursor: str | None = None


class SessionDetail(BaseModel):
    """The summary and the timeline as ``harness show --json`` prints them, and more."""

    model_config = ConfigDict(extra="allow")
    summary: SummaryOut
    open_asks: list[OpenAskOut]
    sleeps: list[dict[str, Any]]
    usage: UsageOut
    transcript: list[dict[str, Any]]
    timeline: list[dict[str, Any]] = Field(description="harness.views.TimelineItem.to_json() of every item "
                                           "(the last timeline_limit ones when asked)")
    last_position: int | None
    timeline_skipped: int = Field(0, description="earlier timeline items left out by timeline_limit")
    transcript_skipped: int = Field(0, description="earlier transcript messages left out by timeline_limit")


class SafeJSONResponse(JSONResponse):
    """JSON with non-ASCII escaped: a lone surrogate echoed from a request cannot break it."""

    def render(self, content: Any) -> bytes:
        return json.dumps(content, ensure_ascii=True, allow_nan=False, separators=(",", ":")).encode("ascii")


class Problem(BaseModel):
    detail: str


_ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": Problem, "description": "missing or invalid credentials"},
    404: {"model": Problem, "description": "no such session (for this tenant)"},
    413: {"model": Problem, "description": "request body too large"},
    429: {"model": Problem, "description": "this tenant holds its most open event streams or waiting requests, or "
          "sent more than --rate-limit allows, or this client address failed to authenticate more often than "
          "--auth-failure-limit allows (Retry-After says when to try again)"},
    503: {"model": Problem, "description": "the session log cannot be reached"},
}


# --- errors ------------------------------------------------------------------------------------


def _plain(error: Any) -> dict[str, Any]:
    """One validation error as the API answers it: where, what, its type; never the input
    (a refused 1 MB text came back whole) nor pydantic's links."""
    loc, kind = list(error.get("loc", ())), error.get("type", "")
    msg = str(error.get("msg", ""))
    if loc == ["path", "session_id"]:  # the rule in words, not the regular expression
        msg = SESSION_ID_RULE
    if kind == "json_invalid":
        why = (error.get("ctx") or {}).get("error")
        at = f" at character {loc[-1]}" if len(loc) > 1 and isinstance(loc[-1], int) else ""
        msg = f"the body is not valid JSON{at}" + (f": {why}" if why else "")
        loc = loc[:1]
    return {"loc": loc, "msg": msg, "type": kind}


_UNPARSED_BODY = "There was an error parsing the body"


def unreadable_body(cause: BaseException | None) -> JSONResponse:
    """422 for a JSON body FastAPI could not read (it answers a bare 400), saying why."""
    if isinstance(cause, RecursionError):
        why = "the body's JSON is nested too deeply to be read"
    elif isinstance(cause, UnicodeDecodeError):
        why = "the body is not UTF-8 text"
    else:
        why = f"the body could not be read as JSON ({type(cause).__name__ if cause else 'unknown error'})"
    return JSONResponse({"detail": [{"loc": ["body"], "msg": why, "type": "json_invalid"}]}, status_code=422)


def validation_problem(request: Request, errors: Sequence[Any]) -> JSONResponse:
    """422 with each error's place and message; 415 for a body that is not sent as JSON."""
    content_type = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    is_json = content_type == "application/json" or (content_type.startswith("application/") and content_type.endswith("+json"))
    if request.method == "POST" and not is_json and any(
        tuple(e.get("loc", ())) == ("body",) for e in errors
    ):
        shown = content_type or "none"
        return JSONResponse(
            {"detail": f"the body must be JSON sent with 'Content-Type: application/json' (this one: {shown})"},
            status_code=415,
        )
    return SafeJSONResponse({"detail": [_plain(e) for e in errors]}, status_code=422)


_bearer = APIKeyHeader(
    name="Authorization",
    scheme_name="bearer",
    description="'Bearer <token>': a JWT or an API key (none needed under --open-access)",
    auto_error=False,
)


WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
"""What ``--rate-limit`` counts (every API request with ``--rate-limit-reads``)."""


async def _principal(request: Request, authorization: Annotated[str | None, Depends(_bearer)] = None) -> Principal:
    # On the loop (an async dependency): checking a key or a token's signature costs
    # microseconds, and a plain ``def`` would hop to the thread pool and back on every
    # request (~8% of a busy gateway's CPU).
    gw: GatewayState = request.app.state.gateway
    if gw.auth_failures is None or not authorization:
        who = gw.auth.authenticate(authorization)
    else:
        who = _authenticate_limited(gw, authorization, request)
    if gw.rate_limits is not None and (gw.settings.rate_limit_reads or request.method in WRITE_METHODS):
        _rate_limit(gw, who, request)
    return who


def _authenticate_limited(gw: GatewayState, authorization: str, request: Request) -> Principal:
    """Authenticate under ``--auth-failure-limit``: an address whose failure budget is spent
    gets 429 before its credentials are looked at (so a guess costs no signature check); a
    failure spends one. Nothing awaited in between: concurrent guesses cannot all pass.

    Raises:
        HTTPException: 429 with ``Retry-After``.
        AuthError: the credentials do not authenticate (401).
    """
    limit = gw.auth_failures
    assert limit is not None
    address = request.client.host if request.client else None
    retry = limit.refused(address)
    if retry:
        gw.metrics.rate_limited("auth_failures")
        if limit.should_warn(address):
            # (the address is an IP, ours or a trusted proxy's word; never the credentials)
            log.warning("client address %s failed to authenticate more than %d times a minute "
                        "(--auth-failure-limit): its requests get 429 until its budget refills; if it is an ingress "
                        "or a load balancer, name it in --forwarded-allow-ips", address, limit.per_minute)
        raise HTTPException(429, "too many failed authentications from this client address (at most "
                            f"{limit.per_minute} a minute, --auth-failure-limit): retry in {retry} s",
                            headers={"Retry-After": str(retry)})
    try:
        return gw.auth.authenticate(authorization)
    except AuthError:
        limit.failed(address)
        raise


def _rate_limit(gw: GatewayState, who: Principal, request: Request) -> None:
    """Take a token of the caller's bucket: its tenant's, or its address's when it has none
    (``--open-access`` without a token). Here, after authentication and before the body is
    read, so a refused write writes nothing, and a caller without valid credentials spends
    no tenant's tokens.

    Raises:
        HTTPException: 429 with ``Retry-After`` when the bucket is empty.
    """
    assert gw.rate_limits is not None
    key = f"t:{who.tenant}" if who.tenant is not None else f"a:{request.client.host if request.client else '?'}"
    wait = gw.rate_limits.take(key)
    if wait > 0:
        gw.metrics.rate_limited("rate_limit")
        retry = gw.rate_limits.retry_after(wait)
        whose = "this tenant" if who.tenant is not None else "this client address"
        raise HTTPException(429, f"too many requests from {whose} (at most {gw.settings.rate_limit:g} a second, "
                            f"--rate-limit): retry in {retry} s", headers={"Retry-After": str(retry)})


Caller = Annotated[Principal, Depends(_principal)]


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

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        return validation_problem(request, exc.errors())

    @app.exception_handler(StarletteHTTPException)
    async def http_problem(request: Request, exc: StarletteHTTPException) -> Response:
        if exc.status_code == 400 and exc.detail == _UNPARSED_BODY:  # FastAPI's word for any body it could not read
            return unreadable_body(exc.__cause__)
        if exc.status_code == 404 and exc.detail == "Not Found" and request.url.path.startswith(SESSIONS_PATH):
            # No route: most likely a session id with a '/' sent as it is (team/alice).
            return JSONResponse({"detail": (
                f"no such route: {request.method} {request.url.path} (a '/' in a session id is sent as %2F: "
                f"{SESSIONS_PATH}team%2Falice, not {SESSIONS_PATH}team/alice)")}, status_code=404)
        return await http_exception_handler(request, exc)

    @app.exception_handler(AuthError)
    async def unauthorized(request: Request, exc: AuthError) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=401, headers={"WWW-Authenticate": "Bearer"})

    @app.exception_handler(RecordTooLarge)
    async def record_too_large(request: Request, exc: RecordTooLarge) -> JSONResponse:
        # Not a 503: sending it again cannot help. (Its message names the log's session id.)
        detail = (f"the input is {exc.size} bytes as a record, more than the session log accepts: send less "
                  "(the operator can raise the log's record size limit)")
        return JSONResponse({"detail": detail}, status_code=413)

    @app.exception_handler(LogError)
    async def log_down(request: Request, exc: LogError) -> JSONResponse:
        retry = gw.breaker.retry_after_s
        detail = f"{exc}; retry in {retry} s" if isinstance(exc, LogDown) else f"the session log failed: {exc}; retry later"
        return JSONResponse({"detail": detail}, status_code=503, headers={"Retry-After": str(retry)})

    def log_id(who: Principal, session_id: str) -> str:
        """The log's id of the caller's ``session_id``.

        Raises:
            HTTPException: 422 for an id that would name another tenant's session: with no
                tenant (open access) the log's id is the id itself, and ``t/<tenant>/<id>``
                is how the log names a tenant's session (``harness.ids.tenant_session_id``).
        """
        log_session_id = gw.log_id(who, session_id)
        if gw.owns(who, log_session_id) != session_id:
            raise HTTPException(422, f"session id {session_id!r} has the form t/<tenant>/<id>, which is kept for "
                                "the sessions of tenants: use another id")
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
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz", tags=["health"], responses={503: {"model": Problem}})
    async def readyz() -> JSONResponse:
        """Ready once the log answers (Kafka: its sessions topic exists; the gateway never creates it)."""
        if await gw.check_ready():
            return JSONResponse({"status": "ready"})
        return JSONResponse({"detail": f"not ready: {gw.not_ready}"}, status_code=503)

    @app.get("/", include_in_schema=False)
    async def console_index() -> FileResponse:
        return FileResponse(str(console_dir() / "index.html"), media_type="text/html")

    @app.get("/console/{name}", include_in_schema=False)
    async def console_file(name: Annotated[str, Path(pattern=r"^[a-z]+\.(js|css|html)$")]) -> FileResponse:
        path = console_dir() / name
        if not path.is_file():
            raise HTTPException(404, "no such file")
        media = {"js": "text/javascript", "css": "text/css", "html": "text/html"}[name.rsplit(".", 1)[1]]
        return FileResponse(str(path), media_type=media)

    # -- inputs ----------------------------------------------------------------------------------

    @app.post("/v1/sessions/{session_id}/messages", response_model=ReceiptOut, response_model_exclude_none=True, tags=["inputs"],
              responses=_ERRORS)
    async def send_message(
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
                out["settlement"] = (await gw.inputs.wait(log_session_id, input_id, wait)).to_json()
            return out
        finally:
            if release is not None:
                release()

    @app.post("/v1/sessions/{session_id}/answers", response_model=ReceiptOut, response_model_exclude_none=True, tags=["inputs"],
              responses=_ERRORS)
    async def send_answer(session_id: SessionId, body: AnswerIn, who: Caller, wait: WaitQuery = None) -> dict[str, Any]:
        """Answer an open ask; the answer is checked against the ask's schema first. With
        ``?wait=SECONDS`` the answer also says how the turn it resumed ended (``settlement``;
        ``rejected`` if the session's owner refused the answer)."""
        view = await existing(who, session_id)
        input_id = body.input_id or f"answer:{body.tool_call_id}:{body.name}"
        release = slot(gw.wait_slots, who, "requests waiting (?wait=)") if wait is not None else None  # before a write
        try:
            sent = await gw.inputs.answer(view, body.tool_call_id, body.name, body.value, input_id)
            out = receipt(sent)
            if wait is not None and sent.status != "rejected":
                out["settlement"] = (await gw.inputs.wait(view.session_id, input_id, wait, answer=True)).to_json()
            return out
        finally:
            if release is not None:
                release()

    @app.post("/v1/sessions/{session_id}/records", response_model=ReceiptOut, response_model_exclude_none=True, tags=["inputs"],
              responses=_ERRORS)
    async def send_records(session_id: SessionId, body: RecordsIn, who: Caller) -> dict[str, Any]:
        """Append app records to the session (once per input_id)."""
        view = await existing(who, session_id)
        input_id = body.input_id or f"rec-{uuid.uuid4().hex}"
        return receipt(await gw.inputs.records(view, list(body.records), input_id))

    @app.post("/v1/sessions/{session_id}/cancel", response_model=ReceiptOut, response_model_exclude_none=True, tags=["inputs"],
              responses=_ERRORS)
    async def send_cancel(session_id: SessionId, body: CancelIn, who: Caller) -> dict[str, Any]:
        """Cancel an input: a running turn stops at its next boundary, a queued one never runs."""
        view = await existing(who, session_id)
        return receipt(await gw.inputs.cancel(view, body.input_id))

    # -- reads -----------------------------------------------------------------------------------

    @app.get("/v1/harnesses", tags=["sessions"], responses=_ERRORS)
    async def list_harnesses(who: Caller) -> dict[str, list[str]]:
        """The harnesses this deployment knows by name (empty: not loaded in the gateway)."""
        return {"harnesses": sorted(gw.harnesses)}

    @app.get("/v1/sessions", response_model=SessionPage, tags=["sessions"], responses=_ERRORS)
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
        summary = _public(summarize(state, now_ms=now, last_activity_ms=entries[-1].record.ts), session_id)
        sleeps = [
            {"tool_call_id": call.tool_call_id, "name": name, "wake_at": wake, "due": wake <= now}
            for call in state.calls.values()
            if call.result is None
            for name, wake in call.sleeps.items()
        ]
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
        responses={**_ERRORS, 200: {"content": {"text/event-stream": {}}, "description": "the event stream"}},
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
            try:
                cursor = int(last_event_id)
            except ValueError:
                raise HTTPException(422, "Last-Event-ID must be a log position (an integer)") from None
            if not 0 <= cursor <= 2**62:
                raise HTTPException(422, "Last-Event-ID must be a log position (an integer)")
        log_session_id = log_id(who, session_id)
        gw.breaker.check()  # a log known to be down: 503 now, as a read would answer
        # A session with no record yet is streamed like any other: its records come from
        # the shared reader of the log (of its partition on Kafka) once they are written,
        # so a subscriber before the first message costs a key in that reader's table.
        position = 0
        if cursor:
            # A cursor past what this process read of the session may be past its end:
            # read (an empty session's end is 0). One within it (a client resuming, or
            # streaming the answer to the message it just posted) needs no read. With no
            # cursor there is nothing to read first: the stream starts at the beginning.
            view = gw.sessions.known(log_session_id)
            if view is None or cursor > view.position:
                view = await gw.sessions.get(log_session_id)
            position = view.position
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
        HTTPException: 422 for one this API did not give (read as the start, it would
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
        raise HTTPException(422, "cursor must be the next_cursor of a previous page (or left out for the first)")
    return (last < 0, -max(last, 0), public_id)
