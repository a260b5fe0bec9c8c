"""Session ids that hold a '/' (the library and the CLI allow them: ``harness send team/alice``)
over real HTTP: listed with a path that opens them, and every per-session route takes them
sent percent-encoded (``team%2Falice``), which is what an HTTP client does for a path segment."""

from __future__ import annotations

import subprocess
from pathlib import Path

import httpx

from harness.ids import MAX_ID, session_id_problem
from harness.services.gateway.middleware import session_url_path
from harness.services.gateway.settings import GatewaySettings
from tests.apps.approvals import approvals
from tests.gateway.helpers import (
    HARNESS,
    ServerThread,
    child_env,
    harness_command,
    read_events,
    settled,
    wait_for,
)


def state_of(http: httpx.Client, path: str) -> str | None:
    r = http.get(path)
    return r.json()["summary"]["state"] if r.status_code == 200 else None


def test_a_session_id_with_a_slash_is_reached_by_every_route(served: ServerThread, http: httpx.Client) -> None:
    done = subprocess.run(harness_command("send", "team/alice", "please approve", "--harness", HARNESS, "--no-wait",
                                          "--input-id", "m1", "--log", served.settings.log),
                          capture_output=True, text=True, env=child_env(), timeout=60)
    assert done.returncode == 0, done.stderr
    wait_for(lambda: state_of(http, "/v1/sessions/team%2Falice") == "waiting", timeout=30,
             what="the CLI's session team/alice to wait for a person, over HTTP")

    [row] = [s for s in http.get("/v1/sessions").json()["sessions"] if s["session_id"] == "team/alice"]
    assert row["path"] == "/v1/sessions/team%2Falice"
    page = http.get(row["path"]).json()
    assert page["summary"]["session_id"] == "team/alice"
    ask = page["open_asks"][0]

    with http.stream("GET", row["path"] + "/events") as response:
        assert response.status_code == 200
        events = read_events(response, until=lambda evs: any(e.event == "harness.ask.opened" for e in evs))
    assert events[0].event == "hello" and events[0].data["session_id"] == "team/alice"
    assert all(e.data["data"]["session_id"] == "team/alice" for e in events[1:])

    answer = {"tool_call_id": ask["tool_call_id"], "name": "approval", "value": {"approved": True}}
    r = http.post(row["path"] + "/answers", params={"wait": 20}, json=answer).json()
    assert r["status"] == "accepted" and r["settlement"]["outcome"] == "completed", r
    r = http.post(row["path"] + "/messages", params={"wait": 20}, json={"text": "hello", "input_id": "m2"}).json()
    assert r["status"] == "accepted" and r["settlement"]["outcome"] == "completed", r
    r = http.post(row["path"] + "/records", json={"records": [{"type": "app.note"}], "input_id": "r1"}).json()
    assert r["status"] == "accepted", r
    assert http.post(row["path"] + "/cancel", json={"input_id": "m2"}).json()["code"] == "already_settled"
    with http.stream("GET", row["path"] + "/events") as response:
        assert settled(read_events(response, until=lambda evs: settled(evs, "m2")), "m2")

    # The same id, made over HTTP: what the gateway lists, the CLI shows.
    r = http.post("/v1/sessions/team%2Fbob/messages", params={"wait": 20},
                  json={"text": "hello", "harness": HARNESS}).json()
    assert r["settlement"]["outcome"] == "completed", r
    shown = subprocess.run(harness_command("show", "team/bob", "--log", served.settings.log, "--json"),
                           capture_output=True, text=True, env=child_env(), timeout=60)
    assert shown.returncode == 0, shown.stderr


