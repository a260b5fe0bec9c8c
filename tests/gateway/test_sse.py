"""SSE over real HTTP: hello first, one event per record (id = position), heartbeats,
and a stream cut mid-way resumed with Last-Event-ID: no gap, no duplicate. SQLite (gateway
+ worker in one process) and Kafka (the gateway alone; a `harness worker` process)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from harness.ids import tenant_session_id
from harness.live.kafka import KafkaLiveTails
from harness.log import open_log
from harness.log.follow import shared_reader
from harness.log.kafka import log as kafka_log_module
from harness.testing.model_server import ModelServer, Reply
from tests.apps.approvals import approvals
from tests.gateway.helpers import (
    APP,
    HARNESS,
    Event,
    Process,
    ServerThread,
    open_settings,
    read_events,
    read_events_from,
    settled,
    start_process,
    wait_for,
)


def log_positions(url: str, session_id: str) -> list[int]:
    async def read() -> list[int]:
        log = open_log(url)
        try:
            return [e.seq for e in await log.read(session_id)]
        finally:
            await log.close()

    return asyncio.run(read())


def cut_and_resume(http: httpx.Client, log_url: str, sid: str, *, use_header: bool) -> None:
    """Stream a session while it runs, cut the stream mid-way, resume; the union is the log."""
    assert http.post(f"/v1/sessions/{sid}/messages",
                     json={"text": "please approve", "harness": HARNESS, "input_id": "m1"}).json()["status"] == "accepted"
    first: list[Event] = []
    with http.stream("GET", f"/v1/sessions/{sid}/events") as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        first = read_events(response, until=lambda evs: any(e.event == "harness.ask.opened" for e in evs))
    assert first[0].event == "hello" and first[0].id is None and first[0].data["session_id"] == sid
    records = [e for e in first if e.id is not None]
    ask = next(e for e in records if e.event == "harness.ask.opened")
    assert ask.data["data"]["session_id"] == sid  # the caller's id, never the log's
    # the stream is cut: meanwhile the turn goes on and another message comes
    answer = {"tool_call_id": ask.data["data"]["tool_call_id"], "name": "approval", "value": {"approved": True}}
    assert http.post(f"/v1/sessions/{sid}/answers", json=answer).json()["status"] == "accepted"
    assert http.post(f"/v1/sessions/{sid}/messages", json={"text": "hello", "input_id": "m2"}).json()["status"] in (
        "accepted", "queued")
    last = records[-1].id
    assert last is not None
    if use_header:
        request = http.stream("GET", f"/v1/sessions/{sid}/events", headers={"Last-Event-ID": str(last)})
    else:
        request = http.stream("GET", f"/v1/sessions/{sid}/events", params={"after": last})
    with request as response:
        second = read_events(response, until=lambda evs: settled(evs, "m2"))
    assert second[0].event == "hello" and second[0].data["after"] == last
    seen = [e.id for e in records] + [e.id for e in second if e.id is not None]
    assert len(seen) == len(set(seen)), "a record was sent twice"
    assert seen == sorted(seen)
    log_sid = tenant_session_id(None, sid)
    on_log = log_positions(log_url, log_sid)
    assert seen == on_log[: len(seen)], "the streams together are not the log (a gap)"
    assert seen[-1] == on_log[-1] or settled(second, "m2")


def test_sse_cut_and_resume_sqlite(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'h.db'}"
    with ServerThread(open_settings(url), harnesses=[approvals], worker=True) as server, \
            httpx.Client(base_url=server.url, timeout=30) as http:
        cut_and_resume(http, url, "sse-1", use_header=True)
        cut_and_resume(http, url, "sse-2", use_header=False)


def test_a_stream_opened_before_the_first_message_gets_every_event(tmp_path: Path) -> None:
    """A client opens the stream of a new session, then sends its first message: every record
    of the session comes, from the first; the plain GET stays 404 until then."""
    url = f"sqlite:///{tmp_path / 'h.db'}"
    with ServerThread(open_settings(url, heartbeat_s=0.1), harnesses=[approvals], worker=True) as server, \
            httpx.Client(base_url=server.url, timeout=30) as http:
        assert http.get("/v1/sessions/early").status_code == 404
        with http.stream("GET", "/v1/sessions/early/events") as response:
            assert response.status_code == 200
            lines = response.iter_lines()
            [hello] = read_events_from(lines, until=lambda evs: len(evs) >= 1)
            assert hello.event == "hello" and hello.data == {"session_id": "early", "after": 0, "heartbeat_s": 0.1}
            # the stream waits on the log's one shared reader, as any other stream does
            assert server.state is not None
            fanout = shared_reader(server.state.log)
            assert fanout is not None
            wait_for(lambda: fanout.subscribers("early") == 1, timeout=10, what="the stream's subscription")
            assert http.get("/v1/sessions/early").status_code == 404
            r = http.post("/v1/sessions/early/messages", json={"text": "hello", "harness": HARNESS, "input_id": "m1"})
            assert r.json()["status"] == "accepted"
            events = read_events_from(lines, until=lambda evs: settled(evs, "m1"))
        seen = [e.id for e in events if e.id is not None]
        on_log = log_positions(url, "early")
        assert seen == on_log[: len(seen)] and seen[0] == on_log[0], (seen, on_log)
        # A cursor given for a session with no record yet starts at its beginning too.
        with http.stream("GET", "/v1/sessions/later/events", headers={"Last-Event-ID": "7"}) as response:
            lines = response.iter_lines()
            [hello] = read_events_from(lines, until=lambda evs: len(evs) >= 1)
            assert hello.data["after"] == 0
            http.post("/v1/sessions/later/messages", json={"text": "hello", "harness": HARNESS, "input_id": "m1"})
            events = read_events_from(lines, until=lambda evs: settled(evs, "m1"))
        assert next(e.id for e in events if e.id is not None) == log_positions(url, "later")[0]
        # An id the gateway does not take is refused, in one line.
        r = http.get("/v1/sessions/%20bad/events")  # (the library's rule: no space at an end)
        assert r.status_code == 422 and "space at an end" in r.json()["detail"][0]["msg"], r.text


def test_sse_heartbeats_while_idle(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'h.db'}"
    with ServerThread(open_settings(url, heartbeat_s=0.1), harnesses=[approvals], worker=True) as server, \
            httpx.Client(base_url=server.url, timeout=30) as http:
        http.post("/v1/sessions/hb/messages", json={"text": "hello", "harness": HARNESS, "input_id": "x"})
        wait_for(lambda: http.get("/v1/sessions/hb").json()["summary"]["state"] == "idle", timeout=30, what="idle")
        comments: list[str] = []
        last = max(log_positions(url, tenant_session_id(None, "hb")))
        with http.stream("GET", "/v1/sessions/hb/events", headers={"Last-Event-ID": str(last)}) as response:
            events = read_events(response, until=lambda evs: len(comments) >= 2, comments=comments)
        assert [e.event for e in events] == ["hello"]  # nothing after the given position
        assert comments[:2] == [": heartbeat", ": heartbeat"]
        # A cursor past the session's last record (another log's, a made-up one) resumes at
        # its end: the next records come (they were held back until the log passed it).
        with http.stream("GET", "/v1/sessions/hb/events", headers={"Last-Event-ID": "999999"}) as response:
            lines = response.iter_lines()
            hello = read_events_from(lines, until=lambda evs: len(evs) >= 1)
            assert hello[0].event == "hello" and hello[0].data["after"] == last
            http.post("/v1/sessions/hb/messages", json={"text": "again", "input_id": "y"})
            events = read_events_from(lines, until=lambda evs: settled(evs, "y"))
        assert events and all(e.id is not None and e.id > last for e in events if e.event != "hello")
        assert http.get("/v1/sessions/hb/events", headers={"Last-Event-ID": "abc"}).status_code == 422


@pytest.fixture
def kafka_gateway(kafka_bootstrap: str, unique_prefix: str, tmp_path: Path) -> Iterator[tuple[str, str, Process]]:
    url = f"kafka://{kafka_bootstrap}?topic_prefix={unique_prefix}&partitions=2"
    worker = start_process(["worker", "--log", url, "--app", APP], ready="worker ready")
    try:
        with ServerThread(open_settings(url)) as server:
            yield url, server.url, worker
    finally:
        worker.stop()


@pytest.mark.kafka
def test_sse_cut_and_resume_kafka(kafka_gateway: tuple[str, str, Process]) -> None:
    url, base, _worker = kafka_gateway
    with httpx.Client(base_url=base, timeout=60) as http:
        cut_and_resume(http, url, "k-1", use_header=True)
        # a second session in the same process shares the partition readers
        cut_and_resume(http, url, "k-2", use_header=False)


@pytest.mark.kafka
def test_a_kafka_stream_opened_before_the_first_message_gets_every_event(
    kafka_gateway: tuple[str, str, Process]
) -> None:
    """On Kafka the stream of a session with no record yet waits on its partition's shared
    tail, like any other; the first message's records all come."""
    url, base, _worker = kafka_gateway
    with httpx.Client(base_url=base, timeout=60) as http, http.stream("GET", "/v1/sessions/k-early/events") as response:
        assert response.status_code == 200
        lines = response.iter_lines()
        [hello] = read_events_from(lines, until=lambda evs: len(evs) >= 1)
        assert hello.data["after"] == 0
        r = http.post("/v1/sessions/k-early/messages", json={"text": "hello", "harness": HARNESS, "input_id": "m1"})
        assert r.json()["status"] == "accepted"
        events = read_events_from(lines, until=lambda evs: settled(evs, "m1"))
    seen = [e.id for e in events if e.id is not None]
    on_log = log_positions(url, "k-early")
    assert seen == on_log[: len(seen)] and seen[0] == on_log[0], (seen, on_log)


