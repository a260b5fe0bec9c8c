"""Fault tests of the worker service: real ``harness worker`` processes on a real broker,
killed (SIGKILL), frozen (SIGSTOP), stopped (SIGTERM), with the broker restarted under
them. Each test ends by checking, from a fresh read of the whole log and the fake payment
provider, that every session settled once and every side effect happened once.

The sessions run ``tests/apps/fleet.py``: checkout (two durable steps, an app record),
notify (replay="never"), nap (step.sleep) and approve (step.ask, answered by the test
through ``HarnessClient`` as soon as ``harness.ask.opened`` commits).
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import random
import signal
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from datetime import timedelta
from pathlib import Path

import confluent_kafka  # noqa: F401 - the dev extra has it; never skipped
import pytest

from harness.client import HarnessClient
from harness.log.kafka.log import KafkaLog
from harness.log.kafka.partitioner import partition_for
from harness.records import AskOpened, InputSettled, LogEntry, ToolResult, TurnResumed, TurnStarted
from harness.runtime.group import SESSION_TIMEOUT_MS
from harness.testing.kafka_local import LocalKafka
from harness.testing.payments import FakePaymentProvider
from tests.integration.fleet_helpers import (
    FLEET_HARNESS,
    REPO,
    Fleet,
    LogFollower,
    Plan,
    check_invariants,
    read_everything,
    submit,
    wait_until,
)

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

PARTITIONS = 6
APPROVE = {"approved": True}
SETTLE_TIMEOUT = 150.0


def kafka_url(bootstrap: str, prefix: str, partitions: int = PARTITIONS) -> str:
    return f"kafka://{bootstrap}?topic_prefix={prefix}&partitions={partitions}"


@contextlib.asynccontextmanager
async def kafka_client(bootstrap: str, prefix: str, partitions: int = PARTITIONS) -> AsyncIterator[HarnessClient]:
    # The topics exist before any worker joins (a client never creates them).
    async with KafkaLog(bootstrap=bootstrap, topic_prefix=prefix, partitions=partitions) as creator:
        await creator.start()
    client = HarnessClient(bootstrap=bootstrap, topic_prefix=prefix)  # reads the partition count
    try:
        await client.log.start()
        assert client.log.settings.partitions == partitions  # type: ignore[attr-defined]
        yield client
    finally:
        await client.close()


@pytest.fixture
def provider(tmp_path: Path) -> Path:
    path = tmp_path / "payments.db"
    FakePaymentProvider(path)  # creates the tables the invariants read
    return path


@pytest.fixture
def make_fleet(tmp_path: Path, provider: Path) -> Iterator[Callable[..., Fleet]]:
    fleets: list[Fleet] = []

    def make(log_url: str, **kw: object) -> Fleet:
        fleet = Fleet(log_url=log_url, workdir=tmp_path, provider=provider, **kw)  # type: ignore[arg-type]
        fleets.append(fleet)
        return fleet

    yield make
    for fleet in fleets:
        fleet.cleanup()


def sessions_on(partitions: set[int], count: int, stem: str, *, inside: bool = True) -> list[str]:
    """``count`` session ids whose partition is (or, ``inside=False``, is not) in ``partitions``."""
    out, i = [], 0
    while len(out) < count:
        sid = f"{stem}-{i}"
        if (partition_for(sid, PARTITIONS) in partitions) == inside:
            out.append(sid)
        i += 1
    return out


def settled_ok(follower: LogFollower, ids: list[str]) -> Callable[[], str]:
    return lambda: f"unsettled: {follower.unsettled(ids)}"


# --------------------------------------------------------------------------- 1. SIGKILL


async def test_sigkill_workers_every_session_settles_once(
    kafka_bootstrap: str, unique_prefix: str, provider: Path, make_fleet: Callable[..., Fleet]
) -> None:
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    print(f"seed={seed}")
    fleet = make_fleet(kafka_url(kafka_bootstrap, unique_prefix))
    plans = [Plan(f"kill-{i}", order=str(i), nap=float(1 + i % 3), ask=i % 4 == 0) for i in range(40)]
    ids = [p.session_id for p in plans]
    waves = [plans[i : i + 10] for i in range(0, 40, 10)]
    async with kafka_client(kafka_bootstrap, unique_prefix) as client, LogFollower(client, answer=APPROVE) as follower:
        first = [fleet.start() for _ in range(3)]
        await fleet.wait_ready(*first)
        kills: list[str] = []
        for n, wave in enumerate(waves):
            await submit(client, wave)
            if n == len(waves) - 1:
                break
            # A random moment: after a random number of records since this wave went in.
            target = follower.count + rng.randint(15, 150)
            await wait_until(lambda t=target: follower.count >= t, timeout=60, what=f"{target} records")
            owners = [w for w in fleet.live if w.owned_partitions()] or fleet.live
            victim = rng.choice(owners)
            kills.append(f"{victim.name} (partitions {sorted(victim.owned_partitions())}) after {target} records")
            victim.kill()
            fleet.start()  # the replacement
        await wait_until(
            lambda: follower.all_settled(ids), timeout=SETTLE_TIMEOUT, what="every session settled",
            details=lambda: f"{settled_ok(follower, ids)()}\n{fleet.describe()}",
        )
        counts = check_invariants(await read_everything(client), plans, provider, details=lambda: fleet.describe(400))
        print(f"kills: {kills}; {counts}")
        for worker in fleet.live:
            assert worker.terminate() == 0, worker.describe()


# --------------------------------------------------------------------------- 2. SIGSTOP


async def test_sigstop_zombie_is_fenced_and_gives_up(
    kafka_bootstrap: str, unique_prefix: str, provider: Path, make_fleet: Callable[..., Fleet]
) -> None:
    fleet = make_fleet(kafka_url(kafka_bootstrap, unique_prefix))
    async with kafka_client(kafka_bootstrap, unique_prefix) as client, LogFollower(client, answer=APPROVE) as follower:
        zombie, survivor = fleet.start(), fleet.start()
        await fleet.wait_ready(zombie, survivor)
        await fleet.wait_partitions_spread([zombie, survivor], PARTITIONS)
        zombie_parts = zombie.owned_partitions()
        on_zombie = sessions_on(zombie_parts, 6, "zombie")
        elsewhere = sessions_on(zombie_parts, 4, "other", inside=False)
        plans = [Plan(sid, order=sid, nap=4.0, ask=i % 2 == 0) for i, sid in enumerate(on_zombie + elsewhere)]
        await submit(client, plans)

        # Freeze the owner while every one of its sessions is inside a tool call.
        await wait_until(lambda: all(follower.napping(s) for s in on_zombie), timeout=60,
                         what="the zombie's sessions napping", details=fleet.describe)
        zombie.send(signal.SIGSTOP)
        gave_up_before = zombie.gave_up_count()
        # The group moves its partitions; the survivor fences it and takes the turns over.
        await wait_until(lambda: zombie_parts <= survivor.owned_partitions(), timeout=60,
                         what="the survivor owning the zombie's partitions", details=fleet.describe)
        await wait_until(lambda: all(follower.resumed(s) for s in on_zombie), timeout=60,
                         what="turn.resumed in every session of the zombie", details=fleet.describe)
        # New sessions of the zombie's partitions arrive while it is frozen; they are in
        # the middle of a tool call (the survivor drives them) when it wakes up.
        fresh = [Plan(sid, order=sid, nap=6.0) for sid in sessions_on(zombie_parts, 6, "fresh")]
        await submit(client, fresh)
        await wait_until(lambda: all(follower.napping(p.session_id) for p in fresh), timeout=60,
                         what="the new sessions napping", details=fleet.describe)
        plans += fresh

        # Wake the zombie while new inputs arrive for its former sessions: its due naps
        # finish and try to write, its tail sees the inputs. It must write nothing.
        zombie.send(signal.SIGCONT)
        await submit(client, plans[: len(on_zombie)], input_id="in-2")
        await wait_until(lambda: zombie.gave_up_count() > gave_up_before, timeout=60,
                         what="the zombie giving up its partitions", details=fleet.describe)
        assert zombie.alive, zombie.describe()
        assert zombie.lost_count() >= 1, zombie.describe()

        await wait_until(
            lambda: follower.all_settled(s.session_id for s in plans)
            and follower.all_settled(on_zombie, "in-2"),
            timeout=SETTLE_TIMEOUT, what="every input settled", details=fleet.describe,
        )
        everything = await read_everything(client)
        counts = check_invariants(everything, plans, provider, details=lambda: fleet.describe(400))
        for sid in on_zombie:
            second = [e.record for e in everything[sid]
                      if isinstance(e.record, InputSettled) and e.record.input_id == "in-2"]
            assert [s.outcome for s in second] == ["completed"], (sid, second)
            assert sum(isinstance(e.record, TurnStarted) for e in everything[sid]) == 2, sid
        # The zombie never fenced the survivor back (it writes again only when the group
        # assigns it partitions again).
        assert "owner writer of partition" not in survivor.stderr(), survivor.describe()
        print(f"zombie partitions {sorted(zombie_parts)}; {counts}")
        assert zombie.terminate() == 0, zombie.describe()
        assert survivor.terminate() == 0, survivor.describe()


# --------------------------------------------------------------------------- 3. SIGTERM


async def test_sigterm_hand_over_is_fast(
    kafka_bootstrap: str, unique_prefix: str, provider: Path, make_fleet: Callable[..., Fleet]
) -> None:
    fleet = make_fleet(kafka_url(kafka_bootstrap, unique_prefix))
    async with kafka_client(kafka_bootstrap, unique_prefix) as client, LogFollower(client, answer=APPROVE) as follower:
        leaving, survivor = fleet.start(), fleet.start()
        await fleet.wait_ready(leaving, survivor)
        await fleet.wait_partitions_spread([leaving, survivor], PARTITIONS)
        parts = leaving.owned_partitions()
        on_leaving = sessions_on(parts, 6, "term")
        plans = [Plan(sid, order=sid, nap=3.0, ask=i % 3 == 0)
                 for i, sid in enumerate(on_leaving + sessions_on(parts, 4, "stay", inside=False))]
        await submit(client, plans)
        await wait_until(lambda: all(follower.napping(s) for s in on_leaving), timeout=60,
                         what="the leaving worker's sessions napping", details=fleet.describe)

        terminated_at = time.time()
        assert leaving.terminate() == 0, leaving.describe()
        # It stopped its sessions without writing and handed every partition back.
        assert all(f"gave up partition {p}" in leaving.stderr() for p in parts), leaving.describe()

        await wait_until(lambda: all(follower.resumed(s) for s in on_leaving), timeout=60,
                         what="the survivor resuming every turn", details=fleet.describe)
        first_resume = min(r.ts for s in on_leaving for _seq, r in follower.resumed(s)) / 1000
        await wait_until(lambda: follower.all_settled(p.session_id for p in plans), timeout=SETTLE_TIMEOUT,
                         what="every session settled", details=fleet.describe)
        assert parts <= survivor.owned_partitions()
        counts = check_invariants(await read_everything(client), plans, provider, details=lambda: fleet.describe(400))
        print(
            f"SIGTERM -> first harness.turn.resumed by the survivor: {first_resume - terminated_at:.2f}s "
            f"(group session timeout {SESSION_TIMEOUT_MS / 1000:.0f}s); {counts}"
        )
        assert survivor.terminate() == 0, survivor.describe()


# --------------------------------------------------------------------------- 4. broker restart


async def test_broker_restart_mid_run(
    unique_prefix: str, provider: Path, make_fleet: Callable[..., Fleet], tmp_path: Path
) -> None:
    broker = LocalKafka(data_dir=tmp_path / "broker")
    await asyncio.to_thread(broker.start)
    try:
        await asyncio.to_thread(broker.warm_up_transactions)
        bootstrap = broker.bootstrap
        fleet = make_fleet(kafka_url(bootstrap, unique_prefix))
        plans = [Plan(f"restart-{i}", order=str(i), nap=float(1 + i % 2), ask=i % 3 == 0) for i in range(16)]
        ids = [p.session_id for p in plans]
        async with kafka_client(bootstrap, unique_prefix) as client, LogFollower(client, answer=APPROVE) as follower:
            workers = [fleet.start(), fleet.start()]
            await fleet.wait_ready(*workers)
            await submit(client, plans)
            await wait_until(lambda: sum(follower.napping(s) for s in ids) >= 4, timeout=60,
                             what="sessions in flight", details=fleet.describe)
            restart_started = time.time()
            await asyncio.to_thread(broker.restart)
            print(f"broker restarted in {time.time() - restart_started:.1f}s")
            await wait_until(lambda: follower.all_settled(ids), timeout=SETTLE_TIMEOUT, what="every session settled",
                             details=lambda: f"{settled_ok(follower, ids)()}\n{fleet.describe()}")
            counts = check_invariants(await read_everything(client), plans, provider, details=lambda: fleet.describe(400))
            print(counts)
            for worker in workers:
                assert worker.alive, worker.describe()
                assert worker.terminate() == 0, worker.describe()
    finally:
        await asyncio.to_thread(broker.close)


# --------------------------------------------------------------------------- 5, 6: one worker, shared


@pytest.fixture(scope="module")
def one_worker(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """One fleet worker on its own topics; yields (bootstrap, topic prefix)."""
    workdir = tmp_path_factory.mktemp("one-worker")
    prefix = f"t{uuid.uuid4().hex[:10]}"
    provider = workdir / "payments.db"
    FakePaymentProvider(provider)
    fleet = Fleet(log_url=kafka_url(kafka_bootstrap, prefix), workdir=workdir, provider=provider)
    try:
        worker = fleet.start()
        fleet.wait_ready_sync(worker)
        yield kafka_bootstrap, prefix
        assert worker.terminate() == 0, worker.describe()
    finally:
        fleet.cleanup()


def produce_foreign_input(bootstrap: str, topic: str, session_id: str, input_id: str, text: str, harness: str) -> bytes:
    """What a service in another language does: plain confluent-kafka + fastavro + the .avsc.

    No harness import here on purpose: the schemas and schemas/README.md are the contract.
    """
    import fastavro
    from confluent_kafka import Producer

    schema = json.loads((REPO / "schemas" / "harness.input.message.avsc").read_text())
    canonical = fastavro.schema.to_parsing_canonical_form(schema)
    # fastavro gives the CRC-64-AVRO fingerprint as hex of its bytes in little-endian
    # order, which is the order single-object encoding wants (checked against a golden vector).
    fingerprint = bytes.fromhex(fastavro.schema.fingerprint(canonical, "CRC-64-AVRO"))
    body = io.BytesIO()
    fastavro.schemaless_writer(
        body,
        fastavro.parse_schema(schema),
        {"session_id": session_id, "ts": int(time.time() * 1000), "input_id": input_id, "text": text,
         "harness": harness},
    )
    value = b"\xc3\x01" + fingerprint + body.getvalue()
    producer = Producer({"bootstrap.servers": bootstrap, "partitioner": "murmur2_random", "enable.idempotence": True})
    producer.produce(topic, key=session_id.encode(), value=value, headers=[("harness.type", b"harness.input.message")])
    assert producer.flush(30) == 0, "the foreign input was not delivered"
    return value


async def test_foreign_producer_input_settles(one_worker: tuple[str, str]) -> None:
    bootstrap, prefix = one_worker
    golden = (REPO / "tests" / "golden" / "harness.input.message.bin").read_bytes()
    value = await asyncio.to_thread(
        produce_foreign_input, bootstrap, f"{prefix}.sessions", "foreign-1", "in-1", "order=foreign-1", FLEET_HARNESS
    )
    assert value[:10] == golden[:10], "framing differs from the golden vector"
    async with HarnessClient(bootstrap=bootstrap, topic_prefix=prefix, partitions=PARTITIONS) as client:
        settled = await client.wait_settled("foreign-1", "in-1", timeout=60)
        assert (settled.outcome, settled.code) == ("completed", None), settled
        results = [e.record async for e in _until_settled(client, "foreign-1") if isinstance(e.record, ToolResult)]
        assert sorted(r.tool_call_id for r in results) == ["checkout", "notify"]


async def _until_settled(client: HarnessClient, session_id: str, input_id: str = "in-1") -> AsyncIterator[LogEntry]:
    async with asyncio.timeout(60):
        async for entry in client.events(session_id):
            yield entry
            if isinstance(entry.record, InputSettled) and entry.record.input_id == input_id:
                return


async def test_unknown_harness_is_rejected(one_worker: tuple[str, str]) -> None:
    bootstrap, prefix = one_worker
    async with HarnessClient(bootstrap=bootstrap, topic_prefix=prefix, partitions=PARTITIONS) as client:
        await client.send("nobody-1", "hello", harness="tests/nobody", input_id="in-1")
        settled = await client.wait_settled("nobody-1", "in-1", timeout=60)
        assert (settled.outcome, settled.code) == ("rejected", "unknown_harness"), settled


async def test_invalid_answer_is_rejected_and_tool_keeps_waiting(one_worker: tuple[str, str]) -> None:
    bootstrap, prefix = one_worker
    sid = "asker-1"
    async with HarnessClient(bootstrap=bootstrap, topic_prefix=prefix, partitions=PARTITIONS) as client:
        await client.send(sid, "ask=yes", harness=FLEET_HARNESS, input_id="in-1")
        async with asyncio.timeout(60):
            async for entry in client.events(sid):
                if isinstance(entry.record, AskOpened):
                    ask = entry.record
                    break
        await client.answer(sid, ask.tool_call_id, ask.name, {"approved": "maybe"}, input_id="ans-bad")
        bad = await client.wait_settled(sid, "ans-bad", timeout=60)
        assert (bad.outcome, bad.code) == ("rejected", "invalid_answer"), bad
        log = await client.log.read(sid)
        assert not any(isinstance(e.record, ToolResult) for e in log), "the tool stopped waiting"
        assert not any(isinstance(e.record, InputSettled) and e.record.input_id == "in-1" for e in log)

        await client.answer(sid, ask.tool_call_id, ask.name, APPROVE, input_id="ans-good")
        settled = await client.wait_settled(sid, "in-1", timeout=60)
        assert settled.outcome == "completed", settled
        results = [e.record for e in await client.log.read(sid) if isinstance(e.record, ToolResult)]
        assert [(r.tool_call_id, r.content) for r in results] == [("approve", {"approved": True})]


# --------------------------------------------------------------------------- 7. attempts


async def test_attempts_exhausted(
    kafka_bootstrap: str, unique_prefix: str, make_fleet: Callable[..., Fleet]
) -> None:
    from tests.apps.crashy import MAX_ATTEMPTS

    # Static membership: a restarted worker with the same instance id gets the partition
    # back at once instead of after the dead member's session timeout.
    fleet = make_fleet(kafka_url(kafka_bootstrap, unique_prefix, 1), apps=["tests.apps.crashy:crashy"])
    sid = "crashy-1"
    async with kafka_client(kafka_bootstrap, unique_prefix, 1) as client, LogFollower(client) as follower:
        await client.send(sid, "go", harness="tests/crashy", input_id="in-1")
        deaths = 0
        for _life in range(MAX_ATTEMPTS + 3):
            worker = fleet.start("--instance-id", "crashy-0")
            await wait_until(lambda w=worker: not w.alive or follower.settled(sid) is not None, timeout=90,
                             what="the worker dying or the input settling", details=fleet.describe)
            if follower.settled(sid) is not None:
                break
            assert worker.proc.returncode == -signal.SIGKILL, worker.describe()
            deaths += 1
        settled = follower.settled(sid)
        assert settled is not None, fleet.describe()
        assert (settled.outcome, settled.code) == ("failed", "attempts_exhausted"), settled
        assert deaths == MAX_ATTEMPTS
        assert len(follower.records(sid, TurnResumed)) == MAX_ATTEMPTS
        assert not follower.records(sid, ToolResult)
        assert worker.terminate() == 0, worker.describe()


# --------------------------------------------------------------------------- the log under a zombie


async def test_fenced_owner_never_takes_its_partition_back(kafka_bootstrap: str, unique_prefix: str) -> None:
    """A worker whose partition producer was fenced (a zombie) must not start a new one
    from a session claim: that would fence the partition's real owner back (found by the
    SIGSTOP test: the real owner's sessions were dropped and never finished)."""
    from harness.errors import FencedError
    from harness.log.kafka.log import KafkaLog
    from harness.records import StepResult

    zombie = KafkaLog(bootstrap=kafka_bootstrap, topic_prefix=unique_prefix, partitions=PARTITIONS)
    owner = KafkaLog(bootstrap=kafka_bootstrap, topic_prefix=unique_prefix, partitions=PARTITIONS)
    try:
        a, b = sessions_on({0}, 2, "z")
        lease = timedelta(seconds=30)
        await zombie.own_partition(0)
        await owner.own_partition(0)  # the group moved partition 0: the old owner is fenced
        with pytest.raises(FencedError):
            await (await zombie.claim(a, owner="zombie", lease=lease)).append([StepResult(a, 1, "c", "s1", 1)])
        with pytest.raises(FencedError):
            await zombie.claim(b, owner="zombie", lease=lease)  # no new producer: the owner stays
        writer = await owner.claim(b, owner="owner", lease=lease)
        await writer.append([StepResult(b, 1, "c", "s1", 1)])
        assert [e.record.name for e in await owner.read(b)] == ["s1"]
    finally:
        await zombie.close()
        await owner.close()


