"""The session log contract (harness.log.base, SPEC 7), run on every backend."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest

from harness.errors import CodecError, FencedError, RecordTooLarge, SessionBusy
from harness.log.base import LeaseInfo, LogEntry, SessionLog, SessionWriter
from harness.records import InputMessage, ModelResponseRecord, Record, StepResult, ToolStarted, TurnStarted

pytestmark = pytest.mark.asyncio

LEASE = timedelta(seconds=30)


def msg(session: str, n: int) -> InputMessage:
    return InputMessage(session_id=session, ts=1000 + n, input_id=f"in-{n}", text=f"hello {n}")


def step(session: str, n: int, value: object = None) -> StepResult:
    return StepResult(session_id=session, ts=2000 + n, tool_call_id="call-1", name=f"step-{n}", value=value or {"n": n})


def started(session: str, turn: int = 1) -> TurnStarted:
    return TurnStarted(session_id=session, ts=3000, input_id="in-1", turn=turn)


def records_of(entries: list[LogEntry]) -> list[Record]:
    return [e.record for e in entries]


def assert_increasing(entries: list[LogEntry]) -> None:
    seqs = [e.seq for e in entries]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs), seqs


# --- the shape -----------------------------------------------------------------------------


async def test_log_and_writer_satisfy_the_protocols(log):
    assert isinstance(log, SessionLog)
    writer = await log.claim("s", owner="w1", lease=LEASE)
    assert isinstance(writer, SessionWriter)
    assert writer.session_id == "s"
    assert writer.epoch >= 1
    assert isinstance(log.namespace, str) and log.namespace


# --- appends: atomic, ordered, read after append --------------------------------------------


async def test_append_then_read_returns_the_records_in_order(log):
    writer = await log.claim("s", owner="w1", lease=LEASE)
    first = await writer.append([started("s"), step("s", 1)])
    second = await writer.append([step("s", 2)])
    third = await writer.append([step("s", 3), step("s", 4), step("s", 5)])

    read = await log.read("s")
    assert read == first + second + third
    assert records_of(read) == [started("s")] + [step("s", n) for n in range(1, 6)]
    assert_increasing(read)
    assert [e.type for e in read][:2] == [TurnStarted.TYPE, StepResult.TYPE]
    assert read[1].data["value"] == {"n": 1}
    assert read[1].session_id == "s"


async def test_a_model_responses_thinking_blocks_read_back_as_they_were(log):
    thinking = (
        {"type": "thinking", "thinking": "Zuerst suchen… ✓", "signature": "EqQBCgIYAhIM1gbcDa9GJwZA=="},
        {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix/LafPsn4a"},
    )
    response = ModelResponseRecord("s", 4000, 1, 0, None, ({"id": "toolu_1", "name": "search", "arguments": {}},),
                                   "tool_calls", thinking)
    writer = await log.claim("s", owner="w1", lease=LEASE)
    await writer.append([started("s"), response])
    [_, entry] = await log.read("s")
    assert entry.record == response and entry.data["thinking"] == list(thinking)


async def test_append_is_atomic_a_batch_with_an_unencodable_record_lands_nothing(log):
    writer = await log.claim("s", owner="w1", lease=LEASE)
    await writer.append([step("s", 1)])
    bad = step("s", 3, value=lambda: None)  # not JSON: the codec refuses it
    with pytest.raises(CodecError):
        await writer.append([step("s", 2), bad, step("s", 4)])
    assert records_of(await log.read("s")) == [step("s", 1)]
    # the writer is still usable and the log still ordered
    await writer.append([step("s", 5)])
    read = await log.read("s")
    assert records_of(read) == [step("s", 1), step("s", 5)]
    assert_increasing(read)


# --- the record size limit: RecordTooLarge, nothing of that append written ----------------

LIMIT = 20_000  # (max_record_bytes; on Kafka the clients' message.max.bytes)
BIG = "x" * 50_000  # a record over LIMIT
FITS = "x" * 5_000  # well under LIMIT, on Kafka with its key and headers too


async def test_a_record_over_the_limit_fails_its_append_alone_and_lands_nothing(log_factory, clock):
    log = log_factory(clock=clock, max_record_bytes=LIMIT)
    writer = await log.claim("s", owner="w1", lease=LEASE)
    await writer.append([step("s", 1, FITS)])
    with pytest.raises(RecordTooLarge) as refused:
        await writer.append([step("s", 2), step("s", 3, BIG), step("s", 4)])
    assert refused.value.session_id == "s" and refused.value.size > LIMIT
    assert "raise the log's record limit" in refused.value.explained("the value")  # says what to do
    assert records_of(await log.read("s")) == [step("s", 1, FITS)]
    await writer.append([step("s", 5)])  # the writer goes on: it is neither fenced nor stuck
    read = await log.read("s")
    assert records_of(read) == [step("s", 1, FITS), step("s", 5)]
    assert_increasing(read)


async def test_appends_committed_together_fail_only_the_one_over_the_limit(log_factory, clock):
    log = log_factory(clock=clock, max_record_bytes=LIMIT)
    big_writer = await log.claim("big", owner="w1", lease=LEASE)
    writers = [await log.claim(f"s{n}", owner="w1", lease=LEASE) for n in range(3)]
    outcomes = await asyncio.gather(
        writers[0].append([step("s0", 1)]),
        big_writer.append([step("big", 1), step("big", 2, BIG)]),
        *(w.append([step(w.session_id, 1), step(w.session_id, 2)]) for w in writers[1:]),
        return_exceptions=True,
    )
    assert isinstance(outcomes[1], RecordTooLarge) and outcomes[1].session_id == "big"
    assert not [o for n, o in enumerate(outcomes) if n != 1 and isinstance(o, BaseException)], outcomes
    assert await log.read("big") == []
    assert records_of(await log.read("s0")) == [step("s0", 1)]
    for w in writers[1:]:
        assert records_of(await log.read(w.session_id)) == [step(w.session_id, 1), step(w.session_id, 2)]


async def test_an_input_over_the_limit_is_refused_to_its_sender_and_lands_nothing(log_factory, clock):
    log = log_factory(clock=clock, max_record_bytes=LIMIT)
    with pytest.raises(RecordTooLarge) as refused:
        await log.submit(InputMessage(session_id="s", ts=1, input_id="in-big", text=BIG))
    assert refused.value.session_id == "s" and refused.value.size > LIMIT
    assert await log.read("s") == []
    small = await log.submit(msg("s", 1))
    assert await log.read("s") == [small]


async def test_the_default_limit_is_kafkas_default_a_million_bytes(log):
    writer = await log.claim("s", owner="w1", lease=LEASE)
    fits = step("s", 1, "x" * 990_000)
    await writer.append([fits])
    with pytest.raises(RecordTooLarge):
        await writer.append([step("s", 2, "x" * 1_000_001)])
    with pytest.raises(RecordTooLarge):
        await log.submit(InputMessage(session_id="s", ts=1, input_id="in-big", text="x" * 1_000_001))
    assert records_of(await log.read("s")) == [fits]


async def test_append_refuses_a_record_of_another_session_and_lands_nothing(log):
    writer = await log.claim("s", owner="w1", lease=LEASE)
    with pytest.raises(ValueError, match="session"):
        await writer.append([step("s", 1), step("other", 2)])
    assert await log.read("s") == []
    assert await log.read("other") == []


async def test_empty_append_writes_nothing(log):
    writer = await log.claim("s", owner="w1", lease=LEASE)
    assert await writer.append([]) == []
    assert await log.read("s") == []


async def test_read_after_returns_only_later_records(log):
    writer = await log.claim("s", owner="w1", lease=LEASE)
    entries = await writer.append([step("s", n) for n in range(1, 6)])
    assert await log.read("s", after=entries[1].seq) == entries[2:]
    assert await log.read("s", after=entries[-1].seq) == []
    assert await log.read("s", after=None) == entries
    assert await log.read("s", after=0) == entries


async def test_read_of_unknown_session_is_empty(log):
    assert await log.read("nobody") == []


async def test_sessions_are_isolated(log):
    wa = await log.claim("a", owner="w1", lease=LEASE)
    wb = await log.claim("b", owner="w2", lease=LEASE)
    await wa.append([step("a", 1)])
    await wb.append([step("b", 1), step("b", 2)])
    await wa.append([step("a", 2)])
    a, b = await log.read("a"), await log.read("b")
    assert records_of(a) == [step("a", 1), step("a", 2)]
    assert records_of(b) == [step("b", 1), step("b", 2)]
    assert_increasing(a)
    assert_increasing(b)
    # seqs are comparable within one log: b's records sit between a's two
    assert a[0].seq < b[0].seq < b[1].seq < a[1].seq


async def test_sessions_and_read_all_cover_every_session_in_log_order(log):
    wa = await log.claim("a", owner="w1", lease=LEASE)
    await wa.append([step("a", 1)])
    await log.submit(msg("b", 1))
    await wa.append([step("a", 2)])
    assert await log.sessions() == ["a", "b"]
    everything = await log.read_all()
    assert records_of(everything) == [step("a", 1), msg("b", 1), step("a", 2)]
    assert_increasing(everything)
    assert await log.read_all(after=everything[0].seq) == everything[1:]
    assert await log.read_all(after=everything[0].seq, limit=1) == everything[1:2]


async def test_scan_returns_entries_like_read(log):
    wa = await log.claim("a", owner="w1", lease=LEASE)
    entries = await wa.append([step("a", 1), step("a", 2)])
    assert await log.scan("a") == entries
    assert await log.scan() == entries


# --- inputs ------------------------------------------------------------------------------


async def test_s7_2_submit_needs_no_ownership_and_the_owner_reads_it(log):
    writer = await log.claim("s", owner="w1", lease=LEASE)
    await writer.append([started("s")])
    submitted = await log.submit(msg("s", 2))  # while w1 owns the session
    assert submitted.record == msg("s", 2)
    await writer.append([step("s", 3)])
    read = await log.read("s")
    assert records_of(read) == [started("s"), msg("s", 2), step("s", 3)]
    assert read[1] == submitted


async def test_submit_to_a_never_claimed_session(log):
    entry = await log.submit(msg("fresh", 1))
    assert await log.read("fresh") == [entry]
    assert await log.lease_info("fresh") == LeaseInfo(owner=None, epoch=0, lease_until=None)


async def test_submit_refuses_records_that_are_not_inputs(log):
    with pytest.raises(ValueError, match="input"):
        await log.submit(step("s", 1))
    with pytest.raises(ValueError, match="input"):
        await log.submit(ToolStarted(session_id="s", ts=1, tool_call_id="c", name="t", attempt=1))
    assert await log.read("s") == []


# --- ownership and fencing (SPEC 7.1) -----------------------------------------------------


async def test_s7_1_new_owner_fences_old_writer(log, clock):
    old = await log.claim("s", owner="w1", lease=timedelta(seconds=10))
    await old.append([step("s", 1)])
    clock.advance(11)  # w1's lease expires (or, on Kafka, the new claim fences at once)
    new = await log.claim("s", owner="w2", lease=LEASE)
    assert new.epoch > old.epoch

    with pytest.raises(FencedError) as caught:
        await old.append([step("s", 2), step("s", 3)])
    assert caught.value.session_id == "s"
    with pytest.raises(FencedError):
        await old.renew()

    await new.append([step("s", 4)])
    assert records_of(await log.read("s")) == [step("s", 1), step("s", 4)]


async def test_s7_1_fenced_writer_stays_fenced_after_the_new_owner_releases(log, clock):
    old = await log.claim("s", owner="w1", lease=timedelta(seconds=10))
    clock.advance(11)
    new = await log.claim("s", owner="w2", lease=LEASE)
    await new.release()
    with pytest.raises(FencedError):
        await old.append([step("s", 1)])
    assert await log.read("s") == []


async def test_s7_1_same_owner_claiming_again_fences_its_previous_writer(log):
    first = await log.claim("s", owner="w1", lease=LEASE)
    second = await log.claim("s", owner="w1", lease=LEASE)  # e.g. w1 restarted
    assert second.epoch > first.epoch
    with pytest.raises(FencedError):
        await first.append([step("s", 1)])
    await second.append([step("s", 2)])
    assert records_of(await log.read("s")) == [step("s", 2)]


@pytest.mark.needs("leases")
async def test_session_busy_while_another_owners_lease_is_live(log_factory, log, clock):
    writer = await log.claim("s", owner="w1", lease=timedelta(seconds=10))
    clock.advance(9)
    with pytest.raises(SessionBusy) as caught:
        await log.claim("s", owner="w2", lease=LEASE)
    assert caught.value.session_id == "s"
    assert caught.value.owner == "w1"
    assert caught.value.lease_until == pytest.approx(clock() + 1)
    # the refused claim changed nothing: w1 still writes
    await writer.append([step("s", 1)])
    assert (await log.lease_info("s")).owner == "w1"


@pytest.mark.needs("leases")
async def test_append_renews_the_lease(log_factory, log, clock):
    writer = await log.claim("s", owner="w1", lease=timedelta(seconds=10))
    clock.advance(8)
    await writer.append([step("s", 1)])
    clock.advance(8)  # 16 s after the claim, 8 s after the append
    with pytest.raises(SessionBusy):
        await log.claim("s", owner="w2", lease=LEASE)
    await writer.renew()
    assert (await log.lease_info("s")).lease_until == pytest.approx(clock() + 10)


async def test_release_lets_another_owner_claim_at_once(log_factory, log):
    writer = await log.claim("s", owner="w1", lease=LEASE)
    await writer.append([step("s", 1)])
    await writer.release()
    other = await log.claim("s", owner="w2", lease=LEASE)  # no wait for the lease
    await other.append([step("s", 2)])
    with pytest.raises(FencedError):
        await writer.append([step("s", 3)])
    await writer.release()  # releasing a lost session is a no-op and keeps w2's ownership
    await other.append([step("s", 4)])
    assert records_of(await log.read("s")) == [step("s", 1), step("s", 2), step("s", 4)]


async def test_lease_info_names_owner_epoch_and_lease(log_factory, log, clock):
    assert await log.lease_info("s") == LeaseInfo(owner=None, epoch=0, lease_until=None)
    writer = await log.claim("s", owner="w1", lease=timedelta(seconds=10))
    info = await log.lease_info("s")
    assert info.owner == "w1"
    assert info.epoch == writer.epoch
    if log_factory.has_leases:
        assert info.lease_until == pytest.approx(clock() + 10)
    await writer.release()
    released = await log.lease_info("s")
    assert released.owner is None


async def test_claim_refuses_a_non_positive_lease(log):
    with pytest.raises(ValueError, match="lease"):
        await log.claim("s", owner="w1", lease=timedelta(0))


# --- the namespace -----------------------------------------------------------------------


@pytest.mark.needs("persistent")
async def test_namespace_is_stable_across_reopen(log_factory, clock):
    first = log_factory(clock=clock)
    writer = await first.claim("s", owner="w1", lease=LEASE)
    entries = await writer.append([step("s", 1)])
    namespace = first.namespace
    await first.close()
    again = log_factory(clock=clock)
    assert again.namespace == namespace
    assert await again.read("s") == entries


@pytest.mark.needs("volatile")  # a persistent factory reopens one store; sqlite's own tests use two files
async def test_separate_logs_have_separate_namespaces(log_factory, tmp_path):
    assert log_factory().namespace != log_factory().namespace


@pytest.mark.needs("persistent", "leases")  # Kafka fences by claim: tested above
async def test_s7_1_fencing_holds_across_two_handles_on_one_store(log_factory, clock):
    one, two = log_factory(clock=clock), log_factory(clock=clock)
    old = await one.claim("s", owner="w1", lease=timedelta(seconds=10))
    with pytest.raises(SessionBusy):
        await two.claim("s", owner="w2", lease=LEASE)
    clock.advance(11)
    new = await two.claim("s", owner="w2", lease=LEASE)
    with pytest.raises(FencedError):
        await old.append([step("s", 1)])
    await new.append([step("s", 2)])
    assert records_of(await one.read("s")) == [step("s", 2)]
