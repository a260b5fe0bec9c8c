"""``POST /v1/sessions/{id}/messages?wait=SECONDS``: one request that answers how the turn
ended (or that it waits for a person, or that it still runs), over real HTTP, gateway +
worker on SQLite."""

from __future__ import annotations

from typing import Any

import httpx

from harness.records import InputAnswer, InputSettled, LogEntry
from harness.replay.state import fold
from harness.services.gateway.settlement import RUNNING, Settlement, answer_settlement_of, settlement_of
from tests.gateway.helpers import HARNESS


def send(http: httpx.Client, sid: str, text: str, wait: Any, **kw: Any) -> dict[str, Any]:
    r = http.post(f"/v1/sessions/{sid}/messages", params={"wait": wait}, json={"text": text, "harness": HARNESS, **kw})
    assert r.status_code == 200, r.text
    out: dict[str, Any] = r.json()
    return out


def test_a_message_that_waits_gets_the_turns_answer(http: httpx.Client) -> None:
    out = send(http, "w-1", "hello", 20, input_id="in-1")
    assert out["status"] == "accepted" and out["position"] > 0
    assert out["settlement"] == {"outcome": "completed", "text": "echo: hello"}
    # The same input again: no second turn, the same answer at once.
    assert send(http, "w-1", "hello", 20, input_id="in-1")["settlement"] == out["settlement"]
    # Without wait the receipt is as before: no settlement.
    plain = http.post("/v1/sessions/w-1/messages", json={"text": "again"}).json()
    assert plain["status"] in ("accepted", "queued") and "settlement" not in plain


def test_a_turn_that_asks_a_person_answers_waiting_with_the_ask(http: httpx.Client) -> None:
    out = send(http, "w-2", "please approve the refund", 20, input_id="a")
    settlement = out["settlement"]
    assert settlement["outcome"] == "waiting"
    (ask,) = settlement["asks"]
    assert ask["name"] == "approval" and ask["schema"]["properties"]["approved"]["type"] == "boolean"
    # A message behind the waiting turn cannot start: it waits for that turn's ask, and says so.
    queued = send(http, "w-2", "and then hello", 20, input_id="b")
    assert queued["status"] == "queued"
    assert queued["settlement"]["outcome"] == "waiting" and queued["settlement"]["queued_behind"] == "a"
    assert [a["name"] for a in queued["settlement"]["asks"]] == ["approval"]
    # An answer the gateway refuses (off the ask's schema) is written nowhere and waits for nothing.
    bad = {"tool_call_id": ask["tool_call_id"], "name": "approval", "value": {"approved": "maybe"}}
    refused = http.post("/v1/sessions/w-2/answers", params={"wait": 20}, json=bad).json()
    assert refused["status"] == "rejected" and refused["code"] == "invalid_answer" and "settlement" not in refused
    # An answer that waits gets how the turn it resumed ended.
    body = {"tool_call_id": ask["tool_call_id"], "name": "approval", "value": {"approved": True, "note": "ok"}}
    answered = http.post("/v1/sessions/w-2/answers", params={"wait": 20}, json=body).json()
    assert answered["status"] == "accepted"
    assert answered["settlement"] == {"outcome": "completed", "text": 'done: {"approved":true,"note":"ok"}'}
    again = http.post("/v1/sessions/w-2/answers", params={"wait": 20}, json=body).json()
    assert again == answered  # the same answer again: the same receipt and settlement
    # Both turns end; asking again with wait gives each its own answer.
    assert send(http, "w-2", "please approve the refund", 20, input_id="a")["settlement"] == {
        "outcome": "completed",
        "text": 'done: {"approved":true,"note":"ok"}',
    }
    assert send(http, "w-2", "and then hello", 20, input_id="b")["settlement"] == {
        "outcome": "completed",
        "text": "echo: and then hello",
    }


def test_a_turn_longer_than_the_wait_is_running_and_goes_on(http: httpx.Client) -> None:
    out = send(http, "w-3", "take a nap", 0.5, input_id="n")
    assert out["status"] == "accepted" and out["settlement"] == {"outcome": "running"}
    d = http.get("/v1/sessions/w-3").json()
    assert d["summary"]["state"] in ("running", "sleeping")  # the turn goes on without the request


