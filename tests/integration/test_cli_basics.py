"""The whole CLI: the overview, ``--version``, ``python -m harness``, every command's
``--help`` with an example, errors as one line (exit 2 usage, 1 runtime, tracebacks only
with ``--debug``), an unreachable broker, missing logs and topics, ``harness topics create``,
and ``HarnessClient`` reading the partition count instead of creating topics."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient

from harness.cli import COMMANDS
from harness.client import HarnessClient
from harness.errors import LogUnavailable, TopicNotFound
from tests.integration.cli_helpers import cli_env, closed_pipe
from tests.integration.fleet_helpers import REPO


def harness(*args: str, env: dict[str, str] | None = None, cwd: Path = REPO,
            module: str = "harness") -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, timeout=120,
                          env=cli_env(env), cwd=cwd, check=False, stdin=subprocess.DEVNULL)


def one_line(out: subprocess.CompletedProcess[str]) -> str:
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in out.stderr, out.stderr
    return lines[0]


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --- overview, version, help ----------------------------------------------------------------------------


@pytest.mark.parametrize("args", [[], ["--help"], ["-h"]])
def test_overview_lists_every_command_with_one_line(args: list[str]) -> None:
    out = harness(*args)
    assert out.returncode == 0 and out.stderr == ""
    for command in COMMANDS:
        [line] = [x for x in out.stdout.splitlines() if x.strip().startswith(command.name + " ")]
        assert command.summary in line
    assert "harness <command> --help" in out.stdout


def test_version_and_both_module_entry_points() -> None:
    out = harness("--version")
    assert out.returncode == 0 and out.stdout.strip().startswith("harness ") and out.stdout.split()[1][0].isdigit()
    assert harness("--version", module="harness.cli").stdout == out.stdout


@pytest.mark.parametrize("command", [c.name for c in COMMANDS])
def test_every_command_has_help_with_an_example(command: str) -> None:
    out = harness(command, "--help")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(f"usage: harness {command}")
    body = out.stdout.split("\n\n", 1)[1]  # after the usage lines: an example of the command
    assert f"harness {command} " in body
    assert "``" not in out.stdout, "plain text, not a docstring's reStructuredText"
    assert "''s" not in out.stdout, "a quoted name's possessive ('serve''s worker) reads as a typo"


@pytest.mark.parametrize("command", [c.name for c in COMMANDS])
def test_every_option_of_every_command_has_help(command: str) -> None:
    """`harness kafka-local --help` listed --startup-timeout with no word on what it does."""
    lines = harness(command, "--help").stdout.splitlines()
    bare = []
    for i, line in enumerate(lines):
        if not re.match(r"  -", line):
            continue  # not an option's first line
        has_text = re.match(r"  -\S.*?\s{2,}\S", line) is not None  # the help on the same line
        continued = i + 1 < len(lines) and re.match(r"\s{6,}[^\s-]", lines[i + 1]) is not None
        if not has_text and not continued:
            bare.append(line.strip())
    assert bare == [], f"options without help in 'harness {command} --help'"


@pytest.mark.parametrize("buffered", [False, True])
@pytest.mark.parametrize("args", [["--help"], ["--version"]])
def test_output_into_a_closed_pipe_ends_quietly_with_141(args: list[str], buffered: bool) -> None:
    """`harness ... | head -1`: the reader went away; it printed "unexpected error:
    BrokenPipeError" (or Python's "Exception ignored ... BrokenPipeError") and exited 1 or 120.
    Buffered, the write fails only when stdout is flushed."""
    env = cli_env()
    if buffered:
        del env["PYTHONUNBUFFERED"]
    with closed_pipe() as stdout:
        out = subprocess.run([sys.executable, "-m", "harness", *args], stdout=stdout, stderr=subprocess.PIPE,
                             text=True, timeout=120, env=env, cwd=REPO, check=False, stdin=subprocess.DEVNULL)
    assert (out.returncode, out.stderr) == (141, "")


@pytest.mark.parametrize("command", [c.name for c in COMMANDS])
def test_every_command_reports_a_usage_error_in_one_line(command: str) -> None:
    out = harness(command, "--no-such-flag")
    assert out.returncode == 2, (out.returncode, out.stderr)
    assert out.stderr.startswith(f"harness {command}: ")
    assert "--no-such-flag" in out.stderr or "required" in out.stderr  # a missing argument comes first
    assert len(out.stderr.strip().splitlines()) == 1 and "Traceback" not in out.stderr


@pytest.mark.parametrize("command", ["gateway", "serve"])
def test_a_bad_port_names_the_flag_or_the_variable_it_came_from(command: str) -> None:
    out = harness(command, "--port", "abc")
    assert out.returncode == 2
    assert one_line(out).startswith(f"harness {command}: argument --port: a port is a whole number 0..65535, not 'abc'")
    env = harness(command, "--open-access", env={"HARNESS_GATEWAY_PORT": "x"})
    assert env.returncode == 2
    assert one_line(env) == f"harness {command}: HARNESS_GATEWAY_PORT: a port is a whole number 0..65535, not 'x'"


HUGE = "99999999999999999999"


@pytest.mark.parametrize(("args", "env", "says"), [
    (["topics", "create", "--log", "kafka://127.0.0.1:9?topic_prefix=t", "--partitions", "2147483648"], {},
     "argument --partitions: --partitions takes a whole number from 1 to 100000, not 2147483648"),
    (["topics", "create", "--log", "kafka://127.0.0.1:9?topic_prefix=t&partitions=2147483648"], {},
     "partitions must be from 1 to 100000, not 2147483648"),
    (["topics", "create", "--log", f"kafka://127.0.0.1:9?topic_prefix=t&replication_factor={HUGE}"], {},
     f"replication_factor must be from 1 to 10000, not {HUGE}"),
    (["sessions", "--log", "sqlite:///none.db", "--limit", HUGE], {}, f"from 1 to 2147483647, not {HUGE}"),
    (["worker", "--app", "x:y", "--max-sessions", HUGE], {}, f"from 1 to 2147483647, not {HUGE}"),
    (["worker", "--app", "x:y", "--sync-threads", HUGE], {}, f"from 1 to 2147483647, not {HUGE}"),
    (["worker", "--app", "x:y"], {"HARNESS_MAX_SESSIONS": HUGE},
     f"HARNESS_MAX_SESSIONS takes a whole number from 1 to 2147483647, not {HUGE}"),
    (["worker", "--app", "x:y", "--lease", "1e300"], {}, "at most 1000000000, not 1e300"),
    (["worker", "--app", "x:y", "--drain-timeout", "1e300"], {}, "from 0 to 1000000000, not 1e300"),
    (["worker", "--app", "x:y"], {"HARNESS_LEASE_SECONDS": "1e300"}, "at most 1000000000, not 1e300"),
    (["serve", "--app", "x:y", "--max-body-bytes", HUGE], {}, f"at most 2147483647, not {HUGE}"),
    (["serve", "--app", "x:y", "--auth-failure-limit", HUGE], {}, f"at most 2147483647, not {HUGE}"),
    (["gateway", "--rate-limit", "1e300"], {}, "0 to 2147483647 (0: no limit), not 1e300"),
    (["gateway", "--heartbeat", "1e300"], {}, "at most 1000000000, not 1e300"),
    (["send", "s-1", "hi", "--timeout", "1e300"], {}, "at most 1000000000, not 1e300"),
])
def test_a_number_too_large_for_an_option_is_a_usage_error_in_one_line(
    args: list[str], env: dict[str, str], says: str, tmp_path: Path
) -> None:
    """`harness topics create --partitions 2147483648` printed "unexpected error: OverflowError:
    signed integer is greater than maximum" (and `--lease 1e300` its own OverflowError), while 0,
    -1 and abc got a range: a number too large gets the range too."""
    log = [] if "--log" in args else ["--log", f"sqlite:///{tmp_path / 'x.db'}"]
    out = harness(*args, *log, env=env, cwd=tmp_path)
    assert out.returncode == 2, out.stderr
    assert says in one_line(out) and "Overflow" not in out.stderr


def test_send_refuses_an_empty_message_as_the_gateway_does(tmp_path: Path) -> None:
    """`harness send s1 ''` was sent (the gateway answers 422 for an empty text)."""
    out = harness("send", "s1", "", "--harness", "x", "--log", f"sqlite:///{tmp_path / 'x.db'}")
    assert out.returncode == 2
    assert one_line(out) == "harness send: the message text is empty: give the message to send, e.g. harness send s1 'hello'"


def test_an_empty_id_is_refused_with_the_right_article(tmp_path: Path) -> None:
    """The error for an empty input id read "a input id must not be empty"."""
    log = f"sqlite:///{tmp_path / 'x.db'}"
    out = harness("send", "s1", "hi", "--harness", "x", "--input-id", "", "--log", log)
    assert out.returncode == 2 and one_line(out) == "harness send: an input id must not be empty"
    out = harness("answer", "", "call-1", "approval", "true", "--log", log)
    assert out.returncode == 2 and one_line(out) == "harness answer: a session id must not be empty"


def test_the_sessions_table_cuts_a_long_session_id_and_json_keeps_it(tmp_path: Path) -> None:
    """One session id of 512 characters padded every row of `harness sessions` to ~530 columns."""
    import asyncio
    import json

    from harness import HarnessHost, open_log

    url = f"sqlite:///{tmp_path / 'long.db'}"

    async def make_log() -> None:
        async with HarnessHost(log=open_log(url)):
            pass

    asyncio.run(make_log())
    long_id = "s" + "x" * 511
    for session in (long_id, "s-1"):
        assert harness("send", session, "hi", "--harness", "x", "--no-wait", "--log", url).returncode == 0
    out = harness("sessions", "--log", url)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert len(lines) == 3 and max(map(len, lines)) < 120, lines
    assert any(line.startswith("s" + "x" * 38 + "…  ") for line in lines), lines
    assert out.stderr == "(long ids are cut with '…': --json lists them whole)\n"
    listed = json.loads(harness("sessions", "--json", "--log", url).stdout)
    assert {s["session_id"] for s in listed} == {long_id, "s-1"}


def test_an_unknown_command_is_a_usage_error_with_a_hint() -> None:
    out = harness("sesions")
    assert out.returncode == 2
    assert one_line(out) == "harness: unknown command 'sesions'; did you mean 'sessions'? 'harness --help' lists the commands"


# --- errors ---------------------------------------------------------------------------------------------------


def test_no_log_given_is_a_usage_error() -> None:
    out = harness("sessions")
    assert out.returncode == 2 and "no session log given: pass --log URL or set HARNESS_LOG" in one_line(out)
    assert harness("sessions", env={"HARNESS_LOG": "postgres://x"}).returncode == 2
    memory = harness("show", "s-1", "--log", "memory:")
    assert memory.returncode == 2 and "lives inside one process" in one_line(memory)


def test_a_sqlite_url_with_two_slashes_or_naming_a_folder_says_what_to_write(tmp_path: Path) -> None:
    two = harness("sessions", "--log", "sqlite://data/app.db")
    assert two.returncode == 2 and one_line(two) == (
        "harness sessions: 'sqlite://data/app.db' has two slashes after 'sqlite:'; a path needs three: "
        "sqlite:///data/app.db (relative to the current folder) or four for an absolute one: sqlite:////data/app.db"
    )
    from harness.log import open_log

    with pytest.raises(ValueError) as in_python:  # open_log("sqlite://rel.db") only said "unsupported"
        open_log("sqlite://data/app.db")
    assert one_line(two) == f"harness sessions: {in_python.value}"
    folder = harness("worker", "--app", "tests.apps.cli_app:assistant", "--log", f"sqlite:///{tmp_path}")
    assert folder.returncode == 2 and one_line(folder) == (
        f"harness worker: 'sqlite:///{tmp_path}' names the folder {tmp_path}, not a file: name the log's file in "
        f"it, e.g. sqlite:///{tmp_path}/harness.db"
    )


def test_a_missing_sqlite_file_is_a_runtime_error_and_is_not_created(tmp_path: Path) -> None:
    path = tmp_path / "typo.db"
    out = harness("sessions", "--log", f"sqlite:///{path}")
    assert out.returncode == 1 and one_line(out).startswith(f"harness sessions: no SQLite log at {path}")
    assert not path.exists()


def test_a_worker_on_a_sqlite_file_in_a_missing_folder_says_which_folder(tmp_path: Path) -> None:
    out = harness("worker", "--app", "tests.apps.cli_app:assistant", "--log", "sqlite:///no-such-folder/x.db",
                  cwd=tmp_path)
    line = one_line(out)
    assert out.returncode == 1 and f"its folder {tmp_path / 'no-such-folder'} does not exist" in line, line
    assert not (tmp_path / "no-such-folder").exists()


def test_a_worker_whose_metrics_port_is_taken_says_so_in_one_line(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = harness("worker", "--app", "tests.apps.cli_app:assistant", "--log", f"sqlite:///{tmp_path / 'h.db'}",
                      "--metrics-port", str(port))
    line = one_line(out)
    assert out.returncode in (1, 2) and f"metrics port 0.0.0.0:{port} is in use" in line, line
    assert "give another --metrics-port" in line and "unexpected error" not in line


def test_send_with_no_worker_says_so_when_it_gives_up(tmp_path: Path) -> None:
    import asyncio

    from harness import HarnessHost, open_log

    async def make_log() -> None:  # a log file that exists, with nobody running it
        async with HarnessHost(log=open_log(f"sqlite:///{tmp_path / 'idle.db'}")):
            pass

    asyncio.run(make_log())
    out = harness("send", "s-1", "hi", "--harness", "x", "--timeout", "1", "--log", f"sqlite:///{tmp_path / 'idle.db'}")
    line = one_line(out)
    assert out.returncode == 1 and "not settled within 1 s: no worker took it up" in line, line
    assert "harness worker --log" in line


def test_send_refuses_an_id_that_cannot_be_a_table_cell_or_an_argument(tmp_path: Path) -> None:
    """An empty session id or one with a newline went into the log and broke the table of
    `harness sessions`; it is refused before the log is even opened."""
    url = f"sqlite:///{tmp_path / 'never.db'}"
    for argv in (["", "hi"], ["a\nb", "hi"], ["s-1", "hi", "--input-id", "in 1 "]):
        out = harness("send", *argv, "--harness", "x", "--no-wait", "--log", url)
        line = one_line(out)
        assert out.returncode == 2 and line.startswith("harness send: ") and " id " in line, line  # usage
    assert not (tmp_path / "never.db").exists()


def test_debug_shows_the_traceback(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'missing.db'}"
    plain = harness("show", "s-1", "--log", url)
    debug = harness("show", "s-1", "--log", url, "--debug")
    assert plain.returncode == debug.returncode == 1
    assert "Traceback (most recent call last)" in debug.stderr and "LogUnavailable" in debug.stderr
    assert debug.stderr.strip().splitlines()[-1] == one_line(plain)


@pytest.mark.parametrize("command", [["sessions"], ["show", "s-1"], ["send", "s-1", "hi", "--harness", "x"],
                                     ["worker", "--app", "tests.apps.cli_app:assistant"]])
def test_an_unreachable_broker_is_one_line(command: list[str]) -> None:
    port = closed_port()
    out = harness(*command, "--log", f"kafka://127.0.0.1:{port}?topic_prefix=nowhere")
    assert out.returncode == 1
    line = one_line(out)
    assert f"cannot reach Kafka at 127.0.0.1:{port} within 5 s" in line
    assert "check the address in --log (or HARNESS_LOG) and that the broker is up" in line


# --- Kafka topics: clients never create them --------------------------------------------------------------


def topics(bootstrap: str, prefix: str) -> dict[str, int]:
    metadata = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=30)
    return {name: len(t.partitions) for name, t in metadata.topics.items() if name.startswith(prefix + ".")}


@pytest.mark.kafka
def test_client_commands_never_create_topics(kafka_bootstrap: str, unique_prefix: str) -> None:
    url = f"kafka://{kafka_bootstrap}?topic_prefix={unique_prefix}"
    for command in (["sessions"], ["send", "s-1", "hi", "--harness", "x"], ["show", "s-1"]):
        out = harness(*command, "--log", url)
        assert out.returncode == 1
        assert f"topic '{unique_prefix}.sessions' does not exist" in one_line(out)
        assert "harness topics create --log URL" in out.stderr
    assert topics(kafka_bootstrap, unique_prefix) == {}


@pytest.mark.kafka
def test_topics_create_makes_the_three_topics_once(kafka_bootstrap: str, unique_prefix: str) -> None:
    url = f"kafka://{kafka_bootstrap}?topic_prefix={unique_prefix}"
    out = harness("topics", "create", "--log", url, "--partitions", "3")
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        f"{unique_prefix}.sessions: created, 3 partitions",
        f"{unique_prefix}.dead-letter: created",
        f"{unique_prefix}.snapshots: created, 3 partitions",
    ]
    assert topics(kafka_bootstrap, unique_prefix) == {
        f"{unique_prefix}.sessions": 3, f"{unique_prefix}.dead-letter": 1, f"{unique_prefix}.snapshots": 3
    }
    again = harness("topics", "create", "--log", url)
    assert again.returncode == 0 and again.stdout.splitlines()[0] == f"{unique_prefix}.sessions: exists, 3 partitions"
    other = harness("topics", "create", "--log", url, "--partitions", "4")
    assert other.returncode == 1 and "has 3 partitions but this log is configured for 4" in one_line(other)
    listed = harness("sessions", "--log", url)  # a client reads the count: no mismatch
    assert listed.returncode == 0 and "no sessions in this log" in listed.stderr
    sqlite = harness("topics", "create", "--log", "sqlite:///x.db")
    assert sqlite.returncode == 2 and "only Kafka logs have topics" in one_line(sqlite)


@pytest.mark.kafka
async def test_harness_client_reads_the_partition_count_and_never_creates_a_topic(
    kafka_bootstrap: str, unique_prefix: str
) -> None:
    async with HarnessClient(bootstrap=kafka_bootstrap, topic_prefix=unique_prefix) as client:
        with pytest.raises(TopicNotFound, match="harness topics create"):
            await client.send("s-1", "hello", harness="x")
    assert topics(kafka_bootstrap, unique_prefix) == {}
    out = harness("topics", "create", "--log", f"kafka://{kafka_bootstrap}?topic_prefix={unique_prefix}",
                  "--partitions", "5")
    assert out.returncode == 0, out.stderr
    async with HarnessClient(bootstrap=kafka_bootstrap, topic_prefix=unique_prefix) as client:
        await client.send("s-1", "hello", harness="x", input_id="in-1")
        assert client.log.settings.partitions == 5  # type: ignore[attr-defined]
        [entry] = await client.log.read("s-1")
        assert entry.data["input_id"] == "in-1"
    async with HarnessClient(bootstrap=kafka_bootstrap, topic_prefix=unique_prefix, partitions=6) as client:
        with pytest.raises(LogUnavailable, match="has 5 partitions"):
            await client.send("s-1", "hello", harness="x")


def test_send_and_answer_with_no_worker_say_so_while_they_wait(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    """A piped `harness send` with no worker on the log said nothing, for ever: after a while it
    says once that nobody took the input and how to start a worker, and keeps waiting."""
    import asyncio

    from harness import HarnessHost, open_log
    from harness.cli import inputs

    url = f"sqlite:///{tmp_path / 'idle.db'}"

    async def make_log() -> None:
        async with HarnessHost(log=open_log(url)):
            pass

    asyncio.run(make_log())
    monkeypatch.setattr(inputs, "UNTAKEN_HINT_S", 0.3)
    with pytest.raises(TimeoutError, match="no worker took it up"):
        asyncio.run(inputs.main_send(["s-1", "hi", "--harness", "x", "--input-id", "in-1", "--timeout", "3",
                                      "--log", url]))
    err = capsys.readouterr().err.splitlines()
    hints = [line for line in err if "no worker has taken it in 0.3 s" in line]
    assert len(hints) == 1 and hints[0].startswith("in-1: ") and "harness worker --log" in hints[0], err
    assert "still waiting" in hints[0]


def test_answer_with_no_worker_says_so_not_that_it_is_queued_behind_its_own_turn(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`harness answer` with no worker said the answer was "queued behind turn 1 ..., which is
    still running": the turn that asked, which waits for this very answer. It gives the hint
    `send` gives (the same code): nobody took it, is a worker running?"""
    import asyncio

    from harness import HarnessHost, open_log
    from harness.cli import inputs
    from harness.cli import main as cli_main
    from tests.apps.cli_app import assistant

    url = f"sqlite:///{tmp_path / 'asks.db'}"

    async def waiting_ask() -> None:
        async with HarnessHost(log=open_log(url)) as host:
            session = await host.open(assistant, session_id="s-1")
            assert (await session.send("ask", input_id="m1")).outcome == "waiting"

    asyncio.run(waiting_ask())
    monkeypatch.setattr(inputs, "UNTAKEN_HINT_S", 0.3)
    code = cli_main(["answer", "s-1", "approve", "approval", '{"approved": true}', "--input-id", "a-1",
                     "--timeout", "3", "--log", url])
    err = capsys.readouterr().err
    assert code == 1 and "queued behind" not in err, err
    hints = [line for line in err.splitlines() if line.startswith("a-1: ")]
    assert len(hints) == 1 and "no worker has taken it in 0.3 s" in hints[0] and "still waiting" in hints[0], err
    assert err.splitlines()[-1].startswith("harness answer: the answer a-1 was not taken within 3 s: no worker took "
                                           "it up. Is a worker running on this log"), err