def test_every_id_the_library_takes_is_served(served: ServerThread, http: httpx.Client) -> None:
    """One rule of session ids (``harness.ids.session_id_problem``): an id the CLI made (512
    non-ASCII letters, a space inside, a '%', an empty part) is listed with a path that opens it."""
    made = ["é" * MAX_ID, "a b", "team%2Falice", "team/", "/x//y"]
    for sid in made:
        done = subprocess.run(harness_command("send", sid, "hello", "--harness", HARNESS, "--no-wait",
                                              "--log", served.settings.log),
                              capture_output=True, text=True, env=child_env(), timeout=60)
        assert done.returncode == 0, (sid, done.stderr)
    def listed() -> dict[str, dict[str, str]] | None:
        rows = {s["session_id"]: s for s in http.get("/v1/sessions").json()["sessions"]}
        return rows if set(made) <= set(rows) else None

    rows = wait_for(listed, timeout=30, what="the CLI's sessions to be listed")
    for sid in made:
        r = http.get(rows[sid]["path"])
        assert r.status_code == 200 and r.json()["summary"]["session_id"] == sid, (sid, r.text)
        r = http.post(rows[sid]["path"] + "/messages", params={"wait": 20}, json={"text": "again"})
        assert r.status_code == 200 and r.json()["settlement"]["outcome"] == "completed", (sid, r.text)


def test_an_id_the_library_refuses_is_refused_in_its_words(http: httpx.Client) -> None:
    for sid in ["x" * (MAX_ID + 1), " lead", "trail ", "new\nline", "nul\x00"]:
        r = http.post(session_url_path(sid) + "/messages", json={"text": "hi", "harness": HARNESS})
        assert r.status_code == 422, (sid, r.text)
        [error] = r.json()["detail"]
        assert error == {"loc": ["path", "session_id"], "msg": session_id_problem(sid), "type": "value_error"}
        assert http.get(session_url_path(sid)).status_code == 422


def test_mistakes_with_slashes_get_one_clear_line(http: httpx.Client) -> None:
    # A '/' sent as it is is a separator: no route, and the answer says how to send it.
    r = http.get("/v1/sessions/team/alice")
    assert r.status_code == 404 and "%2F" in r.json()["detail"], r.text
    # '%2F' meant literally (sent as %252F) is a '%' in the id, not a '/': another session.
    r = http.post("/v1/sessions/team%252Falice/messages", params={"wait": 20}, json={"text": "hi", "harness": HARNESS})
    assert r.status_code == 200, r.text
    assert http.get("/v1/sessions/team%2Falice").status_code == 404
    assert http.get("/v1/sessions").json()["sessions"][0]["path"] == "/v1/sessions/team%252Falice"
    # With no tenant the log's id is the id itself: t/<tenant>/<id> would be a tenant's session.
    r = http.post("/v1/sessions/t%2Facme%2Fs-1/messages", json={"text": "hi", "harness": HARNESS})
    assert r.status_code == 422 and "kept for the sessions of tenants" in r.json()["detail"][0]["msg"], r.text
    assert http.get("/v1/sessions/t%2Facme%2Fs-1/events").status_code == 422


def test_a_tenants_id_leaves_room_for_its_prefix_in_the_log(tmp_path: Path) -> None:
    (tmp_path / "keys").write_text("acme key-acme-1234\n")
    settings = GatewaySettings(log=f"sqlite:///{tmp_path / 'h.db'}", api_keys_file=str(tmp_path / "keys"))
    with ServerThread(settings, harnesses=[approvals], worker=True) as server, \
            httpx.Client(base_url=server.url, timeout=30, headers={"Authorization": "Bearer key-acme-1234"}) as http:
        room = MAX_ID - len("t/acme/")
        longest = "é" * room
        r = http.post(session_url_path(longest) + "/messages", params={"wait": 20}, json={"text": "hi", "harness": HARNESS})
        assert r.status_code == 200 and r.json()["settlement"]["outcome"] == "completed", r.text
        assert http.get(session_url_path(longest)).status_code == 200
        r = http.post(session_url_path(longest + "é") + "/messages", json={"text": "hi", "harness": HARNESS})
        assert r.status_code == 422, r.text
        [error] = r.json()["detail"]
        assert error["msg"] == session_id_problem(longest + "é", "acme") and str(room) in error["msg"], error