async def test_a_worker_log_claims_only_partitions_the_group_gave_it(kafka_bootstrap: str, unique_prefix: str) -> None:
    """Once a worker owns partitions (``own_partition``), no claim starts a producer of its
    own: a session of a partition it was not given, or gave up, is refused. (A stopped
    partition runtime restarting a session after the partition was revoked would
    otherwise fence the partition's new owner.)"""
    from harness.errors import FencedError
    from harness.records import StepResult

    log = KafkaLog(bootstrap=kafka_bootstrap, topic_prefix=unique_prefix, partitions=PARTITIONS)
    try:
        mine, theirs = sessions_on({0}, 1, "m")[0], sessions_on({1}, 1, "t")[0]
        lease = timedelta(seconds=30)
        await log.own_partition(0)
        writer = await log.claim(mine, owner="w", lease=lease)
        await writer.append([StepResult(mine, 1, "c", "s1", 1)])
        with pytest.raises(FencedError, match="not owned by this worker"):
            await log.claim(theirs, owner="w", lease=lease)
        await log.disown_partition(0)  # revoked
        with pytest.raises(FencedError, match="not owned by this worker"):
            await log.claim(mine, owner="w", lease=lease)
        assert log.stats.snapshot()["producers_started"] == 1
    finally:
        await log.close()


