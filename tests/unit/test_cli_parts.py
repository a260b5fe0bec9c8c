"""The pure parts behind the CLI and the worker: environment settings, secrets folders,
log scrubbing and formats, the max-sessions gate, Maven progress, rendering."""

from __future__ import annotations

import io
import json
import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness import logs
from harness.cli.common import kafka_client_config
from harness.cli.render import (
    Style,
    age,
    ask_lines,
    session_header,
    sessions_table,
    state_text,
    timeline_line,
)
from harness.errors import ConfigError
from harness.runtime.gate import SessionGate
from harness.services.worker.secrets import WorkerSecrets, load_secrets, secrets_from_dir, secrets_from_env
from harness.testing.kafka_jars import JarProgress
from harness.views import OpenAsk, SessionSummary, TimelineItem, Usage


@pytest.fixture(autouse=True)
def clean_registry() -> Iterator[None]:
    logs.SECRETS.clear()
    yield
    logs.SECRETS.clear()


def test_kafka_config_variables_become_librdkafka_keys() -> None:
    env = {"HARNESS_KAFKA_CONFIG_SASL_PASSWORD": "pw", "HARNESS_KAFKA_CONFIG_SECURITY_PROTOCOL": "SASL_SSL",
           "HARNESS_KAFKA_CONFIG_": "ignored", "HARNESS_LOG": "x"}
    assert kafka_client_config(env) == {"sasl.password": "pw", "security.protocol": "SASL_SSL"}


def test_a_double_underscore_in_a_kafka_config_variable_is_an_underscore_of_the_key() -> None:
    env = {"HARNESS_KAFKA_CONFIG_LOG__LEVEL": "7", "HARNESS_KAFKA_CONFIG_SASL_OAUTHBEARER_CLIENT_ID": "me"}
    assert kafka_client_config(env) == {"log_level": "7", "sasl.oauthbearer.client.id": "me"}


def test_secrets_folder_in_the_kubernetes_layout(tmp_path: Path) -> None:
    data = tmp_path / "..2025_01_01_00_00_00.1"
    data.mkdir()
    (data / "stripe").write_text("sk_live_1\n")
    (data / "crlf").write_text("v\r\n")
    (tmp_path / "..data").symlink_to(data.name)
    (tmp_path / "stripe").symlink_to("..data/stripe")
    (tmp_path / "crlf").symlink_to("..data/crlf")
    (tmp_path / ".dotfile").write_text("no")
    (tmp_path / "folder").mkdir()
    (tmp_path / "exact").write_text("two\n\n")
    assert secrets_from_dir(tmp_path) == {"stripe": "sk_live_1", "crlf": "v", "exact": "two\n"}


def test_secrets_from_the_environment_and_a_conflict(tmp_path: Path) -> None:
    assert secrets_from_env({"HARNESS_SECRET_STRIPE_KEY": "k", "HARNESS_SECRET_": "x", "OTHER": "y"}) == {
        "stripe_key": "k"
    }
    (tmp_path / "stripe_key").write_text("file")
    with pytest.raises(ConfigError, match="given twice"):
        load_secrets(tmp_path, {"HARNESS_SECRET_STRIPE_KEY": "env"})
    with pytest.raises(ConfigError, match="no such folder"):
        load_secrets(tmp_path / "nope", {})
    got = load_secrets(tmp_path, {"HARNESS_SECRET_OTHER": "o"})
    assert dict(got) == {"stripe_key": "file", "other": "o"}
    assert logs.SECRETS.scrub("file and o") == "[secret:stripe_key] and [secret:other]"


def _record(logger: str, message: str, *args: object, exc: BaseException | None = None) -> logging.LogRecord:
    exc_info = (type(exc), exc, exc.__traceback__) if exc is not None else None
    return logging.LogRecord(logger, logging.WARNING, __file__, 1, message, args, exc_info)


def test_secret_filter_scrubs_message_arguments_and_traceback() -> None:
    logs.SECRETS.add({"api_key": "sk_live_abc", "short": "sk_live"})
    try:
        raise ValueError("key sk_live_abc refused")
    except ValueError as caught:
        record = _record("harness.tool", "calling with %s", "sk_live_abc", exc=caught)
    logs.SecretFilter().filter(record)
    logs.ContextFilter().filter(record)
    text = logs.TextFormatter().format(record)
    assert "sk_live" not in text
    assert "calling with [secret:api_key]" in text and "ValueError: key [secret:api_key] refused" in text


