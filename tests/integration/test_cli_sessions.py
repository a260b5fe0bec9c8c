"""The session commands through the real CLI, on SQLite and on Kafka: ``send`` (waits,
prints the answer, a status line on a terminal), ``answer``, ``sessions``, ``show``,
``tail``; and a worker's secrets and log lines (JSON) seen from outside.

One worker per backend for the module (``--secrets-dir`` in the Kubernetes layout plus
``HARNESS_SECRET_DB_PASSWORD``, ``--log-format json``); each test uses its own sessions.
"""

from __future__ import annotations

import hashlib
import json
import os
import pty
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.cli_helpers import ANSI, HARNESS, Backend, backend_params, closed_pipe, wait_until

API_KEY = "sk_live_TOPSECRET_0042"
DB_PASSWORD = "hunter2-db-password"


def sha(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()[:16]


def k8s_secret_mount(folder: Path) -> Path:
    """A Secret as Kubernetes mounts it: keys are symlinks into a timestamped folder."""
    data = folder / "..2025_01_01_00_00_00.000000001"
    data.mkdir(parents=True)
    (data / "api_key").write_text(API_KEY + "\n")
    (folder / "..data").symlink_to(data.name)
    (folder / "api_key").symlink_to("..data/api_key")
    (folder / ".hidden").write_text("not a secret")
    return folder


@pytest.fixture(scope="module", params=backend_params)
def deployed(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Backend]:
    workdir = tmp_path_factory.mktemp(f"cli-{request.param}")
    if request.param == "sqlite":
        backend = Backend("sqlite", f"sqlite:///{workdir / 'log.db'}", workdir)
    else:
        bootstrap = request.getfixturevalue("kafka_bootstrap")
        backend = Backend("kafka", f"kafka://{bootstrap}?topic_prefix=t{uuid.uuid4().hex[:10]}&partitions=2", workdir)
    secrets = k8s_secret_mount(workdir / "secrets")
    backend.env["HARNESS_TEST_GATE_DIR"] = str(workdir)
    worker = backend.worker("--secrets-dir", str(secrets), "--log-format", "json",
                            env={"HARNESS_SECRET_DB_PASSWORD": DB_PASSWORD})
    deadline = time.monotonic() + 90
    while not worker.ready:
        assert worker.alive and time.monotonic() < deadline, worker.describe()
        time.sleep(0.1)
    yield backend
    backend.cleanup()


def sid(stem: str) -> str:
    return f"{stem}-{uuid.uuid4().hex[:6]}"


def summary_of(backend: Backend, session: str) -> dict[str, Any] | None:
    return next((s for s in backend.json("sessions") if s["session_id"] == session), None)


async def wait_state(backend: Backend, session: str, state: str, timeout: float = 60) -> dict[str, Any]:
    found: dict[str, Any] = {}

    def check() -> bool:
        s = summary_of(backend, session)
        found["s"] = s
        return s is not None and s["state"] == state

    await wait_until(check, timeout=timeout, what=f"{session} {state}", details=lambda: str(found.get("s")))
    return found["s"]


# --- send, show -----------------------------------------------------------------------------------------


async def test_send_prints_the_answer_and_show_reads_the_timeline(deployed: Backend) -> None:
    s = sid("order")
    out = deployed.cli("send", s, "order=7", "--harness", HARNESS, "--input-id", "in-1")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("done: ") and '"charge_id": "ch_7"' in out.stdout
    assert out.stderr == ""  # no status line when stderr is not a terminal

    again = deployed.cli("send", s, "order=7", "--input-id", "in-1")  # a resend: the same settlement
    assert again.returncode == 0 and again.stdout == out.stdout

    shown = deployed.cli("show", s)
    assert shown.returncode == 0, shown.stderr
    text = shown.stdout
    assert not ANSI.search(text), "piped output is plain"
    header, *lines = text.splitlines()
    assert header.startswith(f"session {s}") and "harness tests/cli" in header and "idle" in header
    assert "2 model calls: 200 in / 20 out tokens, $0.001" in header  # the session's usage totals
    expected = [
        r"message\s+in-1 \"order=7\"  → completed",
        r"turn 1\s+started \(input in-1\)",
        r"model\s+\"working on it\"  → checkout\(order_id=\"7\"\)",
        r"usage\s+scripted-1: 100 in / 10 out tokens, \$0.0005",
        r"tool\s+checkout \[checkout-7\] started \(attempt 1\)",
        r"step\s+charge:7 = \{\"amount\":1000,\"id\":\"ch_7\"\}|step\s+charge:7 = \{\"id\":\"ch_7\",\"amount\":1000\}",
        r"step\s+invoice:ch_7 = ",
        r"record\s+order.paid ",
        r"result\s+checkout \[checkout-7\] → \{\"charge_id\":\"ch_7\"\}",
        r"turn 1\s+completed \"done: ",
        r"settled\s+in-1 completed",
    ]
    import re

    position = 0
    for pattern in expected:  # in this order
        found = next((i for i in range(position, len(lines)) if re.search(pattern, lines[i])), None)
        assert found is not None, f"{pattern!r} not found after line {position}:\n{text}"
        position = found + 1
    assert re.match(r"^\d\d:\d\d:\d\d\.\d{3}  ", lines[0]), lines[0]

    coloured = deployed.cli("show", s, "--color", "always")
    assert ANSI.search(coloured.stdout) and ANSI.sub("", coloured.stdout) == text

    data = json.loads(deployed.cli("show", s, "--json").stdout)
    assert data["summary"]["state"] == "idle" and data["summary"]["turns"] == 1
    assert data["summary"]["usage"] == {"calls": 2, "input_tokens": 200, "output_tokens": 20, "cost": 0.001}
    kinds = [i["kind"] for i in data["timeline"]]
    assert kinds[:2] == ["input.message", "turn.started"] and kinds[-2:] == ["turn.finished", "input.settled"]
    step = next(i for i in data["timeline"] if i["kind"] == "step" and i["name"] == "charge:7")
    assert step["value"] == {"id": "ch_7", "amount": 1000} and step["tool_call_id"] == "checkout-7"


async def test_send_to_an_unknown_harness_is_rejected(deployed: Backend) -> None:
    s = sid("nobody")
    out = deployed.cli("send", s, "hello", "--harness", "tests/nobody")
    assert out.returncode == 1
    assert "rejected (unknown_harness): no harness named 'tests/nobody' runs here; known: tests/cli" in out.stderr
    assert summary_of(deployed, s)["state"] == "failed"  # type: ignore[index]


async def test_an_input_id_sent_again_with_other_text_is_an_input_conflict(deployed: Backend) -> None:
    """It printed the first turn's answer and exited 0, as if the new text had been answered."""
    s = sid("conflict")
    first = deployed.cli("send", s, "hello", "--harness", HARNESS, "--input-id", "in-1")
    assert first.returncode == 0 and first.stdout == "you said: hello\n", first.stderr

    for extra in ((), ("--no-wait",)):
        other = deployed.cli("send", s, "other text", "--input-id", "in-1", *extra)
        assert other.returncode == 1 and other.stdout == "", other
        assert other.stderr.splitlines() == [
            "harness send: input in-1 rejected (input_conflict): input id 'in-1' was already used with another "
            "payload; use a new --input-id"
        ]
    as_json = json.loads(deployed.cli("send", s, "other text", "--input-id", "in-1", "--json").stdout)
    assert (as_json["outcome"], as_json["code"], as_json["text"]) == ("rejected", "input_conflict", None)
    kinds = [i["kind"] for i in json.loads(deployed.cli("show", s, "--json").stdout)["timeline"]]
    assert kinds.count("input.message") == 1  # nothing was written

    again = deployed.cli("send", s, "hello", "--input-id", "in-1")  # the same text: the same answer
    assert again.returncode == 0 and again.stdout == first.stdout, again.stderr


async def test_send_no_wait_json_prints_json(deployed: Backend) -> None:
    """`harness send s-1 hi --no-wait --json | jq .input_id`: it printed the bare input id,
    which is no JSON (jq: "Invalid literal"), though --json is the settlement as JSON."""
    s = sid("nowait-json")
    out = deployed.cli("send", s, "hello", "--harness", HARNESS, "--input-id", "in-nw", "--no-wait", "--json")
    assert out.returncode == 0, out.stderr
    receipt = json.loads(out.stdout)
    assert receipt["input_id"] == "in-nw" and isinstance(receipt["position"], int)
    again = deployed.cli("send", s, "hello", "--input-id", "in-nw", "--no-wait", "--json")  # no second effect
    assert json.loads(again.stdout) == receipt
    item = json.loads(deployed.cli("show", s, "--json").stdout)["timeline"][0]
    assert (item["kind"], item["seq"]) == ("input.message", receipt["position"])


async def test_a_new_session_needs_a_harness(deployed: Backend) -> None:
    out = deployed.cli("send", sid("new"), "hello")
    assert out.returncode == 2 and "give --harness NAME" in out.stderr and "Traceback" not in out.stderr


async def test_show_of_an_unknown_session_says_so(deployed: Backend) -> None:
    out = deployed.cli("show", "no-such-session")
    assert out.returncode == 1
    assert out.stderr.strip() == (
        "harness show: no session 'no-such-session' in this log: 'harness sessions' lists the sessions (check --log)"
    )


async def test_an_empty_session_id_is_an_invalid_id_for_every_command(deployed: Backend) -> None:
    """`harness show ''` said "no session ''", `harness tail ''` waited for its first record for ever."""
    for args in (("show", ""), ("tail", ""), ("answer", "", "c1", "q", "{}"), ("send", "", "hi")):
        out = deployed.cli(*args, timeout=60)
        assert out.returncode == 2, (args, out)
        assert out.stderr.splitlines() == [f"harness {args[0]}: a session id must not be empty"], args


async def test_text_that_is_not_utf8_is_refused_in_one_line_saying_so(deployed: Backend) -> None:
    """Bytes that are not UTF-8 on the command line (Python reads 0xff as a lone surrogate):
    "'utf-8' codec can't encode character '\\udcff' ...: surrogates not allowed", no hint."""
    s = sid("bytes")
    not_utf8 = b"caf\xff".decode("utf-8", "surrogateescape")  # as Python reads the argument
    for args, what, position in (
        (("send", s, not_utf8, "--harness", HARNESS), "the message text", 3),
        (("answer", s, "c1", "q", f'"{not_utf8}"'), "the answer", 4),
    ):
        out = deployed.cli(*args)
        assert out.returncode == 2, out
        assert out.stderr.splitlines() == [
            f"harness {args[0]}: {what} holds a character that is not valid UTF-8 (byte 0xff at position "
            f"{position}): give it as UTF-8 (check the encoding of the terminal or script that passes it)"
        ]
    assert summary_of(deployed, s) is None  # nothing was written


# --- asks: send waits for a person, answer ----------------------------------------------------------------


async def test_send_stops_at_an_ask_and_answer_resumes_the_turn(deployed: Backend) -> None:
    s = sid("ask")
    out = deployed.cli("send", s, "ask", "--harness", HARNESS, "--input-id", "in-1")
    assert out.returncode == 3, out.stderr
    assert "in-1: the turn waits for a person" in out.stdout
    assert f"harness answer {s} approve approval 'JSON' (fields: approved)" in out.stdout

    waiting = [x for x in deployed.json("sessions", "--state", "waiting") if x["session_id"] == s]
    assert waiting and waiting[0]["open_asks"][0]["message"] == "Approve the order?"
    table = deployed.cli("sessions", "--state", "waiting").stdout
    assert any(line.startswith(s) and "waiting for a person" in line and "approve/approval" in line
               for line in table.splitlines()), table

    refused = deployed.cli("answer", s, "approve", "approval", '{"approved": "maybe"}')
    assert refused.returncode == 1
    assert "answer refused (invalid_answer)" in refused.stderr and "nothing was sent" in refused.stderr
    not_json = deployed.cli("answer", s, "approve", "approval", "{approved: true}")
    assert not_json.returncode == 2 and "is not valid JSON" in not_json.stderr
    no_ask = deployed.cli("answer", s, "approve", "other", "{}")
    assert no_ask.returncode == 1 and "(no_open_ask)" in no_ask.stderr
    taken = deployed.cli("answer", s, "approve", "approval", '{"approved": true}', "--input-id", "in-1")
    assert taken.returncode == 1 and "answer refused (input_conflict)" in taken.stderr  # (the message's id)
    kinds = [i["kind"] for i in json.loads(deployed.cli("show", s, "--json").stdout)["timeline"]]
    assert "input.answer" not in kinds  # refused here: nothing reached the log

    ok = deployed.cli("answer", s, "approve", "approval", '{"approved": true}')
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.strip() == "answer accepted: approve/approval goes on"
    await wait_state(deployed, s, "idle")
    shown = deployed.cli("show", s).stdout
    assert 'ask      approval [approve] "Approve the order?" → {"approved":true}' in shown
    assert "turn 1   completed \"done: {\\\"approved\\\": true}\"" in shown or 'completed "done: {"approved": true}"' in shown


async def test_a_message_queued_behind_a_turn_that_waits_for_a_person_says_which_ask_to_answer(
    deployed: Backend,
) -> None:
    """With a worker running, `harness send` behind a parked turn said after 10 s that no
    worker had taken the input ("Is a worker running on this log ...; still waiting") and
    never ended. (--timeout bounds the wait only should it hang again.)"""
    s = sid("queued")
    assert deployed.cli("send", s, "ask", "--harness", HARNESS, "--input-id", "in-1").returncode == 3
    out = deployed.cli("send", s, "again", "--input-id", "in-2", "--timeout", "60")
    assert out.returncode == 3, out
    assert out.stdout.splitlines() == [
        "in-2: queued behind turn 1 (input in-1), which waits for a person; it runs once that turn ends",
        "ask approve/approval: Approve the order?",
        f"  answer with: harness answer {s} approve approval 'JSON' (fields: approved)",
    ]
    assert "no worker" not in out.stderr, out.stderr
    as_json = json.loads(deployed.cli("send", s, "again", "--input-id", "in-2", "--json").stdout)
    assert as_json["outcome"] == "waiting" and as_json["queued_behind"] == "in-1"
    assert [(a["tool_call_id"], a["name"]) for a in as_json["asks"]] == [("approve", "approval")]

    assert deployed.cli("answer", s, "approve", "approval", '{"approved": true}').returncode == 0
    done = deployed.cli("send", s, "again", "--input-id", "in-2")  # taken once the first turn ended
    assert done.returncode == 0 and done.stdout == "you said: again\n", done


async def test_an_answer_the_owners_model_refuses_is_one_line_here_and_in_show(deployed: Backend) -> None:
    """The ask's model has a validator its JSON schema cannot say: the answer passes the check
    here and the session's owner refuses it. Its reason was pydantic's multi-line text with
    a URL ("1 validation error for Coupon\ncode\n  Value error, ... errors.pydantic.dev")."""
    s = sid("coupon")
    assert deployed.cli("send", s, "coupon", "--harness", HARNESS).returncode == 3
    refused = deployed.cli("answer", s, "coupon", "coupon", '{"code": "abc"}', "--input-id", "a-1")
    reason = "the answer does not fit the ask's model: code: Value error, code must be upper-case"
    assert refused.returncode == 1
    assert refused.stderr.splitlines() == [
        f"harness answer: answer refused by the session's owner (invalid_answer): {reason}"
    ]
    shown = deployed.cli("show", s).stdout
    assert f"settled  a-1 rejected (invalid_answer: {reason})" in shown, shown
    assert "pydantic.dev" not in shown and "validation error" not in shown
    assert deployed.cli("answer", s, "coupon", "coupon", '{"code": "ABC"}').returncode == 0


# --- sessions ---------------------------------------------------------------------------------------------


async def test_sessions_shows_states_and_filters(deployed: Backend) -> None:
    sleeper, idle = sid("sleep"), sid("idle")
    assert deployed.cli("send", idle, "hi", "--harness", HARNESS).returncode == 0
    sent = deployed.cli("send", sleeper, "nap=600", "--harness", HARNESS, "--no-wait")
    assert sent.returncode == 0 and sent.stdout.startswith("in-")
    summary = await wait_state(deployed, sleeper, "sleeping")
    assert summary["sleeping_until"] > summary["last_activity"] + 590_000

    table = deployed.cli("sessions").stdout.splitlines()
    assert table[0].split() == ["SESSION", "HARNESS", "STATE", "LAST", "ACTIVITY", "ASKS", "TURNS"]
    row = next(line for line in table if line.startswith(sleeper))
    assert "tests/cli" in row and "sleeping until" in row
    row = next(line for line in table if line.startswith(idle))
    assert " idle " in row and row.split()[-1] == "1"

    only = deployed.json("sessions", "--state", "sleeping")
    assert sleeper in {x["session_id"] for x in only} and all(x["state"] == "sleeping" for x in only)
    assert deployed.json("sessions", "--harness", "tests/nobody-at-all") == []
    assert len(deployed.json("sessions", "--limit", "1")) == 1
    bad = deployed.cli("sessions", "--state", "asleep")
    assert bad.returncode == 2 and "invalid choice" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1


# --- tail ---------------------------------------------------------------------------------------------------


async def test_tail_follows_new_records_until_ctrl_c(deployed: Backend, tmp_path: Path) -> None:
    s = sid("tail")
    out_path, err_path = tmp_path / "tail.out", tmp_path / "tail.err"
    with open(out_path, "w") as out, open(err_path, "w") as err:
        tail = deployed.popen("tail", s, stdout=out, stderr=err)
        try:
            await wait_until(lambda: "waiting for the first one" in err_path.read_text(), timeout=60,
                             what="tail to start following", details=err_path.read_text)
            sent = deployed.cli("send", s, "order=9", "--harness", HARNESS, "--input-id", "in-t")
            assert sent.returncode == 0, sent.stderr
            await wait_until(lambda: "settled  in-t completed" in out_path.read_text(), timeout=60,
                             what="tail to print the settlement", details=out_path.read_text)
            tail.send_signal(signal.SIGINT)
            assert tail.wait(30) == 0
        finally:
            if tail.poll() is None:
                tail.kill()
                tail.wait(10)
    assert "Traceback" not in err_path.read_text()
    lines = out_path.read_text().splitlines()
    assert 'message  in-t "order=9"' in lines[0]
    assert any("step     charge:9 = " in line for line in lines)
    assert lines[-1].endswith("settled  in-t completed")


async def test_commands_piped_into_a_reader_that_went_away_end_quietly(deployed: Backend) -> None:
    """`harness show s1 | head -1`, `harness sessions | head -5`: "unexpected error:
    BrokenPipeError ..." and exit 1. Now silent, exit 141 (128 + SIGPIPE), as other tools."""
    s = sid("pipe")
    assert deployed.cli("send", s, "order=7", "--harness", HARNESS).returncode == 0
    for args in (("show", s), ("show", s, "--json"), ("sessions",), ("sessions", "--json"), ("tail", s)):
        with closed_pipe() as stdout:
            proc = deployed.popen(*args, stdout=stdout)
            _, err = proc.communicate(timeout=90)
        assert (proc.returncode, err) == (141, ""), args


async def test_tail_ends_when_the_reader_of_its_pipe_goes_away_with_nothing_new_to_print(deployed: Backend) -> None:
    """`harness tail s-1 --json | head -1`: head took its line and went away, and tail, which
    had printed all it had, waited for the session's next record to find that out, so the
    pipeline hung for as long as the session stayed quiet (for good on an idle session). Now
    it sees its reader go and ends at once, silently, exit 141, as `tail -f` does."""
    s = sid("pipe-tail")
    assert deployed.cli("send", s, "order=8", "--harness", HARNESS).returncode == 0
    proc = deployed.popen("tail", s, "-n", "3", "--json")
    try:
        assert proc.stdout is not None
        json.loads(proc.stdout.readline())  # what `head -1` reads, before it exits
        proc.stdout.close()
        assert proc.wait(timeout=30) == 141
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        assert proc.stderr is not None
        err = proc.stderr.read()
        proc.stderr.close()
    assert err == ""


# --- send on a terminal: a live status line -------------------------------------------------------------


async def test_send_draws_a_status_line_on_a_terminal(deployed: Backend) -> None:
    main, secondary = pty.openpty()
    chunks: list[bytes] = []

    def read() -> None:
        while True:
            try:
                data = os.read(main, 4096)
            except OSError:
                return
            if not data:
                return
            chunks.append(data)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        proc = deployed.popen("send", sid("tty"), "nap=1.5", "--harness", HARNESS, stderr=secondary)
        out, _ = proc.communicate(timeout=90)
    finally:
        os.close(secondary)
        reader.join(10)
        os.close(main)
    assert proc.returncode == 0 and out.startswith("done: "), out
    screen = b"".join(chunks).decode(errors="replace")
    assert "\r\x1b[2K" in screen
    assert "sleeping until" in screen or "turn 1" in screen, screen
    assert screen.endswith("\r\x1b[2K"), "the status line is cleared at the end"


async def test_send_off_a_terminal_says_once_that_the_turn_sleeps_and_waits_for_it(deployed: Backend) -> None:
    """Piped, there is no status line: a turn sleeping for a while would leave the
    command silent for all that time. It says so once, on stderr, and still waits."""
    out = deployed.cli("send", sid("piped-nap"), "nap=4", "--harness", HARNESS)
    assert out.returncode == 0 and out.stdout.startswith("done: "), out
    lines = [line for line in out.stderr.splitlines() if "the turn sleeps until" in line]
    assert len(lines) == 1, out.stderr
    assert "waiting for it to settle" in lines[0] and "--no-wait" in lines[0]
    assert "\x1b" not in out.stderr


# --- the worker: secrets and log lines --------------------------------------------------------------------


async def test_secrets_from_the_mounted_folder_and_the_environment_reach_the_tool(deployed: Backend) -> None:
    out = deployed.cli("send", sid("secret"), "secret", "--harness", HARNESS)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout[len("done: "):])
    assert result == {"api_key_sha256": sha(API_KEY), "db_password_sha256": sha(DB_PASSWORD),
                      "names": ["api_key", "db_password"]}


