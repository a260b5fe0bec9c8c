"""Issues 7 and 13 on a real Kafka broker: checksums and parked sessions, concurrent
sends on one handle, attempts of a waiting turn, app records read back by type."""

from __future__ import annotations

import asyncio
import zlib
from datetime import timedelta
from typing import Any

import confluent_kafka as ck
import pytest
from pydantic import BaseModel

from harness import HarnessHost, define_harness, durable_tool, tool_definition
from harness.client import HarnessClient
from harness.codec import default_codec
from harness.errors import CorruptRecord
from harness.ids import RECORD_CRC_HEADER, RECORD_TYPE_HEADER, message_key
from harness.log.kafka.log import KafkaLog
from harness.models import ModelResponse, ScriptedModel, ToolCall
from harness.records import (
    InputMessage,
    InputSettled,
    LogEntry,
    ModelResponseRecord,
    StepResult,
    ToolStarted,
    TurnFinished,
    TurnStarted,
)
from harness.runtime.worker import Worker
from tests.unit.test_legacy_settled_turn import SID, App, check_closed_and_went_on, write_legacy_log

pytestmark = pytest.mark.kafka


class Args(BaseModel):
    order_id: str = "42"


class Ok(BaseModel):
    ok: bool


def _produce_raw(bootstrap: str, topic: str, session_id: str, value: bytes, crc_of: bytes, record_type: str) -> None:
    producer = ck.Producer({"bootstrap.servers": bootstrap, "partitioner": "murmur2_random"})
    producer.produce(
        topic,
        key=message_key(session_id),
        value=value,
        partition=0,
        headers=[(RECORD_TYPE_HEADER, record_type.encode()), (RECORD_CRC_HEADER, zlib.crc32(crc_of).to_bytes(4, "big"))],
    )
    assert producer.flush(30) == 0


async def test_kafka_records_carry_a_checksum_and_a_changed_byte_is_a_corrupt_record(
    kafka_bootstrap: str, unique_prefix: str
) -> None:
    log = KafkaLog(bootstrap=kafka_bootstrap, topic_prefix=unique_prefix, partitions=1)
    try:
        writer = await log.claim("A", owner="w", lease=timedelta(seconds=30))
        [good] = await writer.append([StepResult("A", 1, "c1", "charge", {"amount": 100})])
        original = default_codec().encode(StepResult("A", 2, "c1", "refund", {"amount": 100}))
        flipped = original.replace(b"100", b"900")
        await asyncio.to_thread(
            _produce_raw, kafka_bootstrap, log.settings.sessions_topic, "A", flipped, original, StepResult.TYPE
        )
        items = await log.scan("A")
        assert items[0] == good
        [bad] = items[1:]
        assert isinstance(bad, CorruptRecord)
        assert bad.offset == bad.seq - 1 and bad.partition == 0 and bad.raw == flipped
        assert "harness.crc32" in str(bad)
        # A session handle never drives on past it.
        async with HarnessHost(log=log) as host:
            h = define_harness(name="x", model=ScriptedModel([ModelResponse(text="hi")]))
            with pytest.raises(CorruptRecord):
                session = await host.open(h, session_id="A")
                await session.send("go", input_id="in-1")
    finally:
        await log.close()


