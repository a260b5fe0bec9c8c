"""The HTTP API over real HTTP (uvicorn on 127.0.0.1), gateway + worker on SQLite."""

from __future__ import annotations

import dataclasses
import json
import subprocess
from typing import Any

import httpx
import pytest

from harness.build import build_info
from harness.services.gateway.inputs import CANCEL_SUPPORTED
from tests.gateway.helpers import HARNESS, ServerThread, child_env, harness_command, wait_for


def message(http: httpx.Client, sid: str, text: str, **kw: Any) -> dict[str, Any]:
    body = {"text": text, "harness": HARNESS, **kw}
    r = http.post(f"/v1/sessions/{sid}/messages", json=body)
    assert r.status_code == 200, r.text
    out: dict[str, Any] = r.json()
    return out


def detail(http: httpx.Client, sid: str) -> dict[str, Any]:
    r = http.get(f"/v1/sessions/{sid}")
    assert r.status_code == 200, r.text
    out: dict[str, Any] = r.json()
    return out


def wait_state(http: httpx.Client, sid: str, state: str) -> dict[str, Any]:
    return wait_for(lambda: (d := detail(http, sid))["summary"]["state"] == state and d,
                    timeout=30, what=f"session {sid} to be {state}")


def test_health_and_openapi(http: httpx.Client) -> None:
    # (the build, so a rolling upgrade shows which pods answer from which commit)
    assert http.get("/healthz").json() == {"status": "ok", **dataclasses.asdict(build_info())}
    assert http.get("/readyz").json() == {"status": "ready"}
    paths = http.get("/openapi.json").json()["paths"]
    for path in ("/v1/sessions/{session_id}/messages", "/v1/sessions/{session_id}/answers",
                 "/v1/sessions/{session_id}/records", "/v1/sessions/{session_id}/cancel",
                 "/v1/sessions", "/v1/sessions/{session_id}", "/v1/sessions/{session_id}/events"):
        assert path in paths


def test_message_receipt_is_idempotent_and_derived_from_the_log(http: httpx.Client) -> None:
    first = message(http, "s-1", "hello", input_id="in-1")
    assert first["status"] == "accepted" and first["input_id"] == "in-1" and first["position"] > 0
    assert message(http, "s-1", "hello", input_id="in-1") == first  # same receipt again
    conflict = message(http, "s-1", "another text", input_id="in-1")
    assert conflict["status"] == "rejected" and conflict["code"] == "input_conflict"
    d = wait_state(http, "s-1", "idle")
    assert d["transcript"][-1] == {"role": "assistant", "content": "echo: hello"}
    # the input is in the log once; the resend wrote nothing
    inputs = [i for i in d["timeline"] if i["kind"] == "input.message"]
    assert len(inputs) == 1 and inputs[0]["status"] == "completed"  # the input carries its settlement
    assert message(http, "s-1", "hello", input_id="in-1") == first  # still the same after it settled


def test_queued_behind_a_waiting_turn_then_answer_resumes(http: httpx.Client) -> None:
    assert message(http, "s-2", "please approve the refund", input_id="a")["status"] == "accepted"
    d = wait_state(http, "s-2", "waiting")
    (ask,) = d["open_asks"]
    assert ask["name"] == "approval" and ask["schema"]["properties"]["approved"]["type"] == "boolean"
    queued = message(http, "s-2", "and then hello", input_id="b")
    assert queued["status"] == "queued"
    assert message(http, "s-2", "and then hello", input_id="b") == queued

    bad = http.post("/v1/sessions/s-2/answers", json={"tool_call_id": ask["tool_call_id"], "name": "approval",
                                                      "value": {"approved": "maybe"}}).json()
    assert bad["status"] == "rejected" and bad["code"] == "invalid_answer" and "approved" in bad["reason"]
    wrong = http.post("/v1/sessions/s-2/answers", json={"tool_call_id": "nope", "name": "approval",
                                                        "value": {"approved": True}}).json()
    assert wrong["status"] == "rejected" and wrong["code"] == "no_open_ask"

    body = {"tool_call_id": ask["tool_call_id"], "name": "approval", "value": {"approved": True, "note": "ok"}}
    good = http.post("/v1/sessions/s-2/answers", json=body).json()
    assert good["status"] == "accepted"
    d = wait_for(lambda: (x := detail(http, "s-2"))["summary"]["turns"] == 2 and x["summary"]["state"] == "idle" and x,
                 timeout=30, what="both turns to finish")
    texts = [m["content"] for m in d["transcript"] if m["role"] == "assistant" and not m.get("tool_calls")]
    assert texts == ['done: {"approved":true,"note":"ok"}', "echo: and then hello"]
    again = http.post("/v1/sessions/s-2/answers", json=body).json()
    assert again == good  # the same receipt, from the log, after the ask closed