REAL_MODEL_APP = "tests.apps.real_model:assistant"
REAL_MODEL = "tests/real-model"
ANSWER = "Streaming from the worker to a browser, through the gateway."


@pytest.fixture
def model_server() -> Iterator[ModelServer]:
    with ModelServer() as server:
        yield server


def model_env(server: ModelServer) -> dict[str, str]:
    return {"HARNESS_TEST_MODEL_URI": f"openai+{server.openai_url}:test-model"}


def stream_deltas(http: httpx.Client, server: ModelServer, sid: str, *, pause: bool = True,
                  in_process: bool = False) -> None:
    """A streamed answer's text deltas reach an SSE stream as events without an id, before the
    committed response; the stream was opened (hello) before the message was sent. With
    ``pause`` the model stops half-way: the deltas came, the response is not logged yet.
    ``in_process``: the deltas come from the worker's loop, so even the last one is in the
    stream before the response (through Kafka's two topics that is only very likely)."""
    server.script(Reply(text="hi"), Reply(text=ANSWER, chunk=6, pause_after=4 if pause else None))
    first = http.post(f"/v1/sessions/{sid}/messages", json={"text": "hello", "harness": REAL_MODEL,
                                                           "input_id": "m1"}).json()
    assert first["status"] == "accepted"
    wait_for(lambda: http.get(f"/v1/sessions/{sid}").json()["summary"]["state"] == "idle", timeout=60, what="idle")
    after = http.get(f"/v1/sessions/{sid}").json()["last_position"]
    with http.stream("GET", f"/v1/sessions/{sid}/events", params={"after": after}) as response:
        lines = response.iter_lines()
        hello = read_events_from(lines, until=lambda evs: bool(evs))
        assert hello[0].event == "hello"
        sent = http.post(f"/v1/sessions/{sid}/messages", json={"text": "stream please", "input_id": "m2"}).json()
        assert sent["status"] == "accepted"
        before = read_events_from(lines, until=lambda evs: any(e.event == "model.text.delta" for e in evs))
        if pause:
            assert server.paused.wait(30)  # half-way: the model holds the rest of its answer
            assert not any(e.event == "harness.model.response" for e in before)
            server.release()

        def done(evs: list[Event]) -> bool:
            # (through Kafka's two topics the records can all come before the first delta:
            # the settlement is then in ``before``)
            text = "".join(e.data["text"] for e in [*before, *evs] if e.event == "model.text.delta")
            return settled([*before, *evs], "m2") and text == ANSWER

        rest = read_events_from(lines, until=done)
    events = before + rest
    deltas = [e for e in events if e.event == "model.text.delta"]
    assert all(d.id is None for d in deltas)  # live only: never a position
    assert all(d.data["session_id"] == sid for d in deltas)  # the caller's id, never the log's
    assert "".join(d.data["text"] for d in deltas) == ANSWER
    assert [d.data["position"] for d in deltas] == list(range(0, len(ANSWER), 6))
    if in_process:
        kinds = [e.event for e in events]
        assert kinds.index("harness.model.response") > max(i for i, k in enumerate(kinds) if k == "model.text.delta")
    records = [e for e in events if e.id is not None]
    assert [e.id for e in records] == sorted({e.id for e in records})  # in order, once each
    response = next(e for e in records if e.event == "harness.model.response")
    assert response.data["data"]["text"] == ANSWER  # the log holds the whole text, once