async def test_worker_logs_json_lines_with_context_and_a_failed_tool_with_its_traceback_scrubbed(
    deployed: Backend,
) -> None:
    s = sid("boom")
    out = deployed.cli("send", s, "explode", "--harness", HARNESS, "--input-id", "in-x")
    assert out.returncode == 0 and "tool_failed" in out.stdout
    assert API_KEY not in out.stdout  # the model's copy is scrubbed by the session too
    worker = deployed.workers[0]

    def lines() -> list[dict[str, Any]]:
        return [json.loads(line) for line in worker.stderr().splitlines() if line.startswith("{")]

    await wait_until(lambda: any(r.get("session_id") == s and "completed" in r["message"] for r in lines()),
                     timeout=30, what="the turn's settled line", details=worker.describe)
    records = lines()
    assert all(line.startswith("{") for line in worker.stderr().splitlines() if line), "every line is JSON"
    mine = [r for r in records if r.get("session_id") == s]
    started = next(r for r in mine if "started" in r["message"])
    assert started["level"] == "INFO" and started["input_id"] == "in-x" and started["logger"] == "harness.session"
    failed = next(r for r in mine if r["level"] == "WARNING")
    assert failed["logger"] == "harness.tool" and failed["tool_call_id"] == "explode" and failed["input_id"] == "in-x"
    assert "ValueError: the payment API refused key [secret:api_key]" in failed["message"]
    assert "Traceback (most recent call last)" in failed["message"] and "explode_impl" in failed["message"]
    assert API_KEY not in worker.stderr() and DB_PASSWORD not in worker.stderr()
    assert API_KEY not in worker.stdout()
