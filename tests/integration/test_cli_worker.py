"""``harness worker`` as a deployable process, on SQLite and on Kafka: ``--max-sessions``,
``--app`` found from the current folder, its log lines (turns, takeovers, fencing, a lease
wait said once), and its settings errors."""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.cli_helpers import HARNESS, Backend, backend_params, cli_env, make_backend, wait_until
from tests.integration.fleet_helpers import REPO


@pytest.fixture(params=backend_params)
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    # One partition on Kafka: "in order" is the order of the log.
    yield from make_backend(request, request.param, tmp_path, partitions=1)


def exists(folder: Path, name: str) -> bool:
    return (folder / name).exists()


# --- --max-sessions -------------------------------------------------------------------------------


async def test_max_sessions_runs_at_most_n_and_the_rest_wait_in_order(backend: Backend, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    gate.mkdir()
    backend.env["HARNESS_TEST_GATE_DIR"] = str(gate)
    worker = backend.worker("--max-sessions", "2")
    await backend.ready(worker)
    if backend.name == "kafka":  # a new prefix is a new log: said once, in case the prefix has a typo
        assert ".sessions on 127.0.0.1:" in worker.stderr() and (
            "a new, empty session log of 1 partition(s); if you expected sessions there, check the topic prefix"
        ) in worker.stderr(), worker.describe()
    names = ["a", "b", "c", "d"]
    for name in names:
        out = backend.cli("send", name, "hold", "--harness", HARNESS, "--no-wait", "--input-id", f"in-{name}")
        assert out.returncode == 0, out.stderr

    def entered() -> set[str]:
        return {n for n in names if exists(gate, f"enter-{n}")}

    await wait_until(lambda: entered() == {"a", "b"}, timeout=60, what="a and b running", details=worker.describe)
    await wait_until(lambda: "session d waits for a slot" in worker.stderr(), timeout=60,
                     what="c and d queued", details=worker.describe)
    assert "session c waits for a slot: 2 sessions running (max_sessions 2)" in worker.stderr()
    assert entered() == {"a", "b"}, "c and d must wait"
    (gate / "release-a").write_text("")
    await wait_until(lambda: "c" in entered(), timeout=60, what="c to start", details=worker.describe)
    assert entered() == {"a", "b", "c"}, "d waits behind c (first come, first served)"
    (gate / "release-b").write_text("")
    await wait_until(lambda: "d" in entered(), timeout=60, what="d to start", details=worker.describe)
    for name in ("c", "d"):
        (gate / f"release-{name}").write_text("")
    for name in names:
        await wait_until(lambda name=name: backend.cli("send", name, "hold", "--input-id", f"in-{name}").returncode == 0,
                         timeout=60, what=f"{name} settled")
    assert worker.terminate() == 0, worker.describe()


# --- --app from the current folder ---------------------------------------------------------------------


CWD_APP = '''
from harness import define_harness
from harness.models import ModelResponse, ScriptedModel

here = define_harness(name="tests/cwd", model=ScriptedModel([ModelResponse(text="found from the current folder")]),
                      tools=[])
'''


async def test_app_module_is_found_from_the_current_folder(backend: Backend, tmp_path: Path) -> None:
    app_dir = tmp_path / "app"
    app_dir.mkdir()
    (app_dir / "cwdapp.py").write_text(CWD_APP)
    (app_dir / "services").mkdir()  # a user's own 'services' package never shadows the worker
    (app_dir / "services" / "__init__.py").write_text("raise ImportError('the user services package')\n")
    # -P: like the installed `harness` script, nothing puts the current folder on sys.path.
    argv = [sys.executable, "-P", "-m", "harness", "worker", "--log", backend.url, "--app", "cwdapp:here"]
    out_path, err_path = tmp_path / "w.out", tmp_path / "w.err"
    with open(out_path, "w") as out, open(err_path, "w") as err:
        proc = subprocess.Popen(argv, cwd=app_dir, env=cli_env(), stdout=out, stderr=err, stdin=subprocess.DEVNULL)
    try:
        await wait_until(lambda: "worker ready" in out_path.read_text() or proc.poll() is not None, timeout=90,
                         what="the worker", details=err_path.read_text)
        assert proc.poll() is None, err_path.read_text()
        sent = backend.cli("send", "cwd-1", "hello", "--harness", "tests/cwd")
        assert sent.returncode == 0 and sent.stdout.strip() == "found from the current folder", sent.stderr
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


# --- log lines: turns, takeovers, fencing, a lease wait --------------------------------------------------


async def test_kafka_takeover_is_logged_by_the_new_owner(kafka_bootstrap: str, unique_prefix: str,
                                                         tmp_path: Path, request: pytest.FixtureRequest) -> None:
    backend = next(make_backend(request, "kafka", tmp_path, partitions=1))
    gate = tmp_path / "gate"
    gate.mkdir()
    backend.env["HARNESS_TEST_GATE_DIR"] = str(gate)
    try:
        first = backend.worker()
        await backend.ready(first)
        assert backend.cli("send", "k-1", "hold", "--harness", HARNESS, "--no-wait", "--input-id", "in-1").returncode == 0
        await wait_until(lambda: exists(gate, "enter-k-1"), timeout=60, what="the tool to run")
        assert re.search(r"INFO harness\.session turn 1 of session k-1 started \(input in-1\) \[session=k-1 input=in-1\]",
                         first.stderr()), first.stderr()
        first.kill()
        (gate / "enter-k-1").unlink()
        second = backend.worker()
        await wait_until(lambda: exists(gate, "enter-k-1"), timeout=90, what="the new owner to run the tool again",
                         details=second.describe)
        (gate / "release-k-1").write_text("")
        await wait_until(lambda: "took over turn 1 of session k-1 (attempt 2)" in second.stderr(), timeout=60,
                         what="the takeover line", details=second.describe)
        await wait_until(lambda: "turn 1 of session k-1 completed" in second.stderr(), timeout=60,
                         what="the turn to finish", details=second.describe)
        assert re.search(r"INFO harness\.worker owning partition 0:", second.stderr())
        assert second.terminate() == 0
    finally:
        backend.cleanup()


async def test_sqlite_lease_wait_takeover_and_fencing_are_logged_once(tmp_path: Path,
                                                                      request: pytest.FixtureRequest) -> None:
    backend = next(make_backend(request, "sqlite", tmp_path))
    gate = tmp_path / "gate"
    gate.mkdir()
    backend.env["HARNESS_TEST_GATE_DIR"] = str(gate)
    try:
        first = backend.worker("--lease", "3")
        await backend.ready(first)
        assert backend.cli("send", "s-1", "hold", "--harness", HARNESS, "--no-wait", "--input-id", "in-1").returncode == 0
        await wait_until(lambda: exists(gate, "enter-s-1"), timeout=60, what="the tool to run")
        first.send(signal.SIGSTOP)  # a zombie: alive, silent, holding a lease that runs out
        (gate / "enter-s-1").unlink()
        second = backend.worker("--lease", "3")
        await wait_until(lambda: exists(gate, "enter-s-1"), timeout=60, what="the second worker to take over",
                         details=second.describe)
        (gate / "release-s-1").write_text("")
        await wait_until(lambda: "turn 1 of session s-1 completed" in second.stderr(), timeout=60,
                         what="the turn to finish", details=second.describe)
        waits = re.findall(r"waiting for the lease of session s-1, held by (\S+) until (\d\d:\d\d:\d\d) \((\d+) s\)",
                           second.stderr())
        assert len(waits) == 1, second.stderr()  # said once, not at every retry
        assert waits[0][0].startswith("worker:") and f":{first.pid}:" in waits[0][0]
        assert int(waits[0][2]) <= 3
        assert "took over turn 1 of session s-1 (attempt 2)" in second.stderr()
        assert "SessionBusy" not in second.stderr()
        first.send(signal.SIGCONT)
        await wait_until(lambda: "session s-1 was fenced" in first.stderr(), timeout=60,
                         what="the zombie to find out", details=first.describe)
        assert re.search(r"INFO harness\.session session s-1 was fenced", first.stderr())
        for w in (first, second):
            assert w.terminate() == 0, w.describe()
    finally:
        backend.cleanup()


# --- settings errors: one line, exit 2 -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "env", "expected"),
    [
        (["--app", "tests.apps.cli_app:assistant", "--secrets-dir", "/no/such/folder"], {},
         "--secrets-dir /no/such/folder: no such folder"),
        (["--app", "tests.apps.cli_app:assistant", "--max-sessions", "0"], {}, "--max-sessions takes a whole number >= 1"),
        (["--app", "tests.apps.cli_app:assistant"], {"HARNESS_MAX_SESSIONS": "many"},
         "HARNESS_MAX_SESSIONS takes a whole number >= 1, not 'many'"),
        (["--app", "tests.apps.cli_app:assistant"], {"HARNESS_LOG_FORMAT": "xml"},
         "HARNESS_LOG_FORMAT takes one of text, json, not 'xml'"),
        (["--app", "tests.apps.cli_app:assistant", "--log-level", "loud"], {}, "unknown log level 'loud'"),
        # (the variable was named as the flag: "--log-level: unknown log level 'loud'", a flag nobody gave)
        (["--app", "tests.apps.cli_app:assistant"], {"HARNESS_LOG_LEVEL": "loud"},
         "harness worker: HARNESS_LOG_LEVEL: unknown log level 'loud'"),
        ([], {}, "no harness to run: give --app module:attribute (or set HARNESS_APPS)"),
        (["--app", "tests.apps.cli_app"], {}, "--app takes module:attribute"),
        (["--app", "tests.apps.cli_app:assistant", "--lease", "-1"], {}, "--lease takes a number of seconds > 0"),
        (["--app", "tests.apps.cli_app:assistant", "--sync-threads", "0"], {}, "--sync-threads takes a whole number >= 1"),
        (["--app", "tests.apps.cli_app:assistant"], {"HARNESS_SYNC_THREADS": "x"},
         "HARNESS_SYNC_THREADS takes a whole number >= 1, not 'x'"),
        (["--app", "tests.apps.cli_app:assistant", "--cpu-policy", "fast"], {},
         "--cpu-policy takes one of batch, normal, not 'fast'"),
        (["--app", "tests.apps.cli_app:assistant"], {"HARNESS_CPU_POLICY": "realtime"},
         "HARNESS_CPU_POLICY takes one of batch, normal, not 'realtime'"),
    ],
)
def test_worker_settings_errors_are_one_line(backend: Backend, tmp_path: Path, args: list[str],
                                             env: dict[str, str], expected: str) -> None:
    out = backend.cli("worker", *args, env=env)
    assert out.returncode == 2, (out.returncode, out.stderr)
    assert expected in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and "Traceback" not in out.stderr