def test_a_refused_message_does_not_wait_and_a_bad_wait_is_422(http: httpx.Client) -> None:
    r = http.post("/v1/sessions/w-4/messages", params={"wait": 20}, json={"text": "hi", "harness": "no/such"}).json()
    assert r["status"] == "rejected" and r["code"] == "unknown_harness" and "settlement" not in r
    for bad in ("0", "-1", "601", "soon"):
        r2 = http.post("/v1/sessions/w-4/messages", params={"wait": bad}, json={"text": "hi", "harness": HARNESS})
        assert r2.status_code == 422, (bad, r2.text)
        assert "wait" in r2.text
    assert http.get("/v1/sessions/w-4").status_code == 404  # nothing was written


def test_the_openapi_document_names_the_wait_and_the_settlement(http: httpx.Client) -> None:
    doc = http.get("/openapi.json").json()
    for route in ("messages", "answers"):
        params = doc["paths"][f"/v1/sessions/{{session_id}}/{route}"]["post"]["parameters"]
        assert any(p["name"] == "wait" and p["in"] == "query" for p in params), route
    outcomes = doc["components"]["schemas"]["SettlementOut"]["properties"]["outcome"]["enum"]
    assert set(outcomes) == {"completed", "failed", "aborted", "rejected", "waiting", "running"}


def test_settlement_of_an_unknown_or_untaken_input_is_none() -> None:
    state = fold("s", [])
    assert settlement_of(state, "in-1", now_ms=0) is None
    assert answer_settlement_of(state, "in-1", now_ms=0) is None
    assert Settlement("running") == RUNNING and RUNNING.to_json() == {"outcome": "running"}


def test_an_answer_the_owner_refused_settles_rejected_and_one_not_taken_yet_is_none() -> None:
    taken = [LogEntry(1, InputAnswer("s", 0, "a1", "c1", "approval", {"approved": True}))]
    assert answer_settlement_of(fold("s", taken), "a1", now_ms=0) is None  # not taken yet
    refused = [*taken, LogEntry(2, InputSettled("s", 0, "a1", "rejected", "ask_expired", "too late"))]
    assert answer_settlement_of(fold("s", refused), "a1", now_ms=0) == Settlement("rejected", "ask_expired", "too late")
    assert settlement_of(fold("s", refused), "a1", now_ms=0) == Settlement("rejected", "ask_expired", "too late")


def test_an_id_holding_a_worker_secret_is_refused_once_and_the_session_goes_on(tmp_path: Any) -> None:
    """The gateway does not know the worker's secrets: it writes the input as it came, and
    the worker refuses it (``secret_in_name``) once, with nothing rewritten and no loop."""
    from tests.apps.approvals import approvals
    from tests.gateway.helpers import ServerThread, open_settings

    secret = "sk-SUPERSECRET-9876"
    settings = open_settings(f"sqlite:///{tmp_path / 'h.db'}")
    with ServerThread(settings, harnesses=[approvals], worker=True, secrets={"apikey": secret}) as server, \
            httpx.Client(base_url=server.url, timeout=30) as http:
        refused = send(http, "sec-1", "hello", 20, input_id=secret)["settlement"]
        assert refused["outcome"] == "rejected" and refused["code"] == "secret_in_name"
        assert "'apikey'" in refused["reason"] and secret not in refused["reason"]
        assert send(http, "sec-1", "hello", 20, input_id="in-2")["settlement"] == {
            "outcome": "completed", "text": "echo: hello"}
        in_session_id = send(http, f"user-{secret}", "hi", 20)["settlement"]
        assert in_session_id["outcome"] == "rejected" and in_session_id["code"] == "secret_in_name"
        assert "session id holds" in in_session_id["reason"]
    async def records() -> list[Any]:
        from harness import open_log

        log = open_log(f"sqlite:///{tmp_path / 'h.db'}")
        try:
            return [e.record for e in await log.read("sec-1")]
        finally:
            await log.close()

    import asyncio

    from harness.records import TurnStarted

    found = asyncio.run(records())
    assert [(r.input_id, r.outcome) for r in found if isinstance(r, InputSettled)] == [
        (secret, "rejected"), ("in-2", "completed")]
    assert [r.input_id for r in found if isinstance(r, TurnStarted)] == ["in-2"]  # no loop, no turn for the refused
