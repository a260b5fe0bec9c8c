"""PartitionRuntime: routing of committed records, new sessions without a scan,
ended sessions read back when they return, checkpoints."""

from __future__ import annotations

import asyncio

import pytest

from harness import HarnessHost, define_harness
from harness.log.base import Checkpoint, CheckpointWritten
from harness.log.memory import MemoryLog
from harness.models import ModelResponse, ScriptedModel
from harness.records import InputMessage, InputSettled
from harness.runtime import partition
from harness.runtime.partition import PartitionRuntime


class CountingLog(MemoryLog):
    def __init__(self) -> None:
        super().__init__()
        self.session_reads: list[str] = []

    async def read(self, session_id, *, after=None):
        self.session_reads.append(session_id)
        return await super().read(session_id, after=after)

    async def scan(self, session_id=None, *, after=None, limit=None):  # (how a runtime reads a whole session)
        if session_id is not None and not after:  # (a handle's catch-up reads after what it folded)
            self.session_reads.append(session_id)
        return await super().scan(session_id, after=after, limit=limit)


def _harness():
    return define_harness(name="echo", model=ScriptedModel(lambda m: ModelResponse(text="hi")), tools=[])


async def _settled(log: MemoryLog, sid: str, input_id: str) -> bool:
    return any(isinstance(e.record, InputSettled) and e.record.input_id == input_id for e in await log.read(sid))


async def _drain(rt: PartitionRuntime, log: CountingLog) -> None:
    """Feed the runtime what the log committed after its position, as a tail would."""
    for _ in range(50):
        entries = [e for e in await MemoryLog.read_all(log) if e.seq > rt.position]
        if not entries:
            for s in rt.sessions.values():
                if s.busy:
                    break
            else:
                return
        await rt.ingest(entries)
        await asyncio.sleep(0)


async def test_new_session_is_started_without_reading_the_log() -> None:
    log = CountingLog()
    host = HarnessHost(log=log)
    rt = PartitionRuntime(host=host, harnesses={"echo": _harness()})
    await rt.go_live()
    entry = await log.submit(InputMessage("new", 0, "in-1", "hello", "echo"))
    await rt.ingest([entry])
    await _drain(rt, log)
    assert log.session_reads == []  # its first records came from the tail: no scan for a new session
    assert await _settled(log, "new", "in-1")
    await rt.stop()