@pytest.mark.parametrize("where", ["relative", "absolute"])
def test_an_app_given_as_a_file_outside_the_current_folder_says_to_run_from_its_folder(
    backend: Backend, tmp_path: Path, where: str
) -> None:
    """`--app ../app/myapp.py:assistant` suggested `--app ...app.myapp:assistant` and an absolute
    path `tmp.nu3.app.myapp:assistant`: neither is a module name the worker can import."""
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "myapp.py").write_text("")
    (tmp_path / "elsewhere").mkdir()
    path = "../app/myapp.py" if where == "relative" else str(tmp_path / "app" / "myapp.py")
    out = backend.cli("worker", "--app", f"{path}:assistant", cwd=tmp_path / "elsewhere")
    assert out.returncode == 2, out.stderr
    folder = tmp_path / "app"
    assert out.stderr.strip() == (
        f"harness worker: --app {path}:assistant: {path!r} is a file path; --app takes a module name: "
        f"cd {folder} and use --app myapp:assistant (or set PYTHONPATH={folder})"
    )


def test_a_secret_given_twice_is_refused(backend: Backend, tmp_path: Path) -> None:
    folder = tmp_path / "secrets"
    folder.mkdir()
    (folder / "api_key").write_text("a")
    out = backend.cli("worker", "--app", "tests.apps.cli_app:assistant", "--secrets-dir", str(folder),
                      env={"HARNESS_SECRET_API_KEY": "b"})
    assert out.returncode == 2 and "secret 'api_key' is given twice" in out.stderr


