"""What a user sees over HTTP (gateway + worker on SQLite) of later copies of an input
(SPEC 7.2: a resend has no second effect; racing producers may leave copies in the log)
and of the waits of a cancelled turn."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from harness.ids import tenant_session_id
from harness.log import open_log
from harness.records import InputMessage, InputRecords, Record
from tests.apps.approvals import approvals
from tests.gateway.helpers import HARNESS, ServerThread, open_settings, read_events, wait_for

NOTES = [{"type": "app.note", "fact": "x"}]


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[httpx.Client, str]]:
    url = f"sqlite:///{tmp_path / 'h.db'}"
    with (ServerThread(open_settings(url), harnesses=[approvals], worker=True) as server,
          httpx.Client(base_url=server.url, timeout=30) as http):
        yield http, url


def produce(url: str, *records: Record) -> None:
    """Write inputs as another gateway or client would, past every look-up."""
    async def write() -> None:
        log = open_log(url)
        try:
            for record in records:
                await log.submit(record)
        finally:
            await log.close()

    asyncio.run(write())


def detail(http: httpx.Client, sid: str) -> dict[str, Any]:
    r = http.get(f"/v1/sessions/{sid}")
    assert r.status_code == 200, r.text
    out: dict[str, Any] = r.json()
    return out


def settled(http: httpx.Client, sid: str, input_id: str) -> dict[str, Any]:
    def check() -> Any:
        d = detail(http, sid)
        done = any(i["kind"] == "input.settled" and i["input_id"] == input_id for i in d["timeline"])
        return d if done and d["summary"]["state"] in ("idle", "failed") else None
    out: dict[str, Any] = wait_for(check, timeout=30, what=f"{input_id} to settle")
    return out


def test_s7_2_copies_of_an_input_read_resent_in_the_timeline_and_the_events(served: tuple[httpx.Client, str]) -> None:
    http, url = served
    sid, log_sid = "dup-1", tenant_session_id(None, "dup-1")

    def post(_: int) -> dict[str, Any]:
        body = {"text": "hi", "harness": HARNESS, "input_id": "same-1"}
        with httpx.Client(base_url=str(http.base_url), timeout=30) as one:
            reply: dict[str, Any] = one.post(f"/v1/sessions/{sid}/messages", json=body).json()
            return reply

    with ThreadPoolExecutor(5) as pool:  # the trial's five at once (copies or not, the views hold)
        receipts = list(pool.map(post, range(5)))
    assert len({r["position"] for r in receipts}) == 1
    settled(http, sid, "same-1")
    r = http.post(f"/v1/sessions/{sid}/records", json={"records": NOTES, "input_id": "rec-same"}).json()
    assert r["status"] == "accepted"
    settled(http, sid, "rec-same")
    # copies from producers that did not see the first ones (always there, whatever the race did)
    produce(url, InputMessage(log_sid, 1, "same-1", "hi", HARNESS), InputRecords(log_sid, 2, "rec-same", NOTES),
            InputMessage(log_sid, 3, "same-1", "hi"))

    d = detail(http, sid)
    first = receipts[0]["position"]
    messages = [i for i in d["timeline"] if i["kind"] == "input.message"]
    assert messages[0]["status"] == "completed" and len(messages) >= 3
    assert all((i["status"], i["detail"], i["text"]) == ("resent", {"first_position": first}, None)
               for i in messages[1:])
    records = [i for i in d["timeline"] if i["kind"] == "input.records"]
    assert [(i["status"], i["value"]) for i in records] == [("completed", NOTES), ("resent", None)]
    assert d["summary"]["state"] == "idle" and d["summary"]["pending_inputs"] == 0 and d["summary"]["turns"] == 1

    last = d["last_position"]
    for params in ({}, {"after": first}):  # from the start, and resumed after the first copy
        with http.stream("GET", f"/v1/sessions/{sid}/events", params=params) as response:
            events = read_events(response, until=lambda evs: any(e.id == last for e in evs))
        resent = [e for e in events if e.event == "harness.input.resent"]
        copies = [i["seq"] for i in d["timeline"] if i["status"] == "resent" and i["seq"] > params.get("after", 0)]
        assert [e.id for e in resent] == copies and len(copies) >= 3
        assert {e.data["data"]["first_position"] for e in resent if e.data["data"]["input_id"] == "same-1"} == {first}
        assert all("records" not in e.data["data"] and "text" not in e.data["data"] for e in resent)
        sent = [e.data["data"]["records"] for e in events if e.event == "harness.input.records"]
        assert sent == [NOTES]  # the app records once
        assert [e.data["data"]["text"] for e in events if e.event == "harness.input.message"] == (
            [] if params else ["hi"])


def test_a_cancelled_turn_lists_no_sleep_and_no_open_ask(served: tuple[httpx.Client, str]) -> None:
    http, _ = served
    body = {"text": "take a nap", "harness": HARNESS, "input_id": "rem-1"}
    assert http.post("/v1/sessions/s-6/messages", json=body).json()["status"] == "accepted"
    d = wait_for(lambda: (x := detail(http, "s-6"))["summary"]["state"] == "sleeping" and x, timeout=30,
                 what="the turn to sleep")
    assert [(s["name"], s["due"]) for s in d["sleeps"]] == [("nap", False)]
    assert http.post("/v1/sessions/s-6/cancel", json={"input_id": "rem-1"}).json()["status"] == "accepted"
    d = settled(http, "s-6", "rem-1")
    assert d["summary"]["state"] == "idle" and d["summary"]["sleeping_until"] is None
    assert d["sleeps"] == [] and d["open_asks"] == []

    body = {"text": "please approve", "input_id": "rem-2"}
    assert http.post("/v1/sessions/s-6/messages", json=body).json()["status"] == "accepted"
    wait_for(lambda: detail(http, "s-6")["summary"]["state"] == "waiting", timeout=30, what="the ask")
    assert http.post("/v1/sessions/s-6/cancel", json={"input_id": "rem-2"}).json()["status"] == "accepted"
    d = settled(http, "s-6", "rem-2")
    assert d["open_asks"] == [] and d["sleeps"] == []
    [ask] = [i for i in d["timeline"] if i["kind"] == "ask"]
    assert ask["status"] == "closed"  # not open, waiting for an answer, for ever