def test_unknown_harness_and_mismatch_are_refused_with_a_reason(http: httpx.Client) -> None:
    r = http.post("/v1/sessions/s-3/messages", json={"text": "hi", "harness": "no/such"}).json()
    assert r["status"] == "rejected" and r["code"] == "unknown_harness" and HARNESS in r["reason"]
    r = http.post("/v1/sessions/s-3/messages", json={"text": "hi"}).json()
    assert r["status"] == "rejected" and r["code"] == "unknown_harness"
    assert http.get("/v1/sessions/s-3").status_code == 404  # nothing was written
    message(http, "s-3", "hi")
    r = http.post("/v1/sessions/s-3/messages", json={"text": "hi", "harness": "other/one"}).json()
    assert r["status"] == "rejected" and r["code"] == "harness_mismatch"
    # a later message may leave the harness out: the session's own is used
    assert http.post("/v1/sessions/s-3/messages", json={"text": "again"}).json()["status"] in ("accepted", "queued")


def test_records_and_cancel(http: httpx.Client) -> None:
    message(http, "s-4", "hello", input_id="m1")
    wait_state(http, "s-4", "idle")
    r = http.post("/v1/sessions/s-4/records", json={"records": [{"type": "app.memory", "fact": "x"}],
                                                    "input_id": "r1"}).json()
    assert r["status"] == "accepted"
    assert http.post("/v1/sessions/s-4/records", json={"records": [{"type": "app.memory", "fact": "x"}],
                                                       "input_id": "r1"}).json() == r
    reserved = http.post("/v1/sessions/s-4/records", json={"records": [{"type": "harness.x"}]}).json()
    assert reserved["status"] == "rejected" and reserved["code"] == "invalid_records"
    assert http.post("/v1/sessions/s-4/cancel", json={"input_id": "nope"}).json()["code"] == "unknown_input"
    assert http.post("/v1/sessions/s-4/cancel", json={"input_id": "m1"}).json()["code"] == "already_settled"
    message(http, "s-4", "please approve", input_id="m2")
    wait_state(http, "s-4", "waiting")
    c = http.post("/v1/sessions/s-4/cancel", json={"input_id": "m2"}).json()
    if CANCEL_SUPPORTED:
        assert c["status"] == "accepted"
        wait_state(http, "s-4", "idle")
    else:
        assert c["status"] == "rejected" and c["code"] == "cancel_unsupported"