def publish_secret(folder: Path, version: str, api_key: str) -> None:
    """A Secret's version as the kubelet publishes it: a timestamped folder, ``..data``
    swapped to it in one rename, the key a link through ``..data``."""
    (folder / f"..{version}").mkdir(parents=True)
    (folder / f"..{version}" / "api_key").write_text(api_key + "\n")
    (folder / "..data_tmp").symlink_to(f"..{version}")
    (folder / "..data_tmp").replace(folder / "..data")
    if not (folder / "api_key").is_symlink():
        (folder / "api_key").symlink_to("..data/api_key")


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
async def test_a_rotated_secret_reaches_new_sessions_without_a_restart(backend: Backend, tmp_path: Path) -> None:
    first, second = "sk_live_FIRST_0001", "sk_live_SECOND_0002"
    folder = tmp_path / "secrets"
    publish_secret(folder, "2026_01_01_v1", first)
    worker = backend.worker("--secrets-dir", str(folder), "--secrets-recheck", "0.2")
    await backend.ready(worker)

    def key_digest(session: str) -> str:
        out = backend.cli("send", session, "secret", "--harness", HARNESS)
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout[len("done: "):])["api_key_sha256"]

    assert key_digest("before") == digest(first)
    publish_secret(folder, "2026_01_02_v2", second)
    sessions = iter(range(1000))
    await wait_until(lambda: key_digest(f"after-{next(sessions)}") == digest(second), timeout=30,
                     what="a new session to get the rotated secret", details=worker.describe)
    assert f"the secrets in {folder} changed (api_key)" in worker.stderr()
    assert first not in worker.stderr() + worker.stdout() and second not in worker.stderr() + worker.stdout()