async def test_a_kafka_worker_parks_a_session_with_an_unreadable_record(kafka_bootstrap: str, unique_prefix: str) -> None:
    charges: list[str] = []

    async def checkout(args: Args, ctx: Any) -> Any:
        charge = await ctx.step.do("charge", lambda: charges.append(ctx.session_id) or {"amount": 100})
        return charge

    tool = durable_tool(tool_definition(name="checkout", description="d", input_schema=Args), checkout)
    shop = define_harness(name="shop", model=ScriptedModel([
        ModelResponse(tool_calls=[ToolCall(id="c1", name="checkout", arguments={})]), ModelResponse(text="paid"),
    ]), tools=[tool])

    log = KafkaLog(bootstrap=kafka_bootstrap, topic_prefix=unique_prefix, partitions=1)
    codec = default_codec()
    # Two sessions whose first owner charged, then died before the tool's result.
    for sid in ("good", "bad"):
        await log.submit(InputMessage(sid, 1, "in-1", "check out", "shop"))
        writer = await log.claim(sid, owner="dead", lease=timedelta(seconds=30))
        calls = ({"id": "c1", "name": "checkout", "arguments": {}},)
        await writer.append([TurnStarted(sid, 2, "in-1", 1), ModelResponseRecord(sid, 3, 1, 0, None, calls)])
        await writer.append([ToolStarted(sid, 4, "c1", "checkout", 1)])
        step = StepResult(sid, 5, "c1", "charge", {"amount": 100})
        if sid == "good":
            await writer.append([step])
        else:
            value = codec.encode(step)
            await asyncio.to_thread(
                _produce_raw, kafka_bootstrap, log.settings.sessions_topic, sid,
                value.replace(b"100", b"900"), value, StepResult.TYPE,
            )
        await writer.release()
    await log.close()

    worker_log = KafkaLog(bootstrap=kafka_bootstrap, topic_prefix=unique_prefix, partitions=1)
    worker = Worker(log=worker_log, harnesses=[shop])
    stop = asyncio.Event()
    run = asyncio.create_task(worker.run(stop))
    reader = KafkaLog(bootstrap=kafka_bootstrap, topic_prefix=unique_prefix, partitions=1)
    try:
        for _ in range(600):
            good = [e.type for e in await reader.read("good")]
            rt = worker.runtimes.get(0)
            if "harness.turn.finished" in good and rt is not None and "bad" in rt.parked:
                break
            await asyncio.sleep(0.1)
        else:
            raise AssertionError("the good session did not finish or the bad one was not parked")
        bad = [e.type for e in await reader.read("bad")]
        assert "harness.tool.result" not in bad and "harness.turn.resumed" not in bad  # never driven
        assert charges == []  # the good charge came from the log; the bad one never ran again
        # A message sent to it later gets an answer, not silence: refused, with what to do.
        client = HarnessClient(log=reader)
        receipt = await client.send("bad", "hello?", input_id="in-2")
        settled = await asyncio.wait_for(client.wait_settled("bad", receipt), 60)
        assert (settled.outcome, settled.code) == ("rejected", "session_unreadable")
        assert "continue in a new session" in (settled.reason or "")
        # The turn that was running when the record appeared: its sender is told too.
        running = await asyncio.wait_for(client.wait_settled("bad", "in-1"), 60)
        assert (running.outcome, running.code) == ("failed", "session_unreadable")
        assert "continue in a new session" in (running.reason or "")
    finally:
        stop.set()
        await run
        await worker_log.close()
        await reader.close()


async def test_a_kafka_worker_settles_again_an_input_whose_settlement_is_the_unreadable_record(
    kafka_bootstrap: str, unique_prefix: str
) -> None:
    """The turn finished, but its input's settlement (same transaction on a good owner;
    here produced with a changed byte) cannot be read: the worker parks the session and
    settles the input again with its turn's verdict, once; before, its sender waited for good."""
    log = KafkaLog(bootstrap=kafka_bootstrap, topic_prefix=unique_prefix, partitions=1)
    codec = default_codec()
    sid = "bad"
    await log.submit(InputMessage(sid, 1, "in-1", "hi", "shop"))
    writer = await log.claim(sid, owner="dead", lease=timedelta(seconds=30))
    await writer.append([TurnStarted(sid, 2, "in-1", 1), ModelResponseRecord(sid, 3, 1, 0, "hello", ())])
    await writer.append([TurnFinished(sid, 4, "in-1", 1, "completed", "hello")])
    value = codec.encode(InputSettled(sid, 4, "in-1", "completed"))
    await asyncio.to_thread(
        _produce_raw, kafka_bootstrap, log.settings.sessions_topic, sid,
        value.replace(b"completed", b"complete!"), value, InputSettled.TYPE,
    )
    await writer.release()
    await log.close()
    shop = define_harness(name="shop", model=ScriptedModel([ModelResponse(text="hello")]))

    worker_log = KafkaLog(bootstrap=kafka_bootstrap, topic_prefix=unique_prefix, partitions=1)
    worker = Worker(log=worker_log, harnesses=[shop])
    stop = asyncio.Event()
    run = asyncio.create_task(worker.run(stop))
    reader = KafkaLog(bootstrap=kafka_bootstrap, topic_prefix=unique_prefix, partitions=1)
    client = HarnessClient(log=reader)
    try:
        settled = await asyncio.wait_for(client.wait_settled(sid, "in-1"), 60)
        assert (settled.outcome, settled.code) == ("completed", None)
        await asyncio.sleep(1.0)  # the worker runs on: no second verdict
        assert 0 in worker.runtimes and sid in worker.runtimes[0].parked
        items = await reader.scan(sid)
        assert [type(i).__name__ for i in items][-2:] == ["CorruptRecord", "LogEntry"]
        assert [i.record.outcome for i in items if isinstance(i, LogEntry) and isinstance(i.record, InputSettled)] == [
            "completed"
        ]
    finally:
        stop.set()
        await run
        await client.close()
        await worker_log.close()
        await reader.close()