async def test_a_worker_fenced_by_another_writer_takes_its_partition_up_again(
    kafka_bootstrap: str, unique_prefix: str, provider: Path, make_fleet: Callable[..., Fleet]
) -> None:
    """Another process's producer fences a live worker's partition (a HarnessHost on the
    same topics, or a zombie before it heard it lost the partition) while the group still
    gives the partition to the worker: the worker takes it up again from the log once
    ``RETAKE_GRACE_S`` passed, and its sessions finish. A partition never stalls."""
    fleet = make_fleet(kafka_url(kafka_bootstrap, unique_prefix))
    async with kafka_client(kafka_bootstrap, unique_prefix) as client, LogFollower(client, answer=APPROVE) as follower:
        worker = fleet.start()
        await fleet.wait_ready(worker)
        await fleet.wait_partitions_spread([worker], PARTITIONS)
        first, later = sessions_on({0}, 2, "fenced")
        await submit(client, [Plan(first, order=first)])
        await wait_until(lambda: follower.all_settled([first]), timeout=60, what="the first session settled",
                         details=fleet.describe)

        intruder = KafkaLog(bootstrap=kafka_bootstrap, topic_prefix=unique_prefix, partitions=PARTITIONS)
        try:  # its claim starts a producer of partition 0: init_transactions fences the worker's
            writer = await intruder.claim(later, owner="intruder", lease=timedelta(seconds=30))
            await writer.release()
        finally:
            await intruder.close()

        plans = [Plan(later, order=later)]
        await submit(client, plans)  # the worker's first append for it finds its producer fenced
        await wait_until(lambda: follower.all_settled([later]), timeout=60, what="the session settled",
                         details=fleet.describe)
        check_invariants(await read_everything(client), [Plan(first, order=first), *plans], provider,
                         details=lambda: fleet.describe(400))
        assert "taking it up again from the log" in worker.stderr(), worker.describe()
        assert worker.terminate() == 0, worker.describe()