def shown_text(events: list[Event]) -> str:
    """The answer the console shows from a stream's deltas (each from where the text shown
    ends: a repeat adds nothing); a gap fails."""
    text = ""
    for d in (e for e in events if e.event == "model.text.delta"):
        assert d.data["position"] <= len(text), "a gap"
        text += d.data["text"][len(text) - d.data["position"]:]
    return text


@contextlib.contextmanager
def serve_with_real_model(model_server: ModelServer, tmp_path: Path) -> Iterator[httpx.Client]:
    """``harness serve`` on SQLite (gateway and worker in one process) whose harness calls
    ``model_server``; a client of its HTTP API."""
    proc = start_process(["serve", "--log", "sqlite:///h.db", "--app", REAL_MODEL_APP, "--open-access", "--port", "0",
                          "--heartbeat", "1"], ready="serve ready", cwd=tmp_path, env=model_env(model_server))
    try:
        with httpx.Client(base_url=proc.url, timeout=60) as http:
            yield http
    finally:
        assert proc.stop() == 0, proc.stderr()


@contextlib.contextmanager
def kafka_gateway_with_real_model(
    kafka_bootstrap: str, unique_prefix: str, model_server: ModelServer
) -> Iterator[tuple[ServerThread, httpx.Client]]:
    """A ``harness worker`` process on a one-partition Kafka log whose harness calls
    ``model_server``, and a gateway (in this process) on the same log; a client of it."""
    url = f"kafka://{kafka_bootstrap}?topic_prefix={unique_prefix}&partitions=1"
    worker = start_process(["worker", "--log", url, "--app", REAL_MODEL_APP], ready="worker ready",
                           env=model_env(model_server))
    try:
        with ServerThread(open_settings(url)) as server, httpx.Client(base_url=server.url, timeout=60) as http:
            yield server, http
    finally:
        worker.stop()