def test_list_filters_and_pages(http: httpx.Client) -> None:
    for sid in ("l-1", "l-2", "l-3"):
        message(http, sid, "hello")
    message(http, "l-4", "please approve")
    wait_state(http, "l-4", "waiting")
    for sid in ("l-1", "l-2", "l-3"):
        wait_state(http, sid, "idle")
    everything = http.get("/v1/sessions").json()["sessions"]
    assert {s["session_id"] for s in everything} == {"l-1", "l-2", "l-3", "l-4"}
    waiting = http.get("/v1/sessions", params={"state": "waiting"}).json()["sessions"]
    assert [s["session_id"] for s in waiting] == ["l-4"] and waiting[0]["open_asks"][0]["name"] == "approval"
    assert http.get("/v1/sessions", params={"harness": "other"}).json()["sessions"] == []
    seen: list[str] = []
    cursor = None
    while True:
        params: dict[str, Any] = {"limit": 1}
        if cursor:
            params["cursor"] = cursor
        page = http.get("/v1/sessions", params=params).json()
        seen += [s["session_id"] for s in page["sessions"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert sorted(seen) == ["l-1", "l-2", "l-3", "l-4"] and len(seen) == 4
    for broken in ("zzz", "l-1", "12.", ".l-1"):  # read as the start, paging on it never ended
        bad = http.get("/v1/sessions", params={"cursor": broken})
        assert bad.status_code == 422 and "next_cursor" in bad.json()["detail"][0]["msg"], broken


def test_validation_errors_are_422_and_big_bodies_413(http: httpx.Client) -> None:
    assert http.post("/v1/sessions/s-5/messages", json={"harness": HARNESS}).status_code == 422
    assert http.post("/v1/sessions/s-5/messages", json={"text": "x", "extra": 1}).status_code == 422
    assert http.post("/v1/sessions/s-5/messages", content=b"{not json", headers={"content-type": "application/json"}
                     ).status_code == 422
    assert http.post("/v1/sessions/%20bad/messages", json={"text": "x"}).status_code == 422  # a space at an end
    assert http.get("/v1/sessions/s-5/events", params={"after": -1}).status_code == 422
    r = http.post("/v1/sessions/s-5/messages", json={"text": "x" * (2 * 1024 * 1024), "harness": HARNESS})
    assert r.status_code == 413
    assert http.get("/v1/sessions/never").status_code == 404
    assert http.post("/v1/sessions/never/answers", json={"tool_call_id": "a", "name": "b", "value": 1}
                     ).status_code == 404


def test_a_users_mistakes_get_one_clear_message_each(http: httpx.Client) -> None:
    """What a new user got wrong on the first try, and what they were told."""
    # Not JSON: 415 names the header to send, not "a valid dictionary".
    for headers, content in (({"content-type": "application/x-www-form-urlencoded"}, b"text=hi"),
                             ({"content-type": "text/plain"}, b'{"text": "hi"}'), ({}, b'{"text": "hi"}')):
        r = http.post("/v1/sessions/m-1/messages", content=content, headers=headers)
        assert r.status_code == 415 and "Content-Type: application/json" in r.json()["detail"], r.text
    # JSON that is not an object is a 422 (it was sent as JSON), whatever the JSON media type.
    for media in ("application/json", "application/merge-patch+json"):
        r = http.post("/v1/sessions/m-1/messages", content=b"[1]", headers={"content-type": media})
        assert r.status_code == 422, (media, r.text)
    # Broken JSON: where and why, in words.
    r = http.post("/v1/sessions/m-1/messages", content=b'{"text": "hi",}', headers={"content-type": "application/json"})
    assert r.status_code == 422
    [error] = r.json()["detail"]
    assert error["msg"].startswith("the body is not valid JSON at character 14") and error["loc"] == ["body"]
    # A body FastAPI cannot read at all: 422 saying why, not a bare 400.
    for content, why in ((b"[" * 100_000, "nested too deeply"), (b'{"text": "\xff"}', "not UTF-8")):
        r = http.post("/v1/sessions/m-1/records", content=content, headers={"content-type": "application/json"})
        assert r.status_code == 422 and why in r.json()["detail"][0]["msg"], r.text
    # A refused body is not sent back: a text over the limit gets a short answer.
    big = http.post("/v1/sessions/m-1/messages", json={"text": "x" * 300_000, "harness": HARNESS})
    assert big.status_code == 422 and len(big.content) < 500 and "262144" in big.text
    # A body streamed without a length is held to the same limit as one with it: 413, not 400.
    chunks = (b"x" * 65536 for _ in range(32))
    r = http.post("/v1/sessions/m-1/messages", content=chunks, headers={"content-type": "application/json"})
    assert r.status_code == 413 and "request body over" in r.json()["detail"]
    # A wait that is not a number of seconds.
    r = http.post("/v1/sessions/m-1/messages", params={"wait": "NaN"}, json={"text": "hi", "harness": HARNESS})
    assert r.status_code == 422 and "finite" in r.text
    # A message may not take the id an answer or a cancel would have.
    message(http, "m-1", "hello", input_id="n2")
    for prefix in ("cancel:", "answer:"):
        r = http.post("/v1/sessions/m-1/messages", json={"text": "hi", "input_id": f"{prefix}n2"})
        assert r.status_code == 422 and "kept for the ids of answers and cancels" in r.text, r.text
    r = http.post("/v1/sessions/m-1/records", json={"records": [{"type": "a.b"}], "input_id": "cancel:n2"})
    assert r.status_code == 422
    assert http.get("/v1/sessions/m-1").status_code == 200
    # A second, different answer to an answered ask: already_answered (as the CLI says), not a conflict of ids.
    message(http, "m-2", "please approve", input_id="p1")
    ask = wait_state(http, "m-2", "waiting")["open_asks"][0]
    first = {"tool_call_id": ask["tool_call_id"], "name": "approval", "value": {"approved": True}}
    assert http.post("/v1/sessions/m-2/answers", params={"wait": 20}, json=first).json()["status"] == "accepted"
    other = {**first, "value": {"approved": False}}
    second = http.post("/v1/sessions/m-2/answers", json=other).json()
    assert second["status"] == "rejected" and second["code"] == "already_answered", second


def test_a_long_sessions_page_can_be_limited_to_its_last_items(http: httpx.Client) -> None:
    """A session of thousands of turns made a page of 30 MB that the console fetched again
    at every event; ``timeline_limit`` keeps the last items (the console asks for 500)."""
    for i in range(4):
        message(http, "t-1", f"hello {i}", input_id=f"in-{i}")
        wait_for(lambda i=i: detail(http, "t-1")["summary"]["turns"] == i + 1 and
                 detail(http, "t-1")["summary"]["state"] == "idle", timeout=30, what="the turn")
    whole = detail(http, "t-1")
    assert whole["timeline_skipped"] == 0 and whole["transcript_skipped"] == 0
    r = http.get("/v1/sessions/t-1", params={"timeline_limit": 3})
    assert r.status_code == 200, r.text
    part = r.json()
    assert part["timeline"] == whole["timeline"][-3:] and part["transcript"] == whole["transcript"][-3:]
    assert part["timeline_skipped"] == len(whole["timeline"]) - 3 > 0
    assert part["transcript_skipped"] == len(whole["transcript"]) - 3 > 0
    assert part["last_position"] == whole["last_position"] and part["summary"] == whole["summary"]
    for bad in (0, -1, "x"):
        assert http.get("/v1/sessions/t-1", params={"timeline_limit": bad}).status_code == 422


def test_values_the_log_cannot_hold_are_refused_not_500(http: httpx.Client) -> None:
    message(http, "s-6", "please approve")
    d = wait_state(http, "s-6", "waiting")
    call = d["open_asks"][0]["tool_call_id"]
    raw = {"content-type": "application/json"}
    r = http.post("/v1/sessions/s-6/messages", content='{"text": "\\ud800", "harness": "tests/approvals"}', headers=raw)
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "text"]  # never a broken response
    r = http.post("/v1/sessions/s-6/answers", headers=raw,
                  content='{"tool_call_id": "' + call + '", "name": "approval", '
                          '"value": {"approved": true, "note": "\\udc00"}}')
    assert r.status_code == 200
    assert r.json()["status"] == "rejected" and r.json()["code"] in ("invalid_input", "invalid_answer")
    r = http.post("/v1/sessions/s-6/records", headers=raw, content='{"records": [{"type": "a.b", "x": "\\ud800"}]}')
    assert r.status_code == 200 and r.json()["status"] == "rejected"
    assert detail(http, "s-6")["summary"]["state"] == "waiting"  # nothing broke the session
    receipt = http.post("/v1/sessions/s-6/records", json={"records": [{"type": "a.b"}]}).json()
    assert set(receipt) == {"input_id", "status", "position"}  # no nulls in a receipt


def test_views_are_the_clis(served: ServerThread, http: httpx.Client) -> None:
    """The API's session page and list are what `harness show --json` and `harness sessions --json`
    print for the same log: one source of truth (harness.views, harness.runtime.catalog)."""
    message(http, "v-1", "hello", input_id="in-1")
    message(http, "v-2", "please approve", input_id="in-2")
    wait_state(http, "v-1", "idle")
    d = wait_state(http, "v-2", "waiting")
    shown = cli_json(served, "show", "v-2")
    assert d["summary"] == shown["summary"]
    assert d["timeline"] == shown["timeline"]
    assert d["usage"] == shown["summary"]["usage"] == {"calls": 1, "input_tokens": 50, "output_tokens": 5,
                                                       "cost": None}
    assert [(i["kind"], i["name"]) for i in d["timeline"] if i["kind"].startswith("model.")] == [
        ("model.response", None), ("model.usage", "scripted")]
    listed = cli_json(served, "sessions")
    rows = http.get("/v1/sessions").json()["sessions"]
    assert [row.pop("path") for row in rows] == ["/v1/sessions/v-2", "/v1/sessions/v-1"]  # and where each is
    assert rows == listed
    assert [s["session_id"] for s in listed] == ["v-2", "v-1"]


def cli_json(served: ServerThread, *args: str) -> Any:
    done = subprocess.run(harness_command(*args, "--log", served.settings.log, "--json"), capture_output=True,
                          text=True, env=child_env(), timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.parametrize(("sids", "line"), [
    (("w-1", "w-2", "w-3"), "3 sessions indexed"),
    (("w-1",), "1 session indexed"),
])
def test_a_gateway_lists_the_log_once_it_answers_before_any_request(
    tmp_path: Any, caplog: Any, sids: tuple[str, ...], line: str
) -> None:
    """The first listing of a big log takes seconds (on Kafka: every partition's checkpoint
    and tail); a gateway starts it as soon as the log answers, so no request waits for it."""
    import logging

    from tests.apps.approvals import approvals
    from tests.gateway.helpers import open_settings

    url = f"sqlite:///{tmp_path / 'h.db'}"
    with ServerThread(open_settings(url), harnesses=[approvals], worker=True) as first, \
            httpx.Client(base_url=first.url, timeout=30) as http:
        for sid in sids:
            message(http, sid, "hello")
        for sid in sids:
            wait_state(http, sid, "idle")
    caplog.set_level(logging.INFO, logger="harness.gateway")
    with ServerThread(open_settings(url), harnesses=[approvals]) as second:
        assert second.state is not None
        wait_for(lambda: second.state.warming is not None and second.state.warming.done(), timeout=30,
                 what="the first listing")
        assert any(line in r.getMessage() for r in caplog.records), caplog.text
        with httpx.Client(base_url=second.url, timeout=30) as http:
            assert {s["session_id"] for s in http.get("/v1/sessions").json()["sessions"]} == set(sids)


def test_a_path_or_method_that_does_not_exist_says_what_does(http: httpx.Client) -> None:
    r = http.get("/v2/foo")
    assert r.status_code == 404 and r.headers["content-type"] == "application/json", r.text
    assert r.json() == {"detail": "no route GET /v2/foo; the API is under /v1, see /docs "
                                  "(health: /healthz, /readyz; console: /)"}
    r = http.get("/v1/sessions/s-1/messages")  # a POST route
    assert r.status_code == 405 and r.headers["allow"] == "POST", r.text
    assert r.json() == {"detail": "GET is not allowed on /v1/sessions/s-1/messages: it takes POST"}
    # A load balancer's probe may be a HEAD.
    for path in ("/healthz", "/readyz"):
        r = http.head(path)
        assert r.status_code == 200 and r.content == b"", (path, r.status_code)
    # The browser's icon request on every console page: no 404 in its console.
    assert http.get("/favicon.ico").status_code == 204