async def test_a_kafka_worker_closes_a_legacy_turn_whose_input_was_settled_and_a_restart_adds_nothing(
    kafka_bootstrap: str, unique_prefix: str
) -> None:
    """The log an older version left (a cancel settled, the turn ran on to an ask nobody
    can answer): a worker closes the turn from the folded log and runs the next message;
    a second worker started after it (a restart: the session's log read back) writes
    nothing more."""
    log = KafkaLog(bootstrap=kafka_bootstrap, topic_prefix=unique_prefix, partitions=1)
    await write_legacy_log(log)
    app = App()

    async def run_worker(done: Any) -> None:
        worker_log = KafkaLog(bootstrap=kafka_bootstrap, topic_prefix=unique_prefix, partitions=1)
        worker = Worker(log=worker_log, harnesses=[app.harness()])
        stop = asyncio.Event()
        run = asyncio.create_task(worker.run(stop))
        try:
            await asyncio.wait_for(worker.ready.wait(), 60)
            for _ in range(600):
                if await done():
                    return
                await asyncio.sleep(0.1)
            raise AssertionError("the worker never got there")
        finally:
            stop.set()
            await run
            await worker_log.close()

    reader = KafkaLog(bootstrap=kafka_bootstrap, topic_prefix=unique_prefix, partitions=1)
    try:
        async def next_done() -> bool:
            return any(e.type == "harness.input.settled" and e.data["input_id"] == "in-2" for e in await reader.read(SID))

        await run_worker(next_done)
        await check_closed_and_went_on(reader, app)
        written = len(await reader.read(SID))
        await HarnessClient(log=reader).send(SID, "again", input_id="in-3")

        async def third_done() -> bool:
            return any(e.type == "harness.input.settled" and e.data["input_id"] == "in-3" for e in await reader.read(SID))

        await run_worker(third_done)  # a restart: the session's log is read back
        new = [e.record for e in (await reader.read(SID))[written:]]
        assert {getattr(r, "input_id", None) or f"turn {getattr(r, 'turn', '?')}" for r in new} == {"in-3", "turn 3"}
        assert [(r.outcome, r.code) for r in new if isinstance(r, InputSettled)] == [("completed", None)]
        assert app.tool_runs == 0 and app.model_calls == ["next", "again"]
    finally:
        await reader.close()
        await log.close()