@pytest.mark.parametrize("remembered", [True, False])
async def test_ended_session_that_comes_back_has_its_whole_history(
    remembered: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not remembered:
        monkeypatch.setattr(partition, "RECENT_ENDED", 0)  # forgotten: read back from the log
    log = CountingLog()
    host = HarnessHost(log=log)
    rt = PartitionRuntime(host=host, harnesses={"echo": _harness()})
    await rt.go_live()
    await rt.ingest([await log.submit(InputMessage("s", 0, "in-1", "one", "echo"))])
    await _drain(rt, log)
    assert rt.forget_idle() == 1
    assert rt.checkpoint().ended == {"s": 1}  # its id and first position
    log.session_reads.clear()
    await rt.ingest([await log.submit(InputMessage("s", 0, "in-2", "two", "echo"))])
    await _drain(rt, log)
    assert log.session_reads == ([] if remembered else ["s"])
    assert await _settled(log, "s", "in-2")
    state = rt.sessions["s"].state
    assert len(state.turns) == 2  # the first turn is in its state
    await rt.stop()


async def test_checkpoints_carry_only_the_ended_sessions_the_last_one_did_not_seal() -> None:
    """A checkpoint's ``unsealed``: what ended since the last checkpoint's parts; a session
    that ends again (a chat's next turn) is not named twice: its first position stays."""
    log = CountingLog()
    rt = PartitionRuntime(host=HarnessHost(log=log), harnesses={"echo": _harness()})
    await rt.go_live()

    async def turn(sid: str, input_id: str) -> None:
        await rt.ingest([await log.submit(InputMessage(sid, 0, input_id, "hi", "echo"))])
        await _drain(rt, log)
        rt.forget_idle()

    await turn("a", "in-1")
    await turn("b", "in-1")
    first = rt.checkpoint()
    assert first.unsealed == (("a", 1), ("b", 6)) and first.directory == ()  # (5 records a turn)
    await turn("c", "in-1")  # ends while the checkpoint is written
    rt.checkpoint_written(CheckpointWritten(directory=(("part-1", 40),), sealed=2))
    second = rt.checkpoint()
    assert second.directory == (("part-1", 40),) and [sid for sid, _ in second.unsealed or ()] == ["c"]
    await turn("a", "in-2")  # comes back and ends again
    assert [sid for sid, _ in rt.checkpoint().unsealed or ()] == ["c"]
    assert rt.checkpoint().ended["a"] == 1
    rt.checkpoint_written(CheckpointWritten(directory=(("part-1", 40),), sealed=0))  # nothing sealed
    assert [sid for sid, _ in rt.checkpoint().unsealed or ()] == ["c"]
    await rt.stop()


async def test_a_runtime_started_from_a_checkpoint_goes_on_from_its_directory() -> None:
    log = CountingLog()
    rt = PartitionRuntime(host=HarnessHost(log=log), harnesses={"echo": _harness()})
    rt.load_checkpoint(Checkpoint(covers=0, sessions={}, ended={"old": 3, "older": 1},
                                  directory=(("p0", 7),), unsealed=(("old", 3),)))
    await rt.go_live()
    await rt.ingest([await log.submit(InputMessage("new", 0, "in-1", "hi", "echo"))])
    await _drain(rt, log)
    rt.forget_idle()
    cp = rt.checkpoint()
    assert cp.directory == (("p0", 7),) and cp.unsealed == (("old", 3), ("new", 1))
    assert dict(cp.ended) == {"old": 3, "older": 1, "new": 1}
    await rt.stop()


async def test_unknown_harness_settles_rejected_and_warns_of_a_mixed_group(caplog) -> None:
    log = CountingLog()
    rt = PartitionRuntime(host=HarnessHost(log=log), harnesses={"echo": _harness()})
    await rt.go_live()
    with caplog.at_level("WARNING", logger="harness"):
        await rt.ingest([await log.submit(InputMessage("x", 0, "in-1", "hello", "nobody"))])
    settled = [e.record for e in await log.read("x") if isinstance(e.record, InputSettled)]
    assert [(s.outcome, s.code) for s in settled] == [("rejected", "unknown_harness")]
    # (two apps on one topic prefix split its sessions between them: an operator must see it)
    assert "no harness named 'nobody' runs here (this worker runs echo)" in caplog.text
    assert "every worker on one topic prefix must run the same --app list" in caplog.text


async def test_checkpoint_must_come_first() -> None:
    log = CountingLog()
    rt = PartitionRuntime(host=HarnessHost(log=log), harnesses={})
    rt.rebuild([await log.submit(InputMessage("x", 0, "in-1", "hello", "echo"))])
    with pytest.raises(RuntimeError):
        rt.load_checkpoint(rt.checkpoint())


async def test_worker_takes_a_session_back_after_another_process_released_it() -> None:
    from harness.runtime.worker import Worker

    log = CountingLog()
    app_host = HarnessHost(log=log)
    handle = await app_host.open(_harness(), session_id="x")
    assert (await handle.send("one", input_id="in-1")).outcome == "completed"  # the app owns "x"
    worker = Worker(log=log, harnesses=[_harness()])
    stop = asyncio.Event()
    run = asyncio.create_task(worker.run(stop))
    await worker.ready.wait()
    await log.submit(InputMessage("x", 0, "in-2", "two", "echo"))  # either owner may take it
    for _ in range(2000):
        if await _settled(log, "x", "in-2"):
            break
        await asyncio.sleep(0.005)
    await app_host.close()  # the app lets go of the session
    await log.submit(InputMessage("x", 0, "in-3", "three", "echo"))
    for _ in range(2000):
        if await _settled(log, "x", "in-3"):
            break
        await asyncio.sleep(0.005)
    stop.set()
    await run
    assert await _settled(log, "x", "in-2") and await _settled(log, "x", "in-3")


class _Sealed:
    """A log entry whose body must not be decoded (reading ``record`` fails the test)."""

    def __init__(self, seq: int, session_id: str) -> None:
        self.seq = seq
        self.session_id = session_id

    @property
    def record(self):  # type: ignore[no-untyped-def]
        raise AssertionError(f"record {self.seq} was decoded again")


async def test_a_sessions_own_appends_coming_back_are_not_decoded_again() -> None:
    log = CountingLog()
    rt = PartitionRuntime(host=HarnessHost(log=log), harnesses={"echo": _harness()})
    await rt.go_live()
    await rt.ingest([await log.submit(InputMessage("x", 0, "in-1", "hello", "echo"))])
    session = rt.sessions["x"]
    for _ in range(200):
        if await _settled(log, "x", "in-1") and not session.busy:
            break
        await asyncio.sleep(0)
    own = [e for e in await log.read("x") if not e.record.IS_INPUT]
    assert own and all(session.state.folded(e.seq) for e in own)
    await session.ingest([_Sealed(e.seq, "x") for e in own])  # type: ignore[list-item]
    assert session.state.read_upto == own[-1].seq
    # A new input after them is read (and taken) as ever.
    await session.ingest([await log.submit(InputMessage("x", 0, "in-2", "again", "echo"))])
    for _ in range(200):
        if await _settled(log, "x", "in-2"):
            break
        await asyncio.sleep(0)
    assert await _settled(log, "x", "in-2")
    await rt.stop()


class _FailingClaims(CountingLog):
    """A log whose claims fail as a broker outage would (the session stops, to be retried)."""

    def __init__(self) -> None:
        super().__init__()
        self.claims = 0

    async def claim(self, session_id, *, owner, lease):  # type: ignore[no-untyped-def]
        from harness.errors import LogUnavailable

        self.claims += 1
        raise LogUnavailable("the broker is down")

    async def read(self, session_id, *, after=None):  # type: ignore[no-untyped-def]
        await asyncio.sleep(0.01)  # a real read waits for the broker: others run meanwhile
        return await super().read(session_id, after=after)

    async def scan(self, session_id=None, *, after=None, limit=None):  # type: ignore[no-untyped-def]
        await asyncio.sleep(0.01)  # (a runtime reads a session with scan)
        return await super().scan(session_id, after=after, limit=limit)


async def test_a_stopped_runtime_never_starts_a_session_again() -> None:
    """Revocation stops a partition's runtime; a sweep or a record that reaches it after
    that must start nothing: on Kafka its claim could fence the partition's new owner."""
    log = _FailingClaims()
    rt = PartitionRuntime(host=HarnessHost(log=log), harnesses={"echo": _harness()})
    await rt.go_live()
    await rt.ingest([await log.submit(InputMessage("s", 0, "in-1", "hello", "echo"))])
    for _ in range(200):  # its driver fails on the claim: the sweep would restart it
        if all(s.failed is not None for s in rt.sessions.values()):
            break
        await asyncio.sleep(0.005)
    assert log.claims == 1
    await asyncio.gather(rt.sweep(), rt.stop())  # revoked while a sweep restarts the session
    await rt.sweep()
    await rt.ingest([await log.submit(InputMessage("t", 0, "in-1", "hello", "echo"))])
    await asyncio.sleep(0.05)
    assert log.claims == 1
    assert rt.sessions == {}


async def test_stop_closes_its_sessions_together() -> None:
    """Each close gives up a lease (on SQLite a write): closed one after the other, a worker
    with hundreds of sessions parked on asks spent one commit each on its way out (3.8 s
    for 345 in a soak run); closed together they share group commits."""

    class Closing:
        open_now = 0
        most = 0

        def __init__(self, sid: str) -> None:
            self.session_id = sid

        async def close(self) -> None:
            Closing.open_now += 1
            Closing.most = max(Closing.most, Closing.open_now)
            for _ in range(3):  # (the lease release's round trip to the writer)
                await asyncio.sleep(0)
            Closing.open_now -= 1

    rt = PartitionRuntime(host=HarnessHost(log=MemoryLog()), harnesses={"echo": _harness()})
    await rt.go_live()
    rt._sessions = {f"s-{k}": Closing(f"s-{k}") for k in range(20)}  # type: ignore[misc]
    await rt.stop()
    assert Closing.most == 20
    assert rt.sessions == {}