def test_secret_filter_scrubs_the_context_fields_of_a_line() -> None:
    """A line about an input refused for holding a secret in its id names the input."""
    logs.SECRETS.add({"api_key": "sk_live_abc"})
    stream = io.StringIO()
    handler = logs.configure(level="debug", fmt="text", stream=stream)
    try:
        logs.bind(session_id="user-sk_live_abc", input_id="sk_live_abc", tool_call_id=None)
        logging.getLogger("harness.test").info("input refused")
    finally:
        logging.getLogger().removeHandler(handler)
        logs.bind(session_id=None, input_id=None)
    line = stream.getvalue()
    assert "sk_live" not in line
    assert "[session=user-[secret:api_key] input=[secret:api_key]]" in line


def test_json_lines_carry_the_context_of_the_current_task() -> None:
    stream = io.StringIO()
    handler = logs.configure(level="debug", fmt="json", stream=stream)
    try:
        logs.bind(session_id="s-1", input_id="in-1", tool_call_id=None)
        logging.getLogger("harness.test").info("turn %d started", 1)
    finally:
        logging.getLogger().removeHandler(handler)
        logs.bind(session_id=None, input_id=None)
    [line] = stream.getvalue().splitlines()
    data = json.loads(line)
    assert data["message"] == "turn 1 started" and data["level"] == "INFO" and data["logger"] == "harness.test"
    assert (data["session_id"], data["input_id"]) == ("s-1", "in-1") and "tool_call_id" not in data
    assert data["ts"].endswith("Z")



def test_the_http_clients_request_lines_show_at_debug_only() -> None:
    """A worker printed an INFO line of the model SDK's HTTP client for every model call."""
    for level, shown in (("info", False), ("debug", True)):
        stream = io.StringIO()
        handler = logs.configure(level=level, fmt="text", stream=stream)
        try:
            logging.getLogger("httpx").info('HTTP Request: POST http://127.0.0.1:9/v1/chat/completions "200 OK"')
            logging.getLogger("httpx").warning("a retry")
            logging.getLogger("harness.test").info("ours")
        finally:
            logging.getLogger().removeHandler(handler)
        text = stream.getvalue()
        assert ("HTTP Request" in text) is shown and "a retry" in text and "ours" in text, text

def test_log_levels_and_formats_are_checked() -> None:
    assert logs.parse_level("DEBUG") == logging.DEBUG and logs.parse_level(" warning ") == logging.WARNING
    with pytest.raises(ValueError, match="unknown log level 'loud'"):
        logs.parse_level("loud")
    with pytest.raises(ValueError, match="unknown log format"):
        logs.configure(fmt="xml")


def test_lease_wait_message() -> None:
    now = time.time()
    text = logs.lease_wait_message("s-1", "worker:host:1:ab", now + 13.2, now)
    clock = time.strftime("%H:%M:%S", time.localtime(now + 13.2))
    assert text == f"waiting for the lease of session s-1, held by worker:host:1:ab until {clock} (14 s)"


# --- the gate --------------------------------------------------------------------------------------------


async def test_gate_admits_at_most_n_and_starts_the_queue_in_order() -> None:
    gate = SessionGate(2)
    running: dict[str, bool] = {}
    started: list[str] = []

    def active(sid: str) -> bool:
        return running.get(sid, False)

    def starter(sid: str):  # type: ignore[no-untyped-def]
        async def start():  # type: ignore[no-untyped-def]
            started.append(sid)
            running[sid] = True
            return lambda: active(sid)

        return start

    for sid in "abcd":
        if gate.try_take(sid, lambda sid=sid: active(sid)):
            running[sid] = True
            started.append(sid)
        else:
            gate.enqueue(sid, "owner", starter(sid))
    assert started == ["a", "b"] and gate.waiting == ["c", "d"]
    assert not gate.try_take("e", lambda: True), "nobody jumps the queue"
    await gate.pump()
    assert started == ["a", "b"]
    running["a"] = False  # a stopped running (ended, or parked on a person)
    assert await gate.pump() == 1 and started == ["a", "b", "c"] and gate.waiting == ["d"]
    gate.drop("owner")
    running["b"] = False
    assert await gate.pump() == 0 and gate.running == 1


def test_an_unlimited_gate_admits_everyone() -> None:
    gate = SessionGate(None)
    assert all(gate.try_take(str(i), lambda: True) for i in range(100)) and gate.running == 0
    with pytest.raises(ValueError):
        SessionGate(0)