def reconnect_mid_answer(http: httpx.Client, server: ModelServer, sid: str) -> None:
    """A stream cut half-way through a streamed answer (a page reloaded) and resumed with
    Last-Event-ID gets the answer's start back first (one delta from position 0), then the
    rest: the text it shows is the whole answer, with no gap marked."""
    server.script(Reply(text="hi"), Reply(text=ANSWER, chunk=6, pause_after=4))
    assert http.post(f"/v1/sessions/{sid}/messages", json={"text": "hello", "harness": REAL_MODEL,
                                                           "input_id": "m1"}).json()["status"] == "accepted"
    wait_for(lambda: http.get(f"/v1/sessions/{sid}").json()["summary"]["state"] == "idle", timeout=60, what="idle")
    after = http.get(f"/v1/sessions/{sid}").json()["last_position"]
    with http.stream("GET", f"/v1/sessions/{sid}/events", params={"after": after}) as response:
        lines = response.iter_lines()
        assert read_events_from(lines, until=lambda evs: bool(evs))[0].event == "hello"
        assert http.post(f"/v1/sessions/{sid}/messages", json={"text": "stream please",
                                                               "input_id": "m2"}).json()["status"] == "accepted"
        assert server.paused.wait(30)  # half-way: the model holds the rest of its answer
        shown = ANSWER[: 3 * 6]  # (of the 4 events before the pause, the first opens the answer)
        first = read_events_from(lines, until=lambda evs: "".join(
            e.data["text"] for e in evs if e.event == "model.text.delta") == shown)
    last = max(e.id for e in first if e.id is not None)  # the page goes away; it comes back:
    assert shown_text(stream_from_half_way(http, server, sid, last, shown, "m2")) == ANSWER