def test_a_queued_session_is_listed_as_running_and_state_queued_says_so(tmp_path: Path) -> None:
    """The table shows `queued (1 input not taken yet)`, a state the README did not list, and
    `--state queued` was refused as an invalid choice while `--state running` listed it."""
    import asyncio
    import json

    from harness import HarnessHost, open_log

    url = f"sqlite:///{tmp_path / 'queued.db'}"

    async def make_log() -> None:
        async with HarnessHost(log=open_log(url)):
            pass

    asyncio.run(make_log())
    assert harness("send", "q-1", "hi", "--harness", "x", "--no-wait", "--log", url).returncode == 0  # no worker
    table = harness("sessions", "--log", url).stdout.splitlines()
    assert "queued (1 input not taken yet)" in table[1], table
    [running] = json.loads(harness("sessions", "--state", "running", "--json", "--log", url).stdout)
    assert (running["session_id"], running["state"], running["pending_inputs"]) == ("q-1", "running", 1)
    out = harness("sessions", "--state", "queued", "--log", url)
    assert out.returncode == 2 and out.stdout == ""
    assert one_line(out) == (
        "harness sessions: argument --state: a queued session (its input not taken by a worker yet) is a running "
        "one: use --state running (see 'harness sessions --help')"
    )


def test_send_behind_a_sleeping_turn_names_that_turn_not_a_missing_worker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A message queued behind a turn that sleeps is not taken until that turn ends: the hint
    said no worker had taken it ("Is a worker running on this log ...?")."""
    import asyncio

    from harness import HarnessHost, open_log
    from harness.cli import inputs
    from tests.apps.cli_app import assistant

    url = f"sqlite:///{tmp_path / 'nap.db'}"

    async def park_a_turn_in_a_sleep() -> None:
        async with HarnessHost(log=open_log(url)) as host:
            session = await host.open(assistant, session_id="s-1")
            sending = asyncio.ensure_future(session.send("nap=600", input_id="in-1"))
            while not any(e.type == "harness.sleep.scheduled" for e in await host.log.read("s-1")):
                await asyncio.sleep(0.05)
            sending.cancel()

    asyncio.run(park_a_turn_in_a_sleep())
    monkeypatch.setattr(inputs, "UNTAKEN_HINT_S", 0.3)
    with pytest.raises(TimeoutError) as timeout:
        asyncio.run(inputs.main_send(["s-1", "hi", "--input-id", "in-2", "--timeout", "3", "--log", url]))
    assert "no worker" not in str(timeout.value) and "harness show s-1" in str(timeout.value)
    err = capsys.readouterr().err
    hints = [line for line in err.splitlines() if line.startswith("in-2: ")]
    assert len(hints) == 1 and "no worker" not in err, err
    assert hints[0].startswith("in-2: queued behind turn 1 (input in-1), which sleeps until ")
    assert hints[0].endswith("; it is taken once that turn ends; still waiting (--timeout SECONDS stops sooner)")



def test_send_behind_a_turn_cut_mid_tool_does_not_claim_a_worker_still_runs_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A message queued behind a turn whose worker died mid-tool was said to wait for a turn
    "which is still running": the log cannot tell a running turn from a dead worker's, so
    the hint says how the turn goes on if no worker runs."""
    import asyncio

    from harness import HarnessHost, open_log
    from harness.cli import inputs
    from tests.apps.cli_app import assistant

    url = f"sqlite:///{tmp_path / 'cut.db'}"
    monkeypatch.setenv("HARNESS_TEST_GATE_DIR", str(tmp_path))

    async def leave_a_turn_in_its_tool() -> None:
        async with HarnessHost(log=open_log(url)) as host:
            session = await host.open(assistant, session_id="s-1")
            sending = asyncio.ensure_future(session.send("hold", input_id="in-1"))
            while not (tmp_path / "enter-s-1").exists():
                await asyncio.sleep(0.05)
            sending.cancel()

    asyncio.run(leave_a_turn_in_its_tool())
    monkeypatch.setattr(inputs, "UNTAKEN_HINT_S", 0.3)
    with pytest.raises(TimeoutError):
        asyncio.run(inputs.main_send(["s-1", "hi", "--input-id", "in-2", "--timeout", "3", "--log", url]))
    hints = [line for line in capsys.readouterr().err.splitlines() if line.startswith("in-2: ")]
    assert len(hints) == 1, hints
    assert hints[0].startswith("in-2: queued behind turn 1 (input in-1), which has not ended (if no worker runs "
                               "on this log, start one: the turn goes on from the log)"), hints
    assert "still running" not in hints[0]