# --- Maven progress ----------------------------------------------------------------------------------------


def test_jar_progress_reads_mavens_transfer_lines() -> None:
    progress = JarProgress()
    lines = [
        "[INFO] Scanning for projects...",
        "Downloading from central: https://repo.maven.apache.org/maven2/org/apache/kafka/kafka_2.13/4.1.1/kafka_2.13-4.1.1.jar",
        "Downloaded from central: https://repo.maven.apache.org/maven2/org/apache/kafka/kafka_2.13/4.1.1/kafka_2.13-4.1.1.jar (6.5 MB at 3.1 MB/s)",
        "Downloading from central: https://repo.maven.apache.org/maven2/com/x/y/1/y-1.jar",
        "Downloaded from central: https://repo.maven.apache.org/maven2/com/x/y/1/y-1.jar (512 kB at 1.0 MB/s)",
    ]
    changed = [progress.feed(line) for line in lines]
    assert changed == [False, True, True, True, True]
    progress.copied = 2
    assert progress.text() == "downloaded 2/2 files (7.0 MB), 2 jars in place"


# --- rendering ---------------------------------------------------------------------------------------------


def test_sessions_table_is_aligned_and_plain_without_colour() -> None:
    now = 1_000_000_000_000
    rows = [
        SessionSummary("s-1", "acme/a", "waiting", last_activity=now - 5000, turns=2,
                       open_asks=(OpenAsk("c1", "approval", "ok?", {}, None),)),
        SessionSummary("s-22", None, "failed", last_activity=now - 7_200_000, last_code="model_error", turns=1),
        SessionSummary("old", None, "idle", partial=True),
    ]
    lines = sessions_table(rows, now, Style(False))
    assert lines[0].split() == ["SESSION", "HARNESS", "STATE", "LAST", "ACTIVITY", "ASKS", "TURNS"]
    assert lines[1].split() == ["s-1", "acme/a", "waiting", "for", "a", "person", "5s", "ago", "c1/approval", "2"]
    assert "failed (model_error)" in lines[2] and "2h ago" in lines[2]
    assert lines[3].split()[2:4] == ["idle", "(ended)"]
    starts = [line.index(col) for line, col in zip(lines, ["STATE", "waiting", "failed", "idle"], strict=True)]
    assert len(set(starts)) == 1, lines
    assert "\x1b[" in sessions_table(rows, now, Style(True))[1]
    assert age(now - 90_000, now) == "1m ago" and age(None, now) == "-"
    assert state_text(SessionSummary("x", None, "sleeping", sleeping_until=now), now).startswith("sleeping until ")
    assert state_text(SessionSummary("x", None, "running", pending_inputs=2), now) == "queued (2 inputs not taken yet)"
    assert state_text(SessionSummary("x", None, "running", active_input="in-1", pending_inputs=1), now) == "running"


def test_timeline_line_nests_by_depth() -> None:
    now = int(time.time() * 1000)
    step = TimelineItem(seq=5, ts=now, kind="step", depth=2, tool_call_id="c1", name="charge", preview='{"id":1}')
    line = timeline_line(step, now, Style(False))
    assert line.endswith('    step     charge = {"id":1}')
    error = TimelineItem(seq=6, ts=now, kind="tool.result", depth=1, tool_call_id="c1", name="charge",
                         preview="{}", error=True, code="tool_failed")
    assert "  error    charge [c1] (tool_failed) → {}" in timeline_line(error, now, Style(False))


def test_a_timeline_line_escapes_control_characters_of_names_and_values() -> None:
    """A step name with a newline stays on its line; terminal escapes in a name, a value
    or a message are shown, not obeyed (they could recolour or rewrite the screen)."""
    now = int(time.time() * 1000)
    step = TimelineItem(seq=5, ts=now, kind="step", depth=2, tool_call_id="c1", name="charge\nrefund",
                        preview='"\x1b[2J"')
    line = timeline_line(step, now, Style(False))
    assert "\n" not in line and "\x1b" not in line
    assert line.endswith('step     charge\\nrefund = "\\x1b[2J"')
    message = TimelineItem(seq=1, ts=now, kind="input.message", depth=0, input_id="in-1", text="two\nlines\x07",
                           status="completed")
    assert '"two lines\\x07"' in timeline_line(message, now, Style(False))
    coloured = timeline_line(step, now, Style(True))
    assert coloured.count("\x1b[") >= 1 and "\x1b[2J" not in coloured  # only the style's own codes