def stream_from_half_way(http: httpx.Client, server: ModelServer, sid: str, last: int, shown: str,
                         input_id: str) -> list[Event]:
    """A stream opened after position ``last`` while the model holds the rest of its answer:
    its first delta is the answer so far (``shown``, from position 0); the model goes on;
    the stream's events until ``input_id`` settles."""
    with http.stream("GET", f"/v1/sessions/{sid}/events", headers={"Last-Event-ID": str(last)}) as response:
        lines = response.iter_lines()
        got = read_events_from(lines, until=lambda evs: any(e.event == "model.text.delta" for e in evs))
        start = next(e for e in got if e.event == "model.text.delta")
        assert (start.data["position"], start.data["text"]) == (0, shown), start
        server.release()
        return got + read_events_from(lines, until=lambda evs: settled(evs, input_id))


def test_a_stream_resumed_half_way_through_an_answer_gets_its_start(
    model_server: ModelServer, tmp_path: Path
) -> None:
    with serve_with_real_model(model_server, tmp_path) as http:
        reconnect_mid_answer(http, model_server, "again-1")


@pytest.mark.kafka
def test_a_kafka_stream_resumed_half_way_through_an_answer_gets_its_start(
    kafka_bootstrap: str, unique_prefix: str, model_server: ModelServer
) -> None:
    with kafka_gateway_with_real_model(kafka_bootstrap, unique_prefix, model_server) as (_, http):
        reconnect_mid_answer(http, model_server, "again-k1")


@pytest.mark.kafka
def test_a_kafka_stream_opened_half_way_through_an_answer_reads_its_start_back(
    kafka_bootstrap: str, unique_prefix: str, model_server: ModelServer
) -> None:
    """A page opened on a session half-way through its answer, on a gateway that was not
    following it (a fresh gateway, another replica): the start is read back from the live
    topic and comes first; then the rest, no gap."""
    sid = "late-k1"
    with kafka_gateway_with_real_model(kafka_bootstrap, unique_prefix, model_server) as (server, http):
        model_server.script(Reply(text=ANSWER, chunk=6, pause_after=4))
        assert http.post(f"/v1/sessions/{sid}/messages", json={"text": "stream please", "harness": REAL_MODEL,
                                                               "input_id": "m1"}).json()["status"] == "accepted"
        assert model_server.paused.wait(30)  # half-way; nobody here follows the session
        view = http.get(f"/v1/sessions/{sid}").json()
        assert view["summary"]["state"] == "running"
        shown = ANSWER[: 3 * 6]  # (of the 4 events before the pause, the first opens the answer)
        events = stream_from_half_way(http, model_server, sid, view["last_position"], shown, "m1")
        tails = server.state.live if server.state is not None else None
        assert isinstance(tails, KafkaLiveTails) and tails.read_backs == 1
    assert shown_text(events) == ANSWER


def test_live_deltas_of_harness_serve_reach_the_stream(model_server: ModelServer, tmp_path: Path) -> None:
    with serve_with_real_model(model_server, tmp_path) as http:
        stream_deltas(http, model_server, "live-1", in_process=True)


@pytest.mark.kafka
def test_live_deltas_from_the_kafka_live_topic_reach_the_stream(
    kafka_bootstrap: str, unique_prefix: str, model_server: ModelServer
) -> None:
    with kafka_gateway_with_real_model(kafka_bootstrap, unique_prefix, model_server) as (server, http):
        stream_deltas(http, model_server, "live-k1")
        tails = server.state.live if server.state is not None else None
        assert isinstance(tails, KafkaLiveTails)
        # another session's stream (one partition) reuses the partition's consumer
        stream_deltas(http, model_server, "live-k2", pause=False)
        assert tails.tails_opened == 1 and tails.consumers == 1


