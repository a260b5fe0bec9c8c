"""The real commands in subprocesses: `harness serve` (gateway + worker, SQLite) and, on
Kafka, `harness gateway` replicas next to a `harness worker`, over real HTTP."""

from __future__ import annotations

import hashlib
import json
import signal
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.gateway.helpers import (
    APP,
    HARNESS,
    child_env,
    harness_command,
    read_events,
    read_events_from,
    settled,
    start_process,
    wait_for,
)


def run_waiting_turn(http: httpx.Client, sid: str, headers: dict[str, str] | None = None) -> dict[str, Any]:
    """message -> the ask opens -> answer -> the turn completes; returns the final view."""
    h = headers or {}
    first = http.post(f"/v1/sessions/{sid}/messages", headers=h,
                      json={"text": "please approve", "harness": HARNESS, "input_id": "m1"}).json()
    assert first["status"] == "accepted"
    assert http.post(f"/v1/sessions/{sid}/messages", headers=h,
                     json={"text": "please approve", "harness": HARNESS, "input_id": "m1"}).json() == first
    d = wait_for(lambda: (x := http.get(f"/v1/sessions/{sid}", headers=h).json())["open_asks"] and x,
                 timeout=60, what="the ask")
    ask = d["open_asks"][0]
    with http.stream("GET", f"/v1/sessions/{sid}/events", headers=h,
                     params={"after": first["position"] - 1}) as response:
        answer = {"tool_call_id": ask["tool_call_id"], "name": "approval", "value": {"approved": False}}
        assert http.post(f"/v1/sessions/{sid}/answers", headers=h, json=answer).json()["status"] == "accepted"
        events = read_events(response, until=lambda evs: settled(evs, "m1"))
    assert events[1].id == first["position"]  # the stream starts with the input itself
    final: dict[str, Any] = http.get(f"/v1/sessions/{sid}", headers=h).json()
    assert final["summary"]["state"] == "idle"
    assert final["transcript"][-1]["content"] == 'done: {"approved":false,"note":""}'
    return final


def test_harness_serve_runs_gateway_and_worker(tmp_path: Path) -> None:
    proc = start_process(["serve", "--log", "sqlite:///h.db", "--app", APP, "--open-access", "--port", "0"],
                         ready="serve ready", cwd=tmp_path)
    try:
        with httpx.Client(base_url=proc.url, timeout=30) as http:
            run_waiting_turn(http, "cli-1")
            # an open stream does not hold SIGTERM up
            with http.stream("GET", "/v1/sessions/cli-1/events") as response:
                lines = response.iter_lines()  # kept: the stream stays open through the SIGTERM
                read_events_from(lines, until=lambda evs: len(evs) >= 2)
                proc.proc.send_signal(signal.SIGTERM)
                assert proc.proc.wait(timeout=30) == 0
    finally:
        proc.stop()
    assert (tmp_path / "h.db").exists()


def test_harness_serve_gives_its_sessions_the_secrets_of_its_folder_and_environment(tmp_path: Path) -> None:
    api_key, db_password = "sk_live_SERVE_0001", "db-SERVE-password"
    data = tmp_path / "secrets" / "..2026_01_01_v1"
    data.mkdir(parents=True)
    (data / "api_key").write_text(api_key + "\n")
    (tmp_path / "secrets" / "..data").symlink_to(data.name)
    (tmp_path / "secrets" / "api_key").symlink_to("..data/api_key")
    proc = start_process(["serve", "--log", "sqlite:///h.db", "--app", "tests.apps.cli_app:assistant",
                          "--open-access", "--port", "0", "--secrets-dir", str(tmp_path / "secrets"),
                          "--max-sessions", "1"],
                         ready="serve ready", cwd=tmp_path,
                         env={"HARNESS_SECRET_DB_PASSWORD": db_password, "HARNESS_LOG_LEVEL": "info"})
    try:
        with httpx.Client(base_url=proc.url, timeout=30) as http:
            sent = http.post("/v1/sessions/s-1/messages", json={"text": "secret", "harness": "tests/cli"}).json()
            assert sent["status"] == "accepted"
            final = wait_for(lambda: (d := http.get("/v1/sessions/s-1").json())["summary"]["state"] == "idle" and d,
                             timeout=60, what="the turn")
        log_lines = proc.stderr()
    finally:
        proc.stop()
    answer = json.loads(final["transcript"][-1]["content"][len("done: "):])
    assert answer == {"api_key_sha256": digest(api_key), "db_password_sha256": digest(db_password),
                      "names": ["api_key", "db_password"]}
    assert "turn 1 of session s-1 completed" in log_lines  # the worker's lines, at info
    assert api_key not in log_lines and db_password not in log_lines