async def test_concurrent_first_sends_on_a_fresh_kafka_handle_each_settle_once(
    kafka_bootstrap: str, unique_prefix: str
) -> None:
    """Issue 13 on Kafka: 20 sends at once on a fresh handle never fence each other
    (repeated: the race lost about 1 run in 8)."""
    log = KafkaLog(bootstrap=kafka_bootstrap, topic_prefix=unique_prefix, partitions=1)

    def respond(messages: list[dict[str, Any]]) -> ModelResponse:
        return ModelResponse(text=f"re: {messages[-1]['content']}")

    h = define_harness(name="echo", model=ScriptedModel(respond))
    try:
        async with HarnessHost(log=log) as host:
            for run in range(25):  # (7/8)^25: a 1-in-8 race shows with 96% odds
                session = await host.open(h, session_id=f"s-{run}")
                results = await asyncio.gather(
                    *(session.send(f"m{i}", input_id=f"in-{i}") for i in range(20)), return_exceptions=True
                )
                assert not [r for r in results if isinstance(r, BaseException)], (run, results)
                assert [r.text for r in results] == [f"re: m{i}" for i in range(20)]  # type: ignore[union-attr]
                await session.close()
    finally:
        await log.close()


async def test_kafka_waiting_turn_taken_over_uses_no_attempt_and_app_records_read_back_by_type(
    kafka_bootstrap: str, unique_prefix: str
) -> None:
    async def execute(args: Args, ctx: Any) -> Any:
        ok = (await ctx.step.ask("confirm", message="ok?", schema=Ok)).ok
        ctx.append([{"type": "app.memory", "fact": "confirmed"}])
        return ok

    model = ScriptedModel([ModelResponse(tool_calls=[ToolCall(id="c1", name="work", arguments={})]), ModelResponse(text="done")])
    tool = durable_tool(tool_definition(name="work", description="d", input_schema=Args), execute)
    h = define_harness(name="wait", model=model, tools=[tool], durability={"max_attempts": 1})
    log = KafkaLog(bootstrap=kafka_bootstrap, topic_prefix=unique_prefix, partitions=1)
    try:
        for n in range(3):  # clean hand-overs of a turn waiting for a person
            async with HarnessHost(log=log, owner_id=f"p{n}") as host:
                session = await host.open(h, session_id="w")
                result = await (session.send("go", input_id="in-1") if n == 0 else session.recover())
                result = result if not isinstance(result, list) else result[0]
                assert result.outcome == "waiting", n
        async with HarnessHost(log=log, owner_id="last") as host:
            session = await host.open(h, session_id="w")
            done = await session.answer("c1", "confirm", {"ok": True})
            assert done is not None and done.outcome == "completed"
        resumed = [e.data for e in await log.read("w") if e.type == "harness.turn.resumed"]
        assert len(resumed) == 3 and not any(r["counted"] for r in resumed)  # p1, p2, last
        memory = [e for e in await log.read("w") if e.type == "app.memory"]
        assert [e.data for e in memory] == [{"type": "app.memory", "fact": "confirmed"}]
        client = HarnessClient(log=log)
        seen = []
        async for entry in client.events("w"):
            seen.append(entry.type)
            if entry.type == "harness.input.settled" and entry.data["input_id"] == "in-1":
                break
        assert "app.memory" in seen
    finally:
        await log.close()


class Kind(BaseModel):
    kind: str


