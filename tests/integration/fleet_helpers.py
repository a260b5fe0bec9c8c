"""Helpers for the worker fault tests: worker processes, a log follower that answers
asks, session plans, and the invariants every fault test checks at the end.

Nothing here sleeps to wait for a condition: :func:`wait_until` polls a predicate
with a deadline and fails with a description of what it was waiting for.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.client import HarnessClient
from harness.errors import LogError
from harness.records import (
    AppRecord,
    AskOpened,
    InputSettled,
    LogEntry,
    SleepScheduled,
    StepResult,
    ToolResult,
    TurnFinished,
    TurnResumed,
)
from harness.testing.payments import FakePaymentProvider

REPO = Path(__file__).resolve().parents[2]
FLEET_APP = "tests.apps.fleet:fleet"
FLEET_HARNESS = "tests/fleet"
POLL_S = 0.1
RETRY_S = 0.3
"""Back-off between attempts of an operation that failed while the broker was away."""


# --------------------------------------------------------------------------- waiting


async def wait_until(
    predicate: Callable[[], bool | Awaitable[bool]],
    *,
    timeout: float,
    what: str,
    details: Callable[[], str] | None = None,
) -> None:
    """Poll ``predicate`` every ``POLL_S`` until it holds; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if asyncio.iscoroutine(value) or isinstance(value, Awaitable):
            value = await value
        if value:
            return
        if time.monotonic() >= deadline:
            extra = f"\n{details()}" if details is not None else ""
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}{extra}")
        await asyncio.sleep(POLL_S)


# --------------------------------------------------------------------------- workers

_OWNING = re.compile(r"owning partition (\d+):")
_GAVE_UP = re.compile(r"gave up partition (\d+)")
_LOST = re.compile(r"partitions \[[^\]]*\] were lost")


