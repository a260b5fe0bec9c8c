"""A client developer's mistakes over real HTTP, each answered as the OpenAPI document says."""

from __future__ import annotations

from typing import Any

import httpx

from tests.gateway.helpers import HARNESS


def opened(http: httpx.Client, path: str, headers: dict[str, str]) -> tuple[int, Any]:
    """The status of an events request and its JSON body (None for a stream: not read, it never ends)."""
    with http.stream("GET", path, headers=headers) as r:
        return r.status_code, (r.read() and r.json()) if r.status_code != 200 else None


def test_a_session_id_that_is_not_utf8_is_refused_not_replaced(http: httpx.Client) -> None:
    # %FF and %FE both decoded to U+FFFD: two ids a client sent were one session, neither its own.
    for raw in ["%FF", "%FE", "caf%E9", "%C3%28"]:
        r = http.post(f"/v1/sessions/{raw}/messages", json={"text": "hi", "harness": HARNESS})
        assert r.status_code == 422, (raw, r.text)
        [error] = r.json()["detail"]
        assert error["loc"] == ["path", "session_id"] and "UTF-8" in error["msg"] and "%C3%A9" in error["msg"], error
        assert http.get(f"/v1/sessions/{raw}").status_code == 422
        assert opened(http, f"/v1/sessions/{raw}/events", {})[0] == 422
    assert http.get("/v1/sessions").json()["sessions"] == []
    r = http.post("/v1/sessions/caf%C3%A9/messages", params={"wait": 20}, json={"text": "hi", "harness": HARNESS})
    assert r.status_code == 200 and r.json()["settlement"]["outcome"] == "completed", r.text