@pytest.mark.kafka
def test_a_kafka_gateway_takes_a_posted_message_back_from_its_shared_tail(
    kafka_bootstrap: str, unique_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A POST looks the session up once (its input may repeat an earlier one), then takes
    its own input back from the partition's shared tail (the stream a console holds open
    keeps it live), not with a read of its own; the stream from the input's position then
    starts at once. The look-up of a new session fetches nothing either: the tail taught
    the partition's index every session, so it asks the broker for the partition's end and
    waits for the tail to be there. A read is a watermark query, an assignment and fetches
    on the broker: the gateway path read 3 times a message before, then once."""
    url = f"kafka://{kafka_bootstrap}?topic_prefix={unique_prefix}&partitions=2"
    # A stalled machine must not turn the wait for the tail into a read: what is tested is
    # that none is needed (0.5 s, then a read, is the policy's; tested in the log's tests).
    monkeypatch.setattr(kafka_log_module, "TAIL_CATCH_UP_S", 30.0)
    worker = start_process(["worker", "--log", url, "--app", APP], ready="worker ready")
    try:
        with ServerThread(open_settings(url)) as server:
            state = server.state
            assert state is not None
            # (the first listing of the sessions, started with the gateway, reads too)
            wait_for(lambda: state.warming is not None and state.warming.done(), timeout=60, what="the first listing")
            posts_read_once(url, server.url, state.log)
            concurrent_resends_get_the_first_position(url, server.url)
    finally:
        worker.stop()


def posts_read_once(url: str, base: str, log: Any) -> None:
    with httpx.Client(base_url=base, timeout=60) as http:
        held = {log.partition_for(sid): sid for sid in (f"held-{k}" for k in range(20))}
        assert len(held) == 2
        streams = []
        for sid in held.values():  # a console holds a stream open on each partition
            http.post(f"/v1/sessions/{sid}/messages", json={"text": "hi", "harness": HARNESS, "input_id": "h"})
            stream = http.stream("GET", f"/v1/sessions/{sid}/events")
            lines = stream.__enter__().iter_lines()
            read_events_from(lines, until=lambda evs: settled(evs, "h"))
            streams.append(stream)
        try:
            for k in range(6):
                sid = f"new-{k}"
                before = log.stats.snapshot()
                receipt = http.post(f"/v1/sessions/{sid}/messages",
                                    json={"text": "hi", "harness": HARNESS, "input_id": "m"}).json()
                assert receipt["status"] == "accepted" and receipt["position"] == log_positions(url, sid)[0]
                with http.stream("GET", f"/v1/sessions/{sid}/events",
                                 params={"after": receipt["position"] - 1}) as response:
                    events = read_events_from(response.iter_lines(), until=lambda evs: settled(evs, "m"))
                assert events[1].id == receipt["position"]  # (after the hello) the input first
                after = log.stats.snapshot()
                assert after["reads"] == before["reads"], k  # no fetch at all
                assert after["reads_from_tail"] - before["reads_from_tail"] == 1  # the POST's first look
        finally:
            for stream in streams:
                stream.__exit__(None, None, None)


def concurrent_resends_get_the_first_position(url: str, base: str) -> None:
    """Four POSTs of one input id at once to a new session: each read-back finds the copy
    that landed first, so every receipt names its position; another text is a conflict."""
    from concurrent.futures import ThreadPoolExecutor

    def post(sid: str, text: str) -> dict[str, Any]:
        with httpx.Client(base_url=base, timeout=60) as http:
            body = {"text": text, "harness": HARNESS, "input_id": "same"}
            reply: dict[str, Any] = http.post(f"/v1/sessions/{sid}/messages", json=body).json()
            return reply

    with ThreadPoolExecutor(4) as pool:
        for k in range(3):
            sid = f"resent-{k}"
            receipts = list(pool.map(post, [sid] * 4, ["hi"] * 4))
            first = log_positions(url, sid)[0]
            assert [(r["status"], r["position"]) for r in receipts] == [("accepted", first)] * 4, receipts
            assert post(sid, "other")["code"] == "input_conflict"