def digest(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()[:16]


def test_harness_serve_with_a_missing_secrets_folder_says_so_in_one_line(tmp_path: Path) -> None:
    done = subprocess.run(harness_command("serve", "--log", "sqlite:///h.db", "--app", APP, "--open-access",
                                          "--secrets-dir", str(tmp_path / "nope")),
                          cwd=tmp_path, capture_output=True, text=True, env=child_env(), timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip() == (
        f"harness serve: --secrets-dir {tmp_path / 'nope'}: no such folder (mount the Secret there, or fix the path)"
    )


def test_harness_serve_refuses_an_auth_flag_its_mode_ignores_in_one_line(tmp_path: Path) -> None:
    done = subprocess.run(harness_command("serve", "--log", "sqlite:///h.db", "--app", APP, "--open-access",
                                          "--tenant-claim", "org"),
                          cwd=tmp_path, capture_output=True, text=True, env=child_env(), timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip() == (
        "harness serve: --tenant-claim does not apply to open access (--open-access, no auth file): only JWTs are "
        "checked against it; give --jwt-secret-file or --jwks-file to accept JWTs, or drop --tenant-claim "
        "(see 'harness serve --help')")
    assert not (tmp_path / "h.db").exists()  # refused before anything is made


def test_harness_serve_needs_an_app(tmp_path: Path) -> None:
    done = subprocess.run(harness_command("serve", "--log", "sqlite:///h.db", "--open-access"), cwd=tmp_path,
                          capture_output=True, text=True, env=child_env(), timeout=60)
    assert done.returncode == 2 and "--app" in done.stderr and "Traceback" not in done.stderr


def test_harness_gateway_on_a_missing_sqlite_file_says_it_serves_an_empty_log(tmp_path: Path) -> None:
    """A gateway may start before the worker that runs its SQLite file (as on Kafka it
    starts before the topics exist), so it is not refused; but a typo would serve an
    empty log that nobody runs, so it says so."""
    proc = start_process(["gateway", "--log", "sqlite:///typo.db", "--open-access", "--port", "0"],
                         ready="gateway ready", cwd=tmp_path)
    try:
        with httpx.Client(base_url=proc.url, timeout=30) as http:
            assert http.get("/v1/sessions").json()["sessions"] == []
        err = proc.stderr()
    finally:
        proc.stop()
    assert "there was no SQLite log at" in err and "harness worker --log sqlite:///typo.db" in err, err


def test_a_second_gateway_on_a_port_in_use_says_so_in_one_line(tmp_path: Path) -> None:
    first = start_process(["serve", "--log", "sqlite:///h.db", "--app", APP, "--open-access", "--port", "0"],
                          ready="serve ready", cwd=tmp_path)
    try:
        port = first.url.rsplit(":", 1)[1]
        done = subprocess.run(harness_command("gateway", "--log", "sqlite:///h.db", "--open-access", "--port", port),
                              cwd=tmp_path, capture_output=True, text=True, env=child_env(), timeout=60)
        assert done.returncode == 2
        assert done.stderr.strip() == (
            f"harness gateway: 127.0.0.1:{port} is in use (another gateway?): give another --port (or --host)"
        )
        # refused before anything is made: no new SQLite file is left behind
        done = subprocess.run(harness_command("serve", "--log", "sqlite:///other.db", "--app", APP, "--open-access",
                                              "--port", port),
                              cwd=tmp_path, capture_output=True, text=True, env=child_env(), timeout=60)
        assert done.returncode == 2 and "is in use" in done.stderr, done.stderr
        assert not (tmp_path / "other.db").exists()
    finally:
        first.stop()


@pytest.mark.kafka
def test_kafka_gateway_replicas_and_a_worker(kafka_bootstrap: str, unique_prefix: str, tmp_path: Path) -> None:
    url = f"kafka://{kafka_bootstrap}?topic_prefix={unique_prefix}&partitions=3"
    (tmp_path / "keys").write_text("acme key-acme\nglobex key-globex\n")
    worker = start_process(["worker", "--log", url, "--app", APP], ready="worker ready")
    gateways = []
    try:
        for _ in range(2):  # two stateless replicas; any of them answers for any session
            gateways.append(start_process(["gateway", "--log", url, "--app", APP, "--port", "0",
                                           "--api-keys-file", str(tmp_path / "keys")], ready="gateway ready"))
        acme = {"Authorization": "Bearer key-acme"}
        globex = {"Authorization": "Bearer key-globex"}
        with httpx.Client(base_url=gateways[0].url, timeout=60) as one, \
                httpx.Client(base_url=gateways[1].url, timeout=60) as two:
            run_waiting_turn(one, "k-1", acme)
            # the other replica gives the same view and the same receipt (from the log)
            assert two.get("/v1/sessions/k-1", headers=acme).json()["summary"]["turns"] == 1
            again = two.post("/v1/sessions/k-1/messages", headers=acme,
                             json={"text": "please approve", "harness": HARNESS, "input_id": "m1"}).json()
            assert again["status"] == "accepted"
            assert two.get("/v1/sessions/k-1", headers=globex).status_code == 404
            assert [s["session_id"] for s in two.get("/v1/sessions", headers=acme).json()["sessions"]] == ["k-1"]
            assert two.get("/v1/sessions", headers=globex).json()["sessions"] == []
            # One request that waits for its turn: the answer comes from the partition's shared tail.
            waited = two.post("/v1/sessions/k-3/messages", headers=globex, params={"wait": 60},
                              json={"text": "hello", "harness": HARNESS}).json()
            assert waited["settlement"] == {"outcome": "completed", "text": "echo: hello"}, waited
            unknown = two.post("/v1/sessions/k-2/messages", headers=globex,
                               json={"text": "hi", "harness": "no/such"}).json()
            assert unknown["code"] == "unknown_harness"
    finally:
        for g in gateways:
            g.stop()
        worker.stop()


@pytest.mark.kafka
def test_kafka_gateway_answers_413_for_an_input_over_the_logs_record_limit(
    kafka_bootstrap: str, unique_prefix: str
) -> None:
    url = f"kafka://{kafka_bootstrap}?topic_prefix={unique_prefix}&partitions=1"
    done = subprocess.run(harness_command("topics", "create", "--log", url), capture_output=True, text=True,
                          env=child_env(), timeout=120)
    assert done.returncode == 0, done.stderr
    # The body is under the gateway's limit (1 MiB); the record is over the clients' limit.
    gateway = start_process(["gateway", "--log", url, "--port", "0", "--open-access"], ready="gateway ready",
                            env={"HARNESS_KAFKA_CONFIG_MESSAGE_MAX_BYTES": "20000"})
    try:
        with httpx.Client(base_url=gateway.url, timeout=60) as http:
            r = http.post("/v1/sessions/big/messages", json={"text": "x" * 50_000, "harness": HARNESS})
            assert r.status_code == 413, r.text  # not 503: sending it again cannot help
            assert "more than the session log accepts: send less" in r.json()["detail"]
            ok = http.post("/v1/sessions/big/messages", json={"text": "small", "harness": HARNESS})
            assert ok.status_code == 200 and ok.json()["status"] == "accepted", ok.text
    finally:
        assert gateway.stop() == 0, gateway.stderr()


@pytest.mark.kafka
def test_kafka_gateway_never_creates_topics_and_readyz_says_what_is_missing(
    kafka_bootstrap: str, unique_prefix: str
) -> None:
    from confluent_kafka.admin import AdminClient

    url = f"kafka://{kafka_bootstrap}?topic_prefix={unique_prefix}&partitions=2"
    gateway = start_process(["gateway", "--log", url, "--port", "0", "--open-access"], ready="gateway ready")
    try:
        # said at start (it said "gateway ready" and nothing more until the first request,
        # so a mistyped topic prefix looked like a working gateway)
        started = gateway.stderr()
        assert f"WARNING harness.gateway topic '{unique_prefix}.sessions' does not exist" in started, started
        assert "/readyz and the API answer 503 until it does" in started
        with httpx.Client(base_url=gateway.url, timeout=60) as http:
            r = http.get("/readyz")
            assert r.status_code == 503
            detail = r.json()["detail"]
            assert f"topic '{unique_prefix}.sessions' does not exist" in detail
            assert "harness topics create" in detail
            assert http.get("/healthz").status_code == 200  # alive, only not ready
            topics = AdminClient({"bootstrap.servers": kafka_bootstrap}).list_topics(timeout=30).topics
            assert not [t for t in topics if t.startswith(unique_prefix)]  # the gateway created nothing
            done = subprocess.run(harness_command("topics", "create", "--log", url), capture_output=True, text=True,
                                  env=child_env(), timeout=120)
            assert done.returncode == 0, done.stderr
            wait_for(lambda: http.get("/readyz").status_code == 200, timeout=60, what="ready once the topics exist")
            assert http.get("/v1/sessions").json() == {"sessions": [], "next_cursor": None}
    finally:
        assert gateway.stop() == 0, gateway.stderr()


def test_a_gateway_with_no_worker_refuses_a_second_answer_while_the_first_waits(tmp_path: Path) -> None:
    """The answer sent first waits in the log for a worker (it wins when one comes): a second
    one, under another input id, is refused at once (answer_waiting) instead of being
    stored and rejected later."""
    import asyncio

    from harness import HarnessHost, open_log
    from tests.apps.approvals import approvals

    url = f"sqlite:///{tmp_path / 'asks.db'}"

    async def open_an_ask() -> None:
        async with HarnessHost(log=open_log(url)) as host:
            session = await host.open(approvals, session_id="s-1")
            assert (await session.send("please approve", input_id="m1")).outcome == "waiting"

    asyncio.run(open_an_ask())
    proc = start_process(["gateway", "--log", url, "--open-access", "--port", "0"], ready="gateway ready",
                         cwd=tmp_path)
    try:
        with httpx.Client(base_url=proc.url, timeout=30) as http:
            ask = http.get("/v1/sessions/s-1").json()["open_asks"][0]
            answer = {"tool_call_id": ask["tool_call_id"], "name": ask["name"]}
            first = http.post("/v1/sessions/s-1/answers",
                              json={**answer, "value": {"approved": True}, "input_id": "a-1"}).json()
            assert first["status"] == "accepted", first
            second = http.post("/v1/sessions/s-1/answers",
                               json={**answer, "value": {"approved": False}, "input_id": "a-2"}).json()
            assert second["status"] == "rejected" and second["code"] == "answer_waiting", second
            assert "the answer a-1 to this ask waits for the session's worker" in second["reason"]
    finally:
        proc.stop()


def test_a_gateway_whose_kafka_does_not_answer_or_whose_url_has_a_typo_says_so_at_start(tmp_path: Path) -> None:
    """It printed 'gateway ready' and served requests that timed out; the worker and the
    CLI said in one line within seconds what was wrong. Now the gateway does too."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for url, code, says in [
        (f"kafka://127.0.0.1:{port}?topic_prefix=trial", 1,
         f"harness gateway: cannot reach Kafka at 127.0.0.1:{port} within 5 s"),
        (f"kafka://127.0.0.1:{port}?topic_prefx=trial", 2, "unknown option 'topic_prefx'; known: topic_prefix"),
    ]:
        done = subprocess.run(harness_command("gateway", "--log", url, "--open-access", "--port", "0"),
                              cwd=tmp_path, capture_output=True, text=True, env=child_env(), timeout=60)
        lines = done.stderr.strip().splitlines()
        assert done.returncode == code and len(lines) == 1 and lines[0].startswith("harness gateway: "), done.stderr
        assert says in lines[0], done.stderr
        assert "gateway ready" not in done.stdout


@pytest.mark.kafka
def test_a_gateway_whose_broker_goes_down_answers_503_at_once_and_recovers_with_it(tmp_path: Path) -> None:
    """The broker stops: the first read gets 503 after --read-timeout, the next ones at
    once (the log is not asked again) with Retry-After; the broker comes back: the same
    session reads again and a new message runs, with nothing lost. Stopped while the broker
    is down, it exits without waiting for the reads still waiting for it."""
    from harness.testing.kafka_local import LocalKafka

    broker = LocalKafka(data_dir=tmp_path / "broker")
    broker.start()
    try:
        broker.warm_up_transactions()
        url = f"kafka://{broker.bootstrap}?topic_prefix=outage&partitions=2"
        proc = start_process(["serve", "--log", url, "--app", APP, "--open-access", "--port", "0",
                              "--read-timeout", "3"], ready="serve ready", cwd=tmp_path)
        try:
            with httpx.Client(base_url=proc.url, timeout=60) as http:
                sent = http.post("/v1/sessions/o-1/messages", json={"text": "hi", "harness": HARNESS, "input_id": "m1"})
                assert sent.json()["status"] == "accepted", sent.text
                wait_for(lambda: http.get("/v1/sessions/o-1").json()["summary"]["state"] == "idle", timeout=60,
                         what="the first turn")
                broker.stop()
                first = http.get("/v1/sessions/o-1")
                assert first.status_code == 503, first.text
                assert first.headers["Retry-After"].isdigit()
                assert "not answering" in first.json()["detail"], first.text
                refused = [http.get("/v1/sessions/o-1"), http.get("/v1/sessions"),
                           http.post("/v1/sessions/o-1/messages", json={"text": "again", "harness": HARNESS})]
                for r in refused:  # at once: the breaker says for how long the log is down
                    assert r.status_code == 503, r.text
                    assert "not answering (for " in r.json()["detail"], r.text
                assert http.get("/readyz").status_code == 503
                broker.start()
                wait_for(lambda: http.get("/v1/sessions/o-1").status_code == 200, timeout=90,
                         what="reads once the broker is back")
                again = http.post("/v1/sessions/o-1/messages", json={"text": "hi again", "harness": HARNESS,
                                                                     "input_id": "m2"}).json()
                assert again["status"] == "accepted", again
                view = wait_for(lambda: (v := http.get("/v1/sessions/o-1").json())["summary"]["turns"] == 2 and v,
                                timeout=90, what="the second turn")
                assert [m["content"] for m in view["transcript"] if m["role"] == "user"] == ["hi", "hi again"]
                assert "answers again" in proc.stderr()

                # Down again, a listing in flight (its reads wait up to 30 s each for the
                # broker): a stop does not wait for them.
                broker.stop()
                assert http.get("/v1/sessions").status_code == 503
        finally:
            assert proc.stop() == 0, proc.stderr()
        assert "read(s) of the log still wait for an answer from it (is the broker down?)" in proc.stderr()
    finally:
        broker.close()