def test_with_no_worker_an_answer_waiting_to_be_taken_is_not_answered_twice_and_the_harness_is_kept(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An answer sent while no worker runs stays in the log untaken: a second answer to the
    same ask is refused here (the first one wins when a worker comes), ``show`` says the
    ask has its answer waiting instead of how to answer it, and a message naming another
    harness than the session's is refused."""
    import asyncio

    from harness import HarnessHost, open_log
    from harness.cli import inputs, sessions
    from harness.errors import ConfigError
    from tests.apps.cli_app import assistant

    url = f"sqlite:///{tmp_path / 'asks.db'}"

    async def open_an_ask() -> None:  # a worker's turn up to its ask, then no worker at all
        async with HarnessHost(log=open_log(url)) as host:
            session = await host.open(assistant, session_id="s-1")
            assert (await session.send("ask", input_id="in-1")).outcome == "waiting"

    asyncio.run(open_an_ask())
    first = ["s-1", "approve", "approval", '{"approved": true}', "--no-wait", "--log", url]
    assert asyncio.run(inputs.main_answer([*first, "--input-id", "a-1"])) == 0
    assert asyncio.run(inputs.main_answer([*first, "--input-id", "a-1"])) == 0  # the same input again: fine
    capsys.readouterr()
    second = ["s-1", "approve", "approval", '{"approved": false}', "--no-wait", "--log", url]
    assert asyncio.run(inputs.main_answer(second)) == 1
    err = capsys.readouterr().err
    assert "answer refused (answer_waiting): the answer a-1 to approve/approval waits for the session's worker" in err
    assert "nothing was sent" in err

    assert asyncio.run(sessions.main_show(["s-1", "--log", url])) == 0
    shown = capsys.readouterr().out
    assert "answered by a-1: waits for the session's worker to take it" in shown
    assert "answer with:" not in shown

    with pytest.raises(ConfigError, match="session 's-1' runs harness 'tests/cli', not 'tests/other': leave out --harness"):
        asyncio.run(inputs.main_send(["s-1", "hi", "--harness", "tests/other", "--no-wait", "--log", url]))


def test_ctrl_c_of_send_says_the_input_stays_in_the_log(tmp_path: Path) -> None:
    import asyncio
    import signal

    from harness import HarnessHost, open_log

    url = f"sqlite:///{tmp_path / 'idle.db'}"

    async def make_log() -> None:
        async with HarnessHost(log=open_log(url)):
            pass

    asyncio.run(make_log())
    proc = subprocess.Popen([sys.executable, "-m", "harness", "send", "s-1", "hi", "--harness", "x", "--input-id",
                             "in-1", "--log", url], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=cli_env(), cwd=REPO, stdin=subprocess.DEVNULL,
                            # Ctrl-C as at a terminal, even if this suite runs with SIGINT ignored (a
                            # background job of a non-interactive shell): SIG_IGN is inherited.
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        from harness.log.sqlite import SqliteLog

        async def submitted() -> bool:
            log = SqliteLog(str(tmp_path / "idle.db"))
            try:
                return bool(await log.read("s-1"))
            finally:
                await log.close()

        for _ in range(600):  # the input is in the log: send is waiting for it to settle
            if asyncio.run(submitted()):
                break
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
        proc.communicate()  # (closes its pipes even when the test failed: no ResourceWarning in the next test)
    assert proc.returncode == 130
    assert ("harness send: stopped waiting; in-1 stays in the log and its turn runs all the same: "
            "'harness show s-1' shows how it goes") in err, err
    assert "Traceback" not in err


def test_a_flag_typo_is_not_taken_as_a_prefix_of_a_real_flag(tmp_path: Path) -> None:
    out = harness("send", "s-1", "hi", "--harnes", "x", "--log", f"sqlite:///{tmp_path / 'x.db'}")
    assert out.returncode == 2 and "unrecognized arguments: --harnes x" in one_line(out)


@pytest.mark.parametrize(
    ("args", "hint"),
    [
        (["send", "s-1", "hi", "--harnes", "x"], "unrecognized arguments: --harnes x; did you mean --harness?"),
        (["worker", "--app", "a:b", "--max-sesions", "3"],
         "unrecognized arguments: --max-sesions 3; did you mean --max-sessions?"),
        (["sessions", "--jsn"], "unrecognized arguments: --jsn; did you mean --json?"),
        (["serve", "--open-acess"], "unrecognized arguments: --open-acess; did you mean --open-access?"),
        (["tail", "s-1", "--lines=3", "--colour=never"],
         "unrecognized arguments: --colour=never; did you mean --color?"),
        # a message of several words, not quoted
        (["send", "s-1", "check", "out", "order", "42", "--harness", "x"],
         "unrecognized arguments: out order 42; quote a message of several words: harness send s-1 'check out "
         "order 42'"),
    ],
)
def test_an_unrecognized_argument_says_what_was_probably_meant(tmp_path: Path, args: list[str], hint: str) -> None:
    """`harness worker --max-sesions 3` said "unrecognized arguments: --max-sesions 3" and
    no more; `harness send s-1 check out order 42` (the message not quoted) said
    "unrecognized arguments: out order 42"."""
    out = harness(*args, "--log", f"sqlite:///{tmp_path / 'x.db'}")
    assert out.returncode == 2
    assert one_line(out) == f"harness {args[0]}: {hint} (see 'harness {args[0]} --help')"


def test_ctrl_c_while_send_or_answer_submits_or_waits_says_what_became_of_the_input(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Stopped before the log said it took the input, `send` cannot know whether it is in:
    it says so and how to send it again with no second effect (it said nothing). Stopped
    while waiting, `answer` says the answer stays in the log (it printed an empty line)."""
    import asyncio

    from harness import HarnessHost, open_log
    from harness.cli import common, inputs
    from harness.log.sqlite import SqliteLog
    from tests.apps.cli_app import assistant

    url = f"sqlite:///{tmp_path / 'c.db'}"
    held = asyncio.Event()

    class HeldSubmit(SqliteLog):
        async def submit(self, record):  # type: ignore[no-untyped-def]
            held.set()
            await asyncio.Event().wait()  # the log never answers

    async def stop_when(flag: asyncio.Event, coro: Any) -> None:
        task = asyncio.create_task(coro)
        await flag.wait()
        task.cancel()  # what Ctrl-C does to asyncio.run's task
        with pytest.raises(asyncio.CancelledError):
            await task

    real_open = common.open_log_for

    async def open_held(url_: str, **kwargs: Any) -> Any:
        return HeldSubmit(str(tmp_path / "c.db"))

    monkeypatch.setattr(inputs, "open_log_for", open_held)
    asyncio.run(stop_when(held, inputs.main_send(["s-1", "hi", "--harness", "x", "--input-id", "in-9", "--log", url])))
    err = capsys.readouterr().err
    assert ("harness send: stopped while sending; in-9 may be in the log or not: 'harness show s-1' tells; "
            "'harness send' again with --input-id in-9 has no second effect") in err, err
    monkeypatch.setattr(inputs, "open_log_for", real_open)

    async def waiting_ask() -> None:
        async with HarnessHost(log=open_log(url)) as host:
            session = await host.open(assistant, session_id="s-2")
            assert (await session.send("ask", input_id="m1")).outcome == "waiting"

    asyncio.run(waiting_ask())
    hinted = asyncio.Event()

    async def answer_then_stop() -> None:
        monkeypatch.setattr(inputs, "UNTAKEN_HINT_S", 0.0)  # says it is untaken at once: then stop
        real_hint = inputs._hint_when_untaken

        async def hint(*args: Any) -> None:
            await real_hint(*args)
            hinted.set()

        monkeypatch.setattr(inputs, "_hint_when_untaken", hint)
        await stop_when(hinted, inputs.main_answer(["s-2", "approve", "approval", '{"approved": true}',
                                                    "--input-id", "a-9", "--log", url]))

    asyncio.run(answer_then_stop())
    err = capsys.readouterr().err
    assert ("harness answer: stopped waiting; the answer a-9 stays in the log and the session's owner takes it "
            "all the same: 'harness show s-2' shows how it goes") in err, err



@pytest.mark.parametrize("what", ["a file", "a file's child"])
def test_kafka_local_with_a_jar_cache_that_cannot_be_a_folder_says_so_in_one_line(tmp_path: Path, what: str) -> None:
    """`harness kafka-local --cache-dir notes.txt`: "unexpected error: NotADirectoryError: [Errno 20]
    Not a directory: 'notes.txt/kafka-4.1.1'", as a bug; now one line naming the option."""
    a_file = tmp_path / "notes.txt"
    a_file.write_text("")
    cache = a_file if what == "a file" else a_file / "cache"
    out = harness("kafka-local", "--cache-dir", str(cache), "--data-dir", str(tmp_path / "d"))
    assert out.returncode == 1
    assert one_line(out) == f"kafka-local: cannot use {cache} as the jar cache (not a directory): give another --cache-dir"
