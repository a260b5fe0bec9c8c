"""The gateway's error answers: every one is JSON ``{"detail": ...}`` (a 422's detail is a
list of ``{loc, msg, type}``), FastAPI's and Starlette's defaults included (a route that
does not exist, a method a route does not take, a body that cannot be read)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException

from harness.errors import LogError, RecordTooLarge
from harness.services.gateway.auth import AuthError
from harness.services.gateway.breaker import LogBreaker, LogDown
from harness.services.gateway.caller import caller_of
from harness.services.gateway.middleware import SESSIONS_PATH

__all__ = ["Problem", "SafeJSONResponse", "install_problems", "unreadable_body", "validation_problem"]


class SafeJSONResponse(JSONResponse):
    """JSON with non-ASCII escaped: a lone surrogate echoed from a request cannot break it."""

    def render(self, content: Any) -> bytes:
        return json.dumps(content, ensure_ascii=True, allow_nan=False, separators=(",", ":")).encode("ascii")


class Problem(BaseModel):
    detail: str


def _plain(error: Any) -> dict[str, Any]:
    """One validation error as the API answers it: where, what, its type; never the input
    (a refused 1 MB text came back whole) nor pydantic's links."""
    loc, kind = list(error.get("loc", ())), error.get("type", "")
    msg = str(error.get("msg", ""))
    if kind == "value_error" and isinstance((error.get("ctx") or {}).get("error"), ValueError):
        msg = str(error["ctx"]["error"])  # the library's own words (harness.ids), without "Value error, "
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


def no_route(request: Request) -> JSONResponse:
    """404 for a path no route takes, saying what exists."""
    what = f"{request.method} {request.url.path[:200]}"
    if request.url.path.startswith(SESSIONS_PATH):
        # Most likely a session id with a '/' sent as it is (team/alice).
        detail = (f"no such route: {what} (a '/' in a session id is sent as %2F: "
                  f"{SESSIONS_PATH}team%2Falice, not {SESSIONS_PATH}team/alice)")
    else:
        detail = f"no route {what}; the API is under /v1, see /docs (health: /healthz, /readyz; console: /)"
    return SafeJSONResponse({"detail": detail}, status_code=404)


def wrong_method(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    """405 for a method the route does not take, naming those it takes (and ``Allow``)."""
    allowed = (exc.headers or {}).get("Allow", "")
    takes = f"it takes {allowed}" if allowed else "see /docs for what it takes"
    return SafeJSONResponse({"detail": f"{request.method} is not allowed on {request.url.path[:200]}: {takes}"},
                            status_code=405, headers=exc.headers)


def install_problems(app: FastAPI, breaker: LogBreaker) -> None:
    """Answer every error of ``app`` in the gateway's shape (``breaker``: the 503's Retry-After)."""

    async def refused_caller(request: Request) -> Response | None:
        """The 401 or 429 the route's :data:`~harness.services.gateway.caller.Caller` would
        answer, for a body FastAPI could not read: it reads the body before the route's
        dependencies, so a caller without credentials got the 422 of one with them."""
        try:
            await caller_of(request)
        except AuthError as denied:
            return await unauthorized(request, denied)
        except StarletteHTTPException as refused:
            return await http_problem(request, refused)
        return None

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> Response:
        errors = exc.errors()
        if any(e.get("type") == "json_invalid" for e in errors):
            refused = await refused_caller(request)
            if refused is not None:
                return refused
        return validation_problem(request, errors)

    @app.exception_handler(StarletteHTTPException)
    async def http_problem(request: Request, exc: StarletteHTTPException) -> Response:
        if exc.status_code == 400 and exc.detail == _UNPARSED_BODY:  # FastAPI's word for any body it could not read
            return await refused_caller(request) or unreadable_body(exc.__cause__)
        if exc.status_code == 404 and exc.detail == "Not Found":  # the router's: no route (a route says more)
            return no_route(request)
        if exc.status_code == 405 and exc.detail == "Method Not Allowed":
            return wrong_method(request, exc)
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
        retry = breaker.retry_after_s
        detail = f"{exc}; retry in {retry} s" if isinstance(exc, LogDown) else f"the session log failed: {exc}; retry later"
        return JSONResponse({"detail": detail}, status_code=503, headers={"Retry-After": str(retry)})