async def test_a_cancelled_claim_does_not_break_other_claims(kafka_bootstrap: str, unique_prefix: str) -> None:
    """Claims of one partition share its producer's start; cancelling one of them (a
    session stopped while it claims) must not cancel the start for the others."""
    from harness.log.kafka.log import KafkaLog
    from harness.records import StepResult

    log = KafkaLog(bootstrap=kafka_bootstrap, topic_prefix=unique_prefix, partitions=PARTITIONS)
    try:
        await log.start()
        a, b = sessions_on({1}, 2, "c")
        lease = timedelta(seconds=30)
        first = asyncio.create_task(log.claim(a, owner="w", lease=lease))
        second = asyncio.create_task(log.claim(b, owner="w", lease=lease))
        await asyncio.sleep(0)  # both wait for the partition's producer to start
        first.cancel()
        writer = await second
        await writer.append([StepResult(b, 1, "c", "s1", 1)])
        again = await log.claim(a, owner="w", lease=lease)
        await again.append([StepResult(a, 1, "c", "s1", 1)])
        assert [e.record.session_id for e in await log.read_partition(1, 0)] == [b, a]
    finally:
        await log.close()


# --------------------------------------------------------------------------- a duplicate instance id


async def test_a_worker_whose_instance_id_another_takes_exits_saying_so(
    kafka_bootstrap: str, unique_prefix: str, make_fleet: Callable[..., Fleet]
) -> None:
    """Two workers given one --instance-id: the broker fences the first (a fatal error that
    librdkafka hands to poll() as _FATAL, whose fatal() is False); it went on as a zombie,
    never restarted by Kubernetes. Now it exits, saying why in one line."""
    fleet = make_fleet(kafka_url(kafka_bootstrap, unique_prefix, 2))
    first = fleet.start("--instance-id", "twin-0")
    fleet.wait_ready_sync(first, timeout=90)
    second = fleet.start("--instance-id", "twin-0")
    await wait_until(lambda: not first.alive, timeout=90, what="the fenced worker to exit", details=fleet.describe)
    assert first.proc.returncode not in (0, None), first.describe()
    last = first.stderr().strip().splitlines()[-1]
    assert "another worker joined the group with this worker's --instance-id" in last, first.describe()
    fleet.wait_ready_sync(second, timeout=90)
    assert second.alive