async def test_records_the_log_refuses_as_too_large_end_once_with_what_to_do_never_a_takeover_loop(
    kafka_bootstrap: str, unique_prefix: str
) -> None:
    """A record over the log's limit (here the clients' message.max.bytes) is refused the
    same way every time: the call or turn ends at once with an error that says so, the
    tool and the model run once, and no owner takes the turn up again."""
    big = "x" * 50_000  # under the step value limit (256 KiB), over this log's 20 kB
    runs: list[str] = []
    asked: list[str] = []

    async def work(args: Kind, ctx: Any) -> Any:
        runs.append(args.kind)
        if args.kind == "result":
            return big
        if args.kind == "append":
            ctx.append([{"type": "app.blob", "data": big}])
            return "appended"
        return await ctx.step.do("blob", lambda: big)  # "step"

    tool = durable_tool(tool_definition(name="work", description="big values", input_schema=Kind), work)

    def script(messages: list[dict[str, Any]]) -> ModelResponse:
        last = messages[-1]
        if last["role"] == "user":
            asked.append(last["content"])
            if last["content"] == "answer":
                return ModelResponse(text=big)
            return ModelResponse(text="", tool_calls=[ToolCall(id="c1", name="work", arguments={"kind": last["content"]})])
        return ModelResponse(text="tool said: " + str(last["content"])[:300])

    h = define_harness(name="big", model=ScriptedModel(script), tools=[tool])
    log = KafkaLog(bootstrap=kafka_bootstrap, topic_prefix=unique_prefix, partitions=1,
                   client_config={"message.max.bytes": 20_000})
    try:
        async with HarnessHost(log=log) as host:
            results = {}
            for kind in ("answer", "result", "append", "step"):
                session = await host.open(h, session_id=f"s-{kind}")
                results[kind] = await asyncio.wait_for(session.send(kind, input_id=f"in-{kind}"), 60)
        answer = results["answer"]
        assert (answer.outcome, answer.code) == ("failed", "record_too_large"), answer
        assert "the model's answer is" in (answer.error or "") and "more than the session log accepts" in (answer.error or "")
        for kind, said in (("result", "result_too_large"), ("append", "result_too_large"), ("step", "a record of this call (a step's value, an ask) is")):
            assert results[kind].outcome == "completed", results[kind]
            assert said in (results[kind].text or ""), results[kind]
        assert sorted(runs) == ["append", "result", "step"]  # each tool ran once
        assert sorted(asked) == ["answer", "append", "result", "step"]  # the model was asked once per turn
        records = [e.record for e in await log.read("s-append")]
        assert not [r for r in records if r.TYPE.startswith("app.")]  # the refused app record is not there
        assert not [r for r in records if r.TYPE == "harness.turn.resumed"]  # no takeover
    finally:
        await log.close()


class Note(BaseModel):
    note: str


async def test_an_answer_the_owners_log_cannot_copy_is_rejected_and_the_ask_stays_open(
    kafka_bootstrap: str, unique_prefix: str
) -> None:
    """A client whose log takes larger records (another deployment's settings) answers
    with more than the owner's log takes: the answer settles rejected / too_large with
    what to do, the ask stays open, and a smaller answer completes the turn."""

    async def review(args: Kind, ctx: Any) -> Any:
        answer = await ctx.step.ask("review", schema=Note, message="a note, please")
        return {"note_length": len(answer.note)}

    tool = durable_tool(tool_definition(name="review", description="asks", input_schema=Kind), review)

    def script(messages: list[dict[str, Any]]) -> ModelResponse:
        if messages[-1]["role"] == "user":
            return ModelResponse(text="", tool_calls=[ToolCall(id="c1", name="review", arguments={"kind": "x"})])
        return ModelResponse(text="done: " + str(messages[-1]["content"]))

    h = define_harness(name="asks", model=ScriptedModel(script), tools=[tool])
    log = KafkaLog(bootstrap=kafka_bootstrap, topic_prefix=unique_prefix, partitions=1,
                   client_config={"message.max.bytes": 20_000})
    client = HarnessClient(bootstrap=kafka_bootstrap, topic_prefix=unique_prefix, partitions=1)
    try:
        async with HarnessHost(log=log) as host:
            session = await host.open(h, session_id="s")
            waiting = await asyncio.wait_for(session.send("review it", input_id="in-1"), 60)
            assert waiting.outcome == "waiting" and waiting.waiting[0].name == "review"
            big = await client.answer("s", "c1", "review", {"note": "x" * 50_000})
            refused = await client.wait_settled("s", big, timeout=60)
            assert (refused.outcome, refused.code) == ("rejected", "record_too_large"), refused
            assert "the answer is" in (refused.reason or "") and "answer with less" in (refused.reason or "")
            small = await client.answer("s", "c1", "review", {"note": "fine"}, input_id="answer-2")
            assert (await client.wait_settled("s", small, timeout=60)).outcome == "completed"
            assert (await client.wait_settled("s", "in-1", timeout=60)).outcome == "completed"  # the turn went on
            records = [e.record for e in await log.read("s")]
            assert [r.TYPE for r in records].count("harness.ask.answered") == 1
            assert not [r for r in records if r.TYPE == "harness.turn.resumed"]
    finally:
        await client.close()
        await log.close()
