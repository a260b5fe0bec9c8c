"""A worker's hand-over drains (``harness worker``, real processes, SQLite and Kafka):
on SIGTERM, and on Kafka when the group moves a partition to another worker, a running
tool call goes on to its result instead of being cut, nothing new starts, and what is
still running at ``--drain-timeout`` is cut and recovered by the next owner.

The sessions say ``ship``: a ``replay="never"`` tool whose one step holds until the test
releases it (``tests/apps/cli_app.py``). A ``never`` call cut mid-step ends with the
``cut`` error at its next owner; drained, it ends with its real result, run once.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.cli_helpers import HARNESS, Backend, backend_params, make_backend, wait_until


@pytest.fixture(params=backend_params)
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    yield from make_backend(request, request.param, tmp_path, partitions=2)


@pytest.fixture
def gate(backend: Backend, tmp_path: Path) -> Path:
    folder = tmp_path / "gate"
    folder.mkdir()
    backend.env["HARNESS_TEST_GATE_DIR"] = str(folder)
    return folder


def timeline(backend: Backend, session: str) -> list[dict[str, Any]]:
    return list(backend.json("show", session)["timeline"])


def kinds(items: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [i for i in items if i["kind"] == kind]


def send(backend: Backend, session: str, text: str) -> None:
    out = backend.cli("send", session, text, "--harness", HARNESS, "--no-wait", "--input-id", "in-1")
    assert out.returncode == 0, out.stderr


def shipped(gate: Path, session: str) -> int:
    path = gate / f"shipped-{session}"
    return len(path.read_text().splitlines()) if path.exists() else 0


async def test_sigterm_lets_a_running_never_tool_finish_and_starts_nothing_new(backend: Backend, gate: Path) -> None:
    first = backend.worker("--drain-timeout", "120")
    await backend.ready(first)
    send(backend, "drained", "ship")
    await wait_until(lambda: (gate / "ship-enter-drained").exists(), timeout=60, what="the ship step running",
                     details=first.describe)

    first.send(signal.SIGTERM)
    await wait_until(lambda: "draining 1 running session(s)" in first.stderr(), timeout=60,
                     what="the worker draining", details=first.describe)
    send(backend, "late", "order=9")  # comes in during the drain: not started here
    assert first.alive, "the drain waits for the running step"
    (gate / "ship-release-drained").write_text("")
    assert first.proc.wait(60) == 0, first.describe()
    err = first.stderr()
    assert "drained in" in err and "cut" not in err, err

    items = timeline(backend, "drained")
    [result] = kinds(items, "tool.result")
    assert not result["error"] and result["code"] is None, result  # its real result, written by the draining worker
    assert kinds(items, "turn.finished") == [], "the model's next call is the next owner's"
    assert kinds(timeline(backend, "late"), "turn.started") == [], "nothing new starts while draining"

    second = backend.worker()
    await backend.ready(second)
    for session in ("drained", "late"):
        await wait_until(lambda s=session: kinds(timeline(backend, s), "turn.finished"), timeout=60,
                         what=f"{session} finished by the next worker", details=second.describe)
    items = timeline(backend, "drained")
    [finished] = kinds(items, "turn.finished")
    assert finished["status"] == "completed" and '"shipped": "drained"' in (finished["text"] or ""), finished
    assert [r["error"] for r in kinds(items, "tool.result")] == [False]
    assert shipped(gate, "drained") == 1
    assert second.terminate() == 0, second.describe()


async def test_a_drain_that_times_out_cuts_the_call_and_the_next_owner_recovers_it(
    backend: Backend, gate: Path
) -> None:
    first = backend.worker("--drain-timeout", "0.5")
    await backend.ready(first)
    send(backend, "stuck", "ship")
    await wait_until(lambda: (gate / "ship-enter-stuck").exists(), timeout=60, what="the ship step running",
                     details=first.describe)
    assert first.terminate() == 0, first.describe()
    assert "drain timed out after 0.5 s: 1 session(s) still running are cut (stuck)" in first.stderr()
    assert kinds(timeline(backend, "stuck"), "tool.result") == []  # nothing of the cut step was written

    (gate / "ship-release-stuck").write_text("")  # (the first process is gone: nothing more ships)
    second = backend.worker()
    await backend.ready(second)
    await wait_until(lambda: kinds(timeline(backend, "stuck"), "turn.finished"), timeout=60,
                     what="the turn finished by the next worker", details=second.describe)
    [result] = kinds(timeline(backend, "stuck"), "tool.result")
    assert result["error"] and result["code"] == "cut", result  # replay="never": not run again
    assert shipped(gate, "stuck") == 0
    assert second.terminate() == 0, second.describe()


@pytest.mark.kafka
@pytest.mark.parametrize("backend", ["kafka"], indirect=True)
async def test_a_partition_moved_to_a_new_worker_is_drained_first(backend: Backend, gate: Path) -> None:
    from harness.log.kafka.partitioner import partition_for

    sessions = {partition_for(f"moved-{i}", 2): f"moved-{i}" for i in range(20)}
    assert sorted(sessions) == [0, 1]
    first = backend.worker("--drain-timeout", "120")
    await backend.ready(first)
    await wait_until(lambda: first.owned_partitions() == {0, 1}, timeout=60, what="one worker owning both",
                     details=first.describe)
    for session in sessions.values():
        send(backend, session, "ship")
    await wait_until(lambda: all((gate / f"ship-enter-{s}").exists() for s in sessions.values()), timeout=60,
                     what="both ship steps running", details=first.describe)

    second = backend.worker()  # the group gives it one of the partitions: the first drains it
    await wait_until(lambda: "partitions revoked" in first.stderr(), timeout=60, what="a partition revoked",
                     details=first.describe)
    [moved] = [p for p in sessions if f"(partitions {p}): draining 1 running session(s)" in first.stderr()]
    assert first.owned_partitions() == {0, 1}, "a draining partition is not given up before its call ends"
    for session in sessions.values():
        (gate / f"ship-release-{session}").write_text("")
    await wait_until(lambda: second.owned_partitions() == {moved}, timeout=60, what="the partition moved",
                     details=lambda: first.describe() + "\n" + second.describe())
    for session in sessions.values():
        await wait_until(lambda s=session: kinds(timeline(backend, s), "turn.finished"), timeout=60,
                         what=f"{session} finished", details=lambda: first.describe() + "\n" + second.describe())
        items = timeline(backend, session)
        assert [(r["error"], r["code"]) for r in kinds(items, "tool.result")] == [(False, None)], items
        assert kinds(items, "turn.finished")[0]["status"] == "completed"
        assert shipped(gate, session) == 1
    assert "drain timed out" not in first.stderr()
    assert second.terminate() == 0 and first.terminate() == 0


async def test_a_second_sigterm_ends_the_drain_at_once(backend: Backend, gate: Path) -> None:
    worker = backend.worker("--drain-timeout", "600")
    await backend.ready(worker)
    send(backend, "impatient", "ship")
    await wait_until(lambda: (gate / "ship-enter-impatient").exists(), timeout=60, what="the ship step running",
                     details=worker.describe)
    worker.send(signal.SIGTERM)
    await wait_until(lambda: "draining 1 running session(s)" in worker.stderr(), timeout=60,
                     what="the worker draining", details=worker.describe)
    assert worker.terminate() == 0, worker.describe()  # the second one: no 600 s wait
    err = worker.stderr()
    assert "a second stop signal: ending the drain now" in err
    assert "drain cut short after" in err and "1 session(s) still running are cut (impatient)" in err, err
    assert kinds(timeline(backend, "impatient"), "tool.result") == []


async def test_a_stopped_worker_does_not_wait_for_a_cut_sync_step_on_its_thread(backend: Backend, gate: Path) -> None:
    """A thread cannot be stopped: without leaving at once, the process would stay until the
    step's code ends (and do a side effect nobody records after saying it stopped)."""
    worker = backend.worker("--drain-timeout", "0.5")
    await backend.ready(worker)
    send(backend, "blocking", "syncship")
    await wait_until(lambda: (gate / "ship-enter-blocking").exists(), timeout=60, what="the sync step running",
                     details=worker.describe)
    assert worker.terminate() == 0, worker.describe()  # the step never ends: it does not wait for it
    err = worker.stderr()
    assert "1 sync call(s) (a step function or a sync tool) cut by the stop still run on threads" in err, err
    (gate / "ship-release-blocking").write_text("")
    second = backend.worker()
    await backend.ready(second)
    await wait_until(lambda: kinds(timeline(backend, "blocking"), "turn.finished"), timeout=60,
                     what="the turn finished by the next worker", details=second.describe)
    assert shipped(gate, "blocking") == 0  # the first process is gone; replay="never": cut, not run again
    assert second.terminate() == 0, second.describe()