def test_show_prints_model_usage_retries_and_truncation() -> None:
    now = int(time.time() * 1000)
    used = TimelineItem(seq=7, ts=now, kind="model.usage", depth=1, turn=1, name="gpt-test",
                        value={"input_tokens": 1200, "output_tokens": 40, "cost": 0.0042},
                        preview="1,200 in / 40 out tokens, $0.0042")
    assert timeline_line(used, now, Style(False)).endswith("  usage    gpt-test: 1,200 in / 40 out tokens, $0.0042")
    retry = TimelineItem(seq=3, ts=now, kind="model.retry", depth=1, turn=1, attempt=2, text="server error",
                         code="500", status="retrying", wake_at=now + 1500)
    line = timeline_line(retry, now, Style(False))
    assert "  retry    failed (500): server error; retry 2 at " in line
    cut = TimelineItem(seq=4, ts=now, kind="model.response", depth=1, turn=1, text="on it", preview="checkout()",
                       status="truncated")
    assert timeline_line(cut, now, Style(False)).endswith(
        '"on it"  → checkout()  (cut at the output limit: its calls do not run)')
    summary = SessionSummary("s-1", "acme/a", "idle", last_activity=now, turns=1, last_outcome="completed",
                             usage=Usage(2, 2500, 4136, 0.0042))
    header = session_header(summary, now, Style(False))
    assert "  ·  2 model calls: 2,500 in / 4,136 out tokens, $0.0042  ·  " in header
    assert "model call" not in session_header(SessionSummary("s-2", None, "idle"), now, Style(False))


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def publish(folder: Path, version: str, values: dict[str, str]) -> None:
    """Publish a Secret's new version as the kubelet does: a new timestamped folder, then
    ``..data`` swapped to it in one rename; the keys are links through ``..data``."""
    data = folder / f"..{version}"
    data.mkdir()
    for name, value in values.items():
        (data / name).write_text(value + "\n")
        if not (folder / name).is_symlink():
            (folder / name).symlink_to(f"..data/{name}")
    (folder / "..data_tmp").symlink_to(data.name)
    os.replace(folder / "..data_tmp", folder / "..data")


def test_a_rotated_secret_reaches_the_sessions_started_after_the_change(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    publish(tmp_path, "2026_01_01_v1", {"api_key": "sk_live_first_1111", "other": "same-value-1"})
    clock = FakeClock()
    secrets = WorkerSecrets(tmp_path, {"HARNESS_SECRET_DB": "db-pass-123"}, recheck=10, clock=clock)
    assert dict(secrets.secrets_for("s-1", "h")) == {
        "api_key": "sk_live_first_1111", "other": "same-value-1", "db": "db-pass-123"
    }

    publish(tmp_path, "2026_01_02_v2", {"api_key": "sk_live_second_2222", "other": "same-value-1"})
    clock.now += 5  # not time to look again yet
    assert secrets.current()["api_key"] == "sk_live_first_1111"
    clock.now += 5
    with caplog.at_level(logging.INFO, logger="harness.worker"):
        assert dict(secrets.current()) == {
            "api_key": "sk_live_second_2222", "other": "same-value-1", "db": "db-pass-123"
        }
    assert [r.getMessage() for r in caplog.records] == [
        f"the secrets in {tmp_path} changed (api_key); sessions started from now on get them"
    ]
    # The old value may still be in a running session: both stay scrubbed.
    assert logs.SECRETS.scrub("sk_live_first_1111 sk_live_second_2222") == "[secret:api_key] [secret:api_key]"
    clock.now += 60  # nothing changed: nothing is read or logged
    caplog.clear()
    assert secrets.current()["api_key"] == "sk_live_second_2222" and not caplog.records


def test_a_change_that_cannot_be_used_keeps_the_previous_secrets(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "api_key").write_text("sk_live_first_1111")
    clock = FakeClock()
    secrets = WorkerSecrets(tmp_path, {"HARNESS_SECRET_DB": "db-pass-123"}, recheck=1, clock=clock)
    (tmp_path / "api_key").write_bytes(b"\xff\xfe not utf-8")
    clock.now += 1
    with caplog.at_level(logging.WARNING, logger="harness.worker"):
        assert secrets.current()["api_key"] == "sk_live_first_1111"
    (warning,) = caplog.records
    assert "cannot be used" in warning.getMessage() and "api_key" in warning.getMessage()
    (tmp_path / "db").write_text("from-the-folder")  # now also given by the environment
    (tmp_path / "api_key").write_text("sk_live_fixed_3333")
    clock.now += 1
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="harness.worker"):
        assert secrets.current()["api_key"] == "sk_live_first_1111"
    assert "given twice" in caplog.records[0].getMessage()
    (tmp_path / "db").unlink()
    clock.now += 1
    assert secrets.current() == {"api_key": "sk_live_fixed_3333", "db": "db-pass-123"}


