"""A client developer's mistakes over real HTTP, each answered as the OpenAPI document says:
a path that is not UTF-8 once percent-decoded, a made-up Last-Event-ID, every 422 in the
one shape the document declares (``detail``: a list of ``{loc, msg, type}``), the 415 listed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from harness.services.gateway.settings import GatewaySettings
from tests.gateway.helpers import HARNESS, ServerThread


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


def test_a_last_event_id_is_digits_only(http: httpx.Client) -> None:
    # int() takes '1_0' (10), '+5', ' 7 ' and other digits: a garbled id resumed somewhere else.
    for garbage in ["1_0", "+5", "abc", "-1", "1e3", "0x10", str(2**62 + 1)]:
        status, body = opened(http, "/v1/sessions/s/events", {"Last-Event-ID": garbage})
        assert status == 422, (garbage, body)
        [error] = body["detail"]
        assert error["loc"] == ["header", "Last-Event-ID"] and "the id of the last event" in error["msg"], error


def test_every_422_has_the_documented_shape(http: httpx.Client) -> None:
    schema = http.get("/openapi.json").json()["components"]["schemas"]["HTTPValidationError"]
    assert schema["properties"]["detail"]["type"] == "array"
    answers = [
        http.get("/v1/sessions", params={"cursor": "garbage"}),
        http.post("/v1/sessions/t%2Facme%2Fs-1/messages", json={"text": "hi", "harness": HARNESS}),
        http.get("/v1/sessions/t%2Facme%2Fs-1"),
        http.get("/v1/sessions/s/events", headers={"Last-Event-ID": "x"}),
    ]
    for r in answers:
        assert r.status_code == 422, r.text
        detail = r.json()["detail"]
        assert isinstance(detail, list) and detail, r.text
        assert all(set(e) == {"loc", "msg", "type"} and isinstance(e["msg"], str) for e in detail), r.text
    assert answers[0].json()["detail"][0]["loc"] == ["query", "cursor"]
    assert "kept for the sessions of tenants" in answers[1].json()["detail"][0]["msg"]


def test_the_openapi_document_lists_the_415_of_every_post(http: httpx.Client) -> None:
    paths = http.get("/openapi.json").json()["paths"]
    posts = [(path, ops["post"]) for path, ops in paths.items() if "post" in ops]
    assert len(posts) == 4
    for path, op in posts:
        assert "415" in op["responses"], path
        r = http.post(path.replace("{session_id}", "s"), content=b'{"text": "hi"}', headers={"content-type": "text/plain"})
        assert r.status_code == 415 and "application/json" in r.json()["detail"], r.text


def test_head_is_answered_wherever_get_is(http: httpx.Client) -> None:
    # `curl -I` on a session got 405 "it takes GET" (RFC 9110: a server that takes GET takes HEAD).
    assert http.post("/v1/sessions/s/messages", params={"wait": 20}, json={"text": "hi", "harness": HARNESS}).is_success
    for path in ["/v1/sessions/s", "/v1/sessions", "/v1/harnesses", "/", "/docs", "/openapi.json", "/healthz"]:
        got, head = http.get(path), http.head(path)
        assert head.status_code == got.status_code == 200, (path, head.status_code, head.text)
        assert head.content == b"" and head.headers["content-type"] == got.headers["content-type"], path
    assert http.head("/v1/sessions/nope").status_code == 404
    assert http.head("/v1/sessions/%FF").status_code == 422


def test_credentials_are_judged_before_a_body_that_is_not_json(tmp_path: Path) -> None:
    # Without credentials, a body that was not JSON got the 422 of a caller who may send it.
    (tmp_path / "keys").write_text("acme key-acme-1234\n")
    settings = GatewaySettings(log=f"sqlite:///{tmp_path / 'h.db'}", api_keys_file=str(tmp_path / "keys"))
    with ServerThread(settings) as server, httpx.Client(base_url=server.url, timeout=30) as http:
        for headers, body in [({}, b'{"text":'), ({"Authorization": "Bearer wrong"}, b'{"text":'),
                              ({}, b"[" * 100_000 + b"]" * 100_000)]:
            r = http.post("/v1/sessions/s/messages", content=body, headers={"content-type": "application/json", **headers})
            assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer", r.text
            assert "wrong" not in r.text
        r = http.post("/v1/sessions/s/messages", content=b'{"text":',
                      headers={"content-type": "application/json", "Authorization": "Bearer key-acme-1234"})
        assert r.status_code == 422 and "not valid JSON" in r.json()["detail"][0]["msg"], r.text


def test_the_openapi_document_lists_a_404_only_where_a_session_must_exist(http: httpx.Client) -> None:
    # The event stream of a session with no record streams (200), and the lists have no session.
    paths = http.get("/openapi.json").json()["paths"]
    for path in ["/v1/sessions", "/v1/harnesses", "/v1/sessions/{session_id}/events"]:
        assert "404" not in paths[path]["get"]["responses"], path
    assert "404" not in paths["/v1/sessions/{session_id}/messages"]["post"]["responses"]  # (it starts one)
    assert "404" in paths["/v1/sessions/{session_id}"]["get"]["responses"]
    for name in ["answers", "records", "cancel"]:
        assert "404" in paths[f"/v1/sessions/{{session_id}}/{name}"]["post"]["responses"], name
    assert opened(http, "/v1/sessions/never-written/events", {})[0] == 200