def digest(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()[:16]


def test_worker_settings_come_from_the_environment(backend: Backend, tmp_path: Path) -> None:
    env = {"HARNESS_LOG": backend.url, "HARNESS_APPS": "tests.apps.cli_app:nothing"}
    out = subprocess.run([sys.executable, "-m", "harness", "worker"], capture_output=True, text=True, timeout=60,
                         env=cli_env(env), cwd=REPO, check=False)
    assert out.returncode == 2
    assert out.stderr.strip() == (
        "harness worker: --app tests.apps.cli_app:nothing: module 'tests.apps.cli_app' has no attribute "
        "'nothing'; harnesses in tests.apps.cli_app: assistant"
    )


@pytest.mark.kafka
@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"HARNESS_KAFKA_CONFIG_ENABLE_IDEMPOTENCE": "false"}, "client_config may not set enable.idempotence"),
        ({"HARNESS_KAFKA_CONFIG_NO_SUCH_SETTING": "1"}, 'No such configuration property: "no.such.setting"'),
    ],
)
def test_kafka_client_settings_come_from_the_environment(kafka_bootstrap: str, unique_prefix: str,
                                                        env: dict[str, str], expected: str) -> None:
    url = f"kafka://{kafka_bootstrap}?topic_prefix={unique_prefix}"
    for command in (["worker", "--app", "tests.apps.cli_app:assistant"], ["sessions"]):
        out = subprocess.run([sys.executable, "-m", "harness", *command, "--log", url], capture_output=True,
                             text=True, timeout=60, env=cli_env(env), cwd=REPO, check=False)
        assert out.returncode == 2, out.stderr
        assert expected in out.stderr and len(out.stderr.strip().splitlines()) == 1


async def test_worker_runs_with_log_level_debug(backend: Backend) -> None:
    worker = backend.worker("--log-level", "DEBUG")
    await backend.ready(worker)
    assert backend.cli("send", "dbg-1", "hi", "--harness", HARNESS).returncode == 0
    assert " DEBUG " in worker.stderr(), worker.stderr()
    assert worker.terminate() == 0, worker.describe()
    assert "Traceback" not in worker.stderr()


# --- the CPU policy ---------------------------------------------------------------------------------


def _policies(pid: int) -> set[int]:
    return {os.sched_getscheduler(int(tid)) for tid in os.listdir(f"/proc/{pid}/task")}


@pytest.mark.skipif(not hasattr(os, "SCHED_BATCH"), reason="SCHED_BATCH is Linux only")
async def test_every_worker_thread_runs_batch_unless_told_normal(backend: Backend) -> None:
    """By default every thread of a worker (the loop, the log's threads, librdkafka's) is
    SCHED_BATCH, so one thread waking another does not preempt it; ``--cpu-policy normal``
    (or HARNESS_CPU_POLICY) keeps the default policy. Either way it runs turns."""
    # One after the other: on one partition a second worker of the group would own nothing.
    for n, (env, policy) in enumerate([({}, os.SCHED_BATCH), ({"HARNESS_CPU_POLICY": "normal"}, os.SCHED_OTHER)]):
        worker = backend.worker(env=env)
        await backend.ready(worker)
        sent = backend.cli("send", f"cpu-{n}", "hello", "--harness", HARNESS)
        assert sent.returncode == 0, sent.stderr
        assert _policies(worker.pid) == {policy}, worker.describe()
        assert len(os.listdir(f"/proc/{worker.pid}/task")) > 2  # the log's threads too, not only the main one
        assert worker.terminate() == 0, worker.describe()