def test_an_open_ask_with_an_expiry_says_until_when_and_how_long_is_left() -> None:
    plain = Style(False)
    soon = time.time() + 150
    lines = ask_lines([OpenAsk("c1", "approval", "Refund?", {"properties": {"ok": {}}}, soon),
                       OpenAsk("c2", "open", "Any time?", {}, None)], "s-1", plain)
    assert lines[0].startswith("ask c1/approval: Refund? (expires ") and lines[0].endswith(", in 2 min)"), lines
    assert lines[1] == "  answer with: harness answer s-1 c1 approval 'JSON' (fields: ok)"
    assert lines[2] == "ask c2/open: Any time?"  # no expiry, nothing said


async def test_a_slow_command_says_once_that_it_is_still_reading(capsys: pytest.CaptureFixture[str]) -> None:
    import asyncio

    from harness.cli.common import telling_if_slow

    async def slow() -> str:
        await asyncio.sleep(0.2)
        return "done"

    assert await telling_if_slow(slow(), after=0.01, note="(still reading)") == "done"
    assert capsys.readouterr().err == "(still reading)\n"

    assert await telling_if_slow(slow(), after=5, note="(still reading)") == "done"
    assert capsys.readouterr().err == ""  # quick: nothing said

    async def broken() -> None:
        await asyncio.sleep(0.05)
        raise ValueError("the log said no")

    with pytest.raises(ValueError, match="the log said no"):
        await telling_if_slow(broken(), after=0.01, note="(still reading)")


async def test_a_cancelled_command_cancels_what_it_was_reading() -> None:
    import asyncio

    from harness.cli.common import telling_if_slow

    reading = asyncio.Event()
    cancelled = asyncio.Event()

    async def endless() -> None:
        reading.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    command = asyncio.ensure_future(telling_if_slow(endless(), after=3600, note="-"))
    await reading.wait()
    command.cancel()
    with pytest.raises(asyncio.CancelledError):
        await command
    assert cancelled.is_set()


async def test_harness_sessions_on_a_slow_listing_says_what_it_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from harness.cli import sessions

    monkeypatch.setattr(sessions, "SLOW_LISTING_S", 0.0)  # every listing counts as slow
    from harness.log import open_log

    url = f"sqlite:///{tmp_path / 'h.db'}"
    await open_log(url).close()  # an empty log, as a worker leaves it
    assert await sessions.main_sessions(["--log", url]) == 0
    err = capsys.readouterr().err
    assert err.splitlines() == ["(still reading the log: a big one takes a few seconds)", "no sessions in this log"]
    assert await sessions.main_sessions(["--log", url, "--history", "--json"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out) == []  # stdout stays the JSON alone
    assert "--history reads every partition from its start" in err


def test_debug_may_come_before_the_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`harness --debug sessions` (where most CLIs take a global flag) said "unknown command
    '--debug'"; it is the command's own --debug: the traceback, then the one line."""
    from harness.cli import main

    assert main(["--debug", "sessions", "--log", f"sqlite:///{tmp_path / 'none.db'}"]) == 1
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and "unknown command" not in err
    assert err.rstrip().splitlines()[-1].startswith("harness sessions: no SQLite log at")


def test_a_value_that_starts_with_a_dash_is_told_how_to_pass(capsys: pytest.CaptureFixture[str]) -> None:
    """`harness send s-1 -hello` said only "argument -h/--help: ignored explicit argument
    'ello'"; it now says the word was read as options and how to give it (after --)."""
    from harness.cli.inputs import send_parser

    with pytest.raises(SystemExit) as ended:
        send_parser().parse_args(["s-1", "-hello"])
    assert ended.value.code == 2
    [line] = capsys.readouterr().err.splitlines()
    assert "'-hello' was read as options: a value that starts with '-' goes last, after '--' " \
           "(harness send ... -- -hello)" in line
    assert send_parser().parse_args(["s-1", "--", "-hello"]).text == "-hello"
    with pytest.raises(SystemExit):
        send_parser().parse_args(["s-1", "--no-such"])
    assert "read as options" not in capsys.readouterr().err  # (an option misspelt has its own hint)
