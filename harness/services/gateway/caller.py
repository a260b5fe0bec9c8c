"""Who calls the gateway: the FastAPI dependency (:data:`Caller`) that authenticates a request
(``--auth-failure-limit`` first) and spends its ``--rate-limit`` tokens, before its body is judged
(FastAPI parses a JSON body first: one that is not JSON is judged by :func:`caller_of`, 401 before 422)."""

from __future__ import annotations

import logging
from typing import Annotated

from fastapi import Depends, HTTPException, Request
from fastapi.security import HTTPBearer
from starlette.requests import HTTPConnection

from harness.services.gateway.auth import AuthError, Principal
from harness.services.gateway.state import GatewayState

log = logging.getLogger("harness.gateway")

__all__ = ["WRITE_METHODS", "Caller", "caller_of"]


class _RawBearer(HTTPBearer):
    """The ``Authorization`` header as sent (the auth checks its scheme and says what is wrong),
    declared in the OpenAPI document as HTTP bearer: Swagger UI's "Authorize" then takes the
    token alone and sends ``Bearer <token>`` (an ``apiKey`` scheme wanted the word typed too)."""

    async def __call__(self, request: HTTPConnection) -> str | None:  # type: ignore[override]
        return request.headers.get("Authorization")


_bearer = _RawBearer(
    scheme_name="bearer",
    description="A JWT or an API key (none needed under --open-access)",
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


async def caller_of(request: Request) -> Principal:
    """What :data:`Caller` makes of ``request``, for a request whose route never ran its
    dependencies (a body FastAPI could not read: see ``problems``).

    Raises:
        AuthError: the credentials do not authenticate (401).
        HTTPException: 429 of ``--auth-failure-limit`` or ``--rate-limit``.
    """
    return await _principal(request, request.headers.get("Authorization"))