def worker_env(provider: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    env["HARNESS_TEST_PROVIDER"] = str(provider)
    env["PYTHONUNBUFFERED"] = "1"
    env.pop("HARNESS_LOG", None)
    env.pop("HARNESS_APPS", None)
    return env


class WorkerProcess:
    """One ``harness worker`` process; stdout and stderr go to files in ``workdir``."""

    def __init__(
        self, *, name: str, log_url: str, apps: Iterable[str], env: dict[str, str], workdir: Path,
        extra_args: Iterable[str] = (),
    ) -> None:
        self.name = name
        self.stdout_path = workdir / f"{name}.out"
        self.stderr_path = workdir / f"{name}.err"
        argv = [sys.executable, "-m", "harness.cli", "worker", "--log", log_url]
        for app in apps:
            argv += ["--app", app]
        argv += list(extra_args)
        with open(self.stdout_path, "wb") as out, open(self.stderr_path, "wb") as err:
            self.proc = subprocess.Popen(argv, stdout=out, stderr=err, stdin=subprocess.DEVNULL, env=env, cwd=REPO)
        self.started_at = time.time()

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def stdout(self) -> str:
        return self.stdout_path.read_text(errors="replace")

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    @property
    def ready(self) -> bool:
        return "worker ready" in self.stdout()

    def owned_partitions(self) -> set[int]:
        """The partitions this worker owns now, from its log lines (in order)."""
        owned: set[int] = set()
        for line in self.stderr().splitlines():
            if m := _OWNING.search(line):
                owned.add(int(m.group(1)))
            elif m := _GAVE_UP.search(line):
                owned.discard(int(m.group(1)))
        return owned

    def gave_up_count(self) -> int:
        return len(_GAVE_UP.findall(self.stderr()))

    def lost_count(self) -> int:
        return len(_LOST.findall(self.stderr()))

    def send(self, sig: int) -> None:
        if self.alive:
            os.kill(self.pid, sig)

    def kill(self) -> int:
        """SIGKILL (no clean-up of any kind) and reap."""
        self.send(signal.SIGKILL)
        return self.proc.wait(30)

    def terminate(self, timeout: float = 60.0) -> int:
        """SIGTERM and wait for the exit code."""
        self.send(signal.SIGTERM)
        return self.proc.wait(timeout)

    def describe(self, lines: int = 25) -> str:
        tail = "\n".join(self.stderr().splitlines()[-lines:])
        return f"--- worker {self.name} pid={self.pid} rc={self.proc.poll()} stderr tail:\n{tail}"

    def cleanup(self) -> None:
        if self.alive:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGCONT)
                os.kill(self.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(30)


class Fleet:
    """The worker processes of one test (all killed at the end of it)."""

    def __init__(self, *, log_url: str, workdir: Path, provider: Path, apps: Iterable[str] = (FLEET_APP,)) -> None:
        self.log_url = log_url
        self.workdir = workdir
        self.env = worker_env(provider)
        self.apps = list(apps)
        self.workers: list[WorkerProcess] = []

    def start(self, *extra_args: str) -> WorkerProcess:
        worker = WorkerProcess(
            name=f"w{len(self.workers)}", log_url=self.log_url, apps=self.apps, env=self.env,
            workdir=self.workdir, extra_args=extra_args,
        )
        self.workers.append(worker)
        return worker

    @property
    def live(self) -> list[WorkerProcess]:
        return [w for w in self.workers if w.alive]

    def describe(self, lines: int = 25) -> str:
        return "\n".join(w.describe(lines) for w in self.workers)

    async def wait_ready(self, *workers: WorkerProcess, timeout: float = 60.0) -> None:
        def check() -> bool:
            for w in workers:
                if not w.alive:
                    raise AssertionError(f"worker {w.name} died before it was ready\n{w.describe()}")
            return all(w.ready for w in workers)

        await wait_until(check, timeout=timeout, what="workers ready", details=self.describe)

    def wait_ready_sync(self, *workers: WorkerProcess, timeout: float = 60.0) -> None:
        """``wait_ready`` for code outside an event loop (module fixtures)."""
        deadline = time.monotonic() + timeout
        while not all(w.ready for w in workers):
            dead = [w for w in workers if not w.alive]
            if dead or time.monotonic() >= deadline:
                raise AssertionError(f"workers not ready\n{self.describe()}")
            time.sleep(POLL_S)

    async def wait_partitions_spread(self, workers: list[WorkerProcess], partitions: int, timeout: float = 60.0) -> None:
        """Until ``workers`` own every partition between them, each some, none twice."""

        def check() -> bool:
            owned = [w.owned_partitions() for w in workers]
            union: set[int] = set().union(*owned)
            return all(owned) and union == set(range(partitions)) and sum(map(len, owned)) == partitions

        await wait_until(check, timeout=timeout, what="partitions spread over the workers", details=self.describe)

    def cleanup(self) -> None:
        for worker in self.workers:
            worker.cleanup()


# --------------------------------------------------------------------------- sessions


@dataclass(frozen=True)
class Plan:
    """What one session's first message asks the fleet app to do."""

    session_id: str
    order: str | None = None
    nap: float | None = None
    ask: bool = False

    @property
    def text(self) -> str:
        parts = []
        if self.order is not None:
            parts.append(f"order={self.order}")
        if self.nap is not None:
            parts.append(f"nap={self.nap:g}")
        if self.ask:
            parts.append("ask=yes")
        return " ".join(parts)

    @property
    def tool_calls(self) -> set[str]:
        calls = {"checkout", "notify"} if self.order is not None else set()
        if self.nap is not None:
            calls.add("nap")
        if self.ask:
            calls.add("approve")
        return calls


async def retrying(op: Callable[[], Awaitable[Any]], *, timeout: float = 60.0) -> Any:
    """``op()`` again while the log is unavailable (a broker restart), up to ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return await op()
        except LogError:
            if time.monotonic() >= deadline:
                raise
            await asyncio.sleep(RETRY_S)


async def submit(client: HarnessClient, plans: Iterable[Plan], *, input_id: str = "in-1") -> None:
    for plan in plans:
        await retrying(lambda plan=plan: client.send(plan.session_id, plan.text, harness=FLEET_HARNESS,
                                                     input_id=input_id))


class LogFollower:
    """Follows every committed record of the log, in the background.

    Keeps the records per session and answers each ``harness.ask.opened`` with
    ``answer`` through the client (``None``: asks are left open). Survives broker
    restarts: a failed tail is reopened where it stopped.
    """

    def __init__(
        self, client: HarnessClient, *, answer: Any = None, partitions: int | None = None
    ) -> None:
        self.client = client
        self.answer = answer
        self.partitions = partitions
        self.by_session: dict[str, list[LogEntry]] = defaultdict(list)
        self.count = 0
        self.answered: set[tuple[str, str, str]] = set()
        self._tasks: list[asyncio.Task[None]] = []
        self._side: set[asyncio.Task[Any]] = set()

    async def __aenter__(self) -> LogFollower:
        log = self.client.log
        if hasattr(log, "tail_partition"):
            parts = self.partitions if self.partitions is not None else log.settings.partitions  # type: ignore[attr-defined]
            self._tasks = [asyncio.create_task(self._tail(p)) for p in range(parts)]
        else:
            self._tasks = [asyncio.create_task(self._poll())]
        return self

    async def __aexit__(self, *exc: object) -> None:
        for task in [*self._tasks, *self._side]:
            task.cancel()
        for task in [*self._tasks, *self._side]:
            with contextlib.suppress(BaseException):
                await task

    async def _tail(self, partition: int) -> None:
        position = 0
        while True:
            try:
                async for entry in self.client.log.tail_partition(partition, position):  # type: ignore[attr-defined]
                    position = entry.seq
                    self._add(entry)
            except LogError:
                await asyncio.sleep(RETRY_S)

    async def _poll(self) -> None:
        position = 0
        while True:
            try:
                entries = await self.client.log.read_all(after=position)  # type: ignore[attr-defined]
            except LogError:
                entries = []
            for entry in entries:
                position = max(position, entry.seq)
                self._add(entry)
            if not entries:
                await asyncio.sleep(POLL_S)

    def _add(self, entry: LogEntry) -> None:
        self.by_session[entry.session_id].append(entry)
        self.count += 1
        r = entry.record
        if isinstance(r, AskOpened) and self.answer is not None:
            key = (r.session_id, r.tool_call_id, r.name)
            self.answered.add(key)
            task = asyncio.create_task(
                retrying(lambda: self.client.answer(r.session_id, r.tool_call_id, r.name, self.answer))
            )
            self._side.add(task)
            task.add_done_callback(self._side.discard)

    # -- queries ---------------------------------------------------------------------------

    def records(self, session_id: str, kind: type) -> list[Any]:
        return [e.record for e in self.by_session.get(session_id, []) if isinstance(e.record, kind)]

    def settled(self, session_id: str, input_id: str = "in-1") -> InputSettled | None:
        for r in self.records(session_id, InputSettled):
            if r.input_id == input_id:
                return r  # type: ignore[no-any-return]
        return None

    def all_settled(self, session_ids: Iterable[str], input_id: str = "in-1") -> bool:
        return all(self.settled(s, input_id) is not None for s in session_ids)

    def unsettled(self, session_ids: Iterable[str], input_id: str = "in-1") -> list[str]:
        return [s for s in session_ids if self.settled(s, input_id) is None]

    def napping(self, session_id: str) -> bool:
        """The session's nap is scheduled and has no result yet (a tool call in flight)."""
        slept = any(r.tool_call_id == "nap" for r in self.records(session_id, SleepScheduled))
        done = any(r.tool_call_id == "nap" for r in self.records(session_id, ToolResult))
        return slept and not done

    def resumed(self, session_id: str) -> list[tuple[int, TurnResumed]]:
        return [(e.seq, e.record) for e in self.by_session.get(session_id, []) if isinstance(e.record, TurnResumed)]


# --------------------------------------------------------------------------- invariants


async def read_everything(client: HarnessClient) -> dict[str, list[LogEntry]]:
    """Every committed record of the log, per session, read afresh (not from a follower)."""
    log: Any = client.log
    out: dict[str, list[LogEntry]] = defaultdict(list)
    if hasattr(log, "read_partition"):
        for p in range(log.settings.partitions):
            for entry in await retrying(lambda p=p: log.read_partition(p, 0)):
                out[entry.session_id].append(entry)
    else:
        for entry in await log.read_all():
            out[entry.session_id].append(entry)
    return out


def _provider_rows(provider: Path, kind: str) -> list[dict[str, Any]]:
    db = sqlite3.connect(provider, timeout=30)
    try:
        return [json.loads(r[0]) for r in db.execute("SELECT request FROM effects WHERE kind=?", (kind,))]
    finally:
        db.close()


def _key_session(key: str) -> str:
    """The session of an idempotency key ``<prefix>/<session>:<tool call>:<step>``."""
    log_id = key.split(":", 1)[0]
    return log_id.split("/", 1)[1] if "/" in log_id else log_id


def check_invariants(
    by_session: dict[str, list[LogEntry]],
    plans: Iterable[Plan],
    provider: Path,
    *,
    input_id: str = "in-1",
    details: Callable[[], str] | None = None,
) -> dict[str, int]:
    """Assert that every planned session settled once and every effect happened once.

    Returns a few counts (turns resumed, calls cut) for the test to print.
    """
    plans = list(plans)
    problems: list[str] = []
    owners: dict[str, int] = {}  # session -> owners of its first turn (the one with the tools)
    resumed = cut = 0
    for plan in plans:
        entries = by_session.get(plan.session_id, [])
        records = [e.record for e in entries]
        settled = [r for r in records if isinstance(r, InputSettled) and r.input_id == input_id]
        if len(settled) != 1:
            problems.append(f"{plan.session_id}: {input_id} settled {len(settled)} times: {settled}")
        elif settled[0].outcome != "completed":
            problems.append(f"{plan.session_id}: {input_id} settled {settled[0]}")
        results = Counter(r.tool_call_id for r in records if isinstance(r, ToolResult))
        twice = {k: n for k, n in results.items() if n > 1}
        if twice:
            problems.append(f"{plan.session_id}: tool calls with two results: {twice}")
        if settled and set(results) != plan.tool_calls:
            problems.append(f"{plan.session_id}: results for {sorted(results)}, expected {sorted(plan.tool_calls)}")
        steps = Counter((r.tool_call_id, r.name) for r in records if isinstance(r, StepResult))
        twice_steps = {k: n for k, n in steps.items() if n > 1}
        if twice_steps:
            problems.append(f"{plan.session_id}: steps with two results: {twice_steps}")
        finished = Counter(r.turn for r in records if isinstance(r, TurnFinished))
        if any(n > 1 for n in finished.values()):
            problems.append(f"{plan.session_id}: a turn finished twice: {finished}")
        paid = [r for r in records if isinstance(r, AppRecord) and r.record_type == "order.paid"]
        if plan.order is not None and len(paid) != 1:
            problems.append(f"{plan.session_id}: {len(paid)} order.paid records")
        for r in records:
            if isinstance(r, ToolResult) and r.tool_call_id == "checkout" and r.is_error:
                problems.append(f"{plan.session_id}: checkout failed: {r.content}")
            if isinstance(r, ToolResult) and r.is_error and r.code == "cut":
                cut += 1
        resumed += sum(isinstance(r, TurnResumed) for r in records)
        owners[plan.session_id] = 1 + sum(isinstance(r, TurnResumed) and r.turn == 1 for r in records)

    orders = [p.order for p in plans if p.order is not None]
    charged = Counter(r["order_id"] for r in _provider_rows(provider, "charge"))
    if charged != Counter(orders):
        extra = {k: v for k, v in charged.items() if v != 1 or k not in orders}
        missing = [o for o in orders if o not in charged]
        problems.append(f"charges per order wrong: doubled/unknown {extra}, missing {missing}")
    invoiced = Counter(r["charge_id"] for r in _provider_rows(provider, "invoice"))
    if len(invoiced) != len(orders) or any(n != 1 for n in invoiced.values()):
        problems.append(f"invoices: {len(invoiced)} for {len(orders)} orders: {invoiced}")
    payments = FakePaymentProvider(provider)
    # A step's fn runs at most once per owner of its turn: the first, and one per takeover
    # (a zombie's fn may still run once after it was fenced; its attempt is already
    # counted). Partitions can move more than once (a zombie that wakes up rejoins the
    # group and the rebalance may hand its partitions back), so the limit comes from the
    # log. A replay="never" call runs at most once, whoever owns it.
    for kind in ("charge", "invoice", "notify"):
        for key, n in payments.calls_per_key(kind).items():
            limit = 1 if kind == "notify" else owners.get(_key_session(key), 1)
            if n > limit:
                problems.append(f"a {kind} key was called {n} times (limit {limit}: the owners of its turn): {key}")
    assert not problems, "invariants broken:\n" + "\n".join(problems) + (f"\n{details()}" if details else "")
    return {"turns_resumed": resumed, "calls_cut": cut, "notify_calls": payments.calls("notify")}
