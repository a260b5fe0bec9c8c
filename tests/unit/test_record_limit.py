"""The record size limit of the SQLite and memory logs (``max_record_bytes``): the URL
option, where the line is, and the same outcomes as on Kafka (tests/integration/
test_kafka_core_promises.py) for a tool, a step, an append, a model answer, an answer
and ``harness send`` over it. The shared contract is in tests/conformance."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from harness import HarnessHost, define_harness, durable_tool, tool_definition
from harness.cli import main as harness_cli
from harness.client import HarnessClient
from harness.codec import default_codec
from harness.errors import RecordTooLarge
from harness.log import DEFAULT_MAX_RECORD_BYTES, open_client_log, open_log, parse_sqlite_url, sqlite_path
from harness.log.memory import MemoryLog
from harness.log.sqlite import SqliteLog
from harness.models import ModelResponse, ScriptedModel, ToolCall, Usage
from harness.records import StepResult

LIMIT = 20_000
BIG = "x" * 50_000  # under the step value limit (256 KiB), over LIMIT


# --- the URL option ----------------------------------------------------------------------------


def test_a_sqlite_url_takes_max_record_bytes(tmp_path: Path) -> None:
    assert parse_sqlite_url("sqlite:///x.db") == ("x.db", {})
    assert parse_sqlite_url("sqlite:///x.db?max_record_bytes=4000000") == ("x.db", {"max_record_bytes": 4_000_000})
    assert parse_sqlite_url("sqlite:////abs/x.db?max_record_bytes=1") == ("/abs/x.db", {"max_record_bytes": 1})
    assert sqlite_path("sqlite:///x.db?max_record_bytes=10") == "x.db"


@pytest.mark.parametrize(
    ("url", "said"),
    [
        ("sqlite:///x.db?max_record_bytes=", r"max_record_bytes must be a whole number of bytes above 0 .*not ''"),
        ("sqlite:///x.db?max_record_bytes=abc", r"must be a whole number of bytes above 0 \(e\.g\. max_record_bytes=4000000"),
        ("sqlite:///x.db?max_record_bytes=0", "above 0"),
        ("sqlite:///x.db?max_record_bytes=-5", "above 0"),
        ("sqlite:///x.db?max_record_bytes=1.5", "whole number"),
        ("sqlite:///x.db?max_record_bytes=1e6", "whole number"),
        ("sqlite:///x.db?max_record_bytes=%C2%B2", "whole number"),  # a superscript two is a digit to str.isdigit
        ("sqlite:///x.db?max_record_bytes=1&max_record_bytes=2", "given 2 times; give it once"),
        ("sqlite:///x.db?max_bytes=1", "unknown option 'max_bytes'; the URL takes max_record_bytes"),
        ("sqlite:///x.db?&", "empty option list"),
        ("sqlite:///?max_record_bytes=1", "no database path"),
        ("memory:?max_record_bytes=x", "whole number"),
        ("memory:?topic_prefix=a", "unknown option 'topic_prefix'"),
    ],
)
def test_a_bad_option_is_one_line_that_says_what_is_wrong(url: str, said: str) -> None:
    with pytest.raises(ValueError, match=said) as refused:
        open_log(url)
    assert "\n" not in str(refused.value)


def test_the_limit_is_at_most_what_sqlite_stores_in_a_row(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"at most 999000000 on SQLite \(its own limit on a row\), not 1000000000"):
        open_log(f"sqlite:///{tmp_path}/x.db?max_record_bytes=1000000000")
    assert not (tmp_path / "x.db").exists()  # refused before the file is made
    for bad in (True, 1.5, "10", 0):
        with pytest.raises(ValueError, match="whole number of bytes above 0"):
            SqliteLog(tmp_path / "y.db", max_record_bytes=bad)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="whole number of bytes above 0"):
            MemoryLog(max_record_bytes=bad)  # type: ignore[arg-type]


async def test_the_url_sets_the_limit_a_keyword_wins_and_the_default_is_kafkas(tmp_path: Path) -> None:
    assert DEFAULT_MAX_RECORD_BYTES == 1_000_000  # librdkafka's default message.max.bytes
    logs = [
        open_log(f"sqlite:///{tmp_path}/a.db"),
        open_log(f"sqlite:///{tmp_path}/b.db?max_record_bytes=2000"),
        open_log(f"sqlite:///{tmp_path}/c.db?max_record_bytes=2000", max_record_bytes=3000),
        open_client_log(f"sqlite:///{tmp_path}/b.db?max_record_bytes=5000"),
        open_log("memory:"),
        open_log("memory:?max_record_bytes=2000"),
    ]
    try:
        assert [log.max_record_bytes for log in logs] == [  # type: ignore[attr-defined]
            1_000_000, 2000, 3000, 5000, 1_000_000, 2000,
        ]
    finally:
        for log in logs:
            await log.close()


# --- where the line is ----------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["memory", "sqlite"])
async def test_a_record_of_exactly_the_limit_lands_one_byte_more_is_refused_with_the_fix(
    backend: str, tmp_path: Path
) -> None:
    record = StepResult(session_id="s1", ts=1, tool_call_id="c1", name="n", value="x" * 1000)
    size = len(default_codec().encode(record))  # the limit counts the encoded record, as stored
    url = "memory:" if backend == "memory" else f"sqlite:///{tmp_path}/x.db"
    at_limit, under = open_log(f"{url}?max_record_bytes={size}"), open_log(f"{url}?max_record_bytes={size - 1}")
    try:
        await (await at_limit.claim("s1", owner="w", lease=30)).append([record])  # type: ignore[arg-type]
        assert [e.record for e in await at_limit.read("s1")] == [record]
        writer = await under.claim("s2", owner="w", lease=30)  # type: ignore[arg-type]
        bigger = StepResult(session_id="s2", ts=1, tool_call_id="c1", name="n", value="x" * 1000)  # as large
        with pytest.raises(RecordTooLarge) as refused:
            await writer.append([bigger])
        err = refused.value
        assert (err.session_id, err.size, err.limit) == ("s2", size, size - 1)
        assert f"a harness.step.result record of session 's2' is {size} bytes" in str(err)
        assert f"more than the session log accepts ({size - 1} bytes); nothing of it was written" in str(err)
        fix = f"sqlite:///{tmp_path}/x.db?max_record_bytes=N" if backend == "sqlite" else "memory:?max_record_bytes=N"
        assert fix in str(err) and fix in err.explained("the value")
        assert await under.read("s2") == []
    finally:
        await at_limit.close()
        await under.close()


async def test_sqlite_refuses_before_queueing_so_its_group_commits_without_it(tmp_path: Path) -> None:
    log = SqliteLog(tmp_path / "x.db", max_record_bytes=LIMIT)
    try:
        writers = [await log.claim(f"s{n}", owner="w", lease=30) for n in range(3)]
        before = log.stats.transactions
        outcomes = await asyncio.gather(
            *(
                w.append([StepResult(w.session_id, 1, "c1", "n", BIG if n == 1 else n)])
                for n, w in enumerate(writers)
            ),
            return_exceptions=True,
        )
        assert isinstance(outcomes[1], RecordTooLarge)
        assert log.stats.transactions == before + 1 and log.stats.appends == 2  # one commit, the other two
        assert [len(await log.read(w.session_id)) for w in writers] == [1, 0, 1]
    finally:
        await log.close()


# --- the runtime on SQLite: as on Kafka ---------------------------------------------------------


class Kind(BaseModel):
    kind: str


async def test_records_over_the_limit_end_once_with_what_to_do_as_on_kafka_and_the_next_turn_works(
    tmp_path: Path,
) -> None:
    """The SQLite twin of test_kafka_core_promises' too-large test: the call or turn ends at
    once with an error that says so (the tool and the model run once, no takeover), and the
    session's next turn completes."""
    runs: list[str] = []
    asked: list[str] = []

    async def work(args: Kind, ctx: Any) -> Any:
        runs.append(args.kind)
        if args.kind == "result":
            return BIG
        if args.kind == "append":
            ctx.append([{"type": "app.blob", "data": BIG}])
            return "appended"
        if args.kind == "step":
            return await ctx.step.do("blob", lambda: BIG)
        return "small"

    tool = durable_tool(tool_definition(name="work", description="big values", input_schema=Kind), work)

    def script(messages: list[dict[str, Any]]) -> ModelResponse:
        last = messages[-1]
        if last["role"] == "user":
            asked.append(last["content"])
            if last["content"] == "answer":
                return ModelResponse(text=BIG)
            kind = last["content"].removeprefix("again ")
            return ModelResponse(text="", tool_calls=[ToolCall(id=f"c-{len(messages)}", name="work", arguments={"kind": kind})])
        return ModelResponse(text="tool said: " + str(last["content"])[:300])

    h = define_harness(name="big", model=ScriptedModel(script), tools=[tool])
    log = open_log(f"sqlite:///{tmp_path}/h.db?max_record_bytes={LIMIT}")
    try:
        async with HarnessHost(log=log) as host:
            results, nexts = {}, {}
            for kind in ("answer", "result", "append", "step"):
                session = await host.open(h, session_id=f"s-{kind}")
                results[kind] = await asyncio.wait_for(session.send(kind, input_id=f"in-{kind}"), 60)
                nexts[kind] = await asyncio.wait_for(session.send("again small", input_id=f"in-{kind}-2"), 60)
        answer = results["answer"]
        assert (answer.outcome, answer.code) == ("failed", "record_too_large"), answer
        assert "the model's answer is" in (answer.error or "") and "more than the session log accepts" in (answer.error or "")
        assert f"sqlite:///{tmp_path}/h.db?max_record_bytes=N" in (answer.error or "")  # how to raise it, here
        for kind, said in (("result", "result_too_large"), ("append", "result_too_large"), ("step", "a record of this call (a step's value, an ask) is")):
            assert results[kind].outcome == "completed", results[kind]
            assert said in (results[kind].text or ""), results[kind]
        for kind, after in nexts.items():  # the session goes on
            assert (after.outcome, after.text) == ("completed", 'tool said: "small"'), (kind, after)
        assert sorted(runs) == ["append", "result", "small", "small", "small", "small", "step"]  # each tool ran once
        assert sorted(asked) == ["again small"] * 4 + ["answer", "append", "result", "step"]  # the model: once per turn
        records = [e.record for e in await log.read("s-append")]
        assert not [r for r in records if r.TYPE.startswith("app.")]  # the refused app record is not there
        assert not [r for r in records if r.TYPE == "harness.turn.resumed"]  # no takeover
    finally:
        await log.close()


class Note(BaseModel):
    note: str


async def test_an_answer_the_owners_log_cannot_copy_is_rejected_and_the_ask_stays_open(tmp_path: Path) -> None:
    """As on Kafka: a client whose log takes larger records answers with more than the
    owner's log takes; the answer settles rejected / record_too_large, the ask stays open,
    and a smaller answer completes the turn."""

    async def review(args: Kind, ctx: Any) -> Any:
        answer = await ctx.step.ask("review", schema=Note, message="a note, please")
        return {"note_length": len(answer.note)}

    tool = durable_tool(tool_definition(name="review", description="asks", input_schema=Kind), review)

    def script(messages: list[dict[str, Any]]) -> ModelResponse:
        if messages[-1]["role"] == "user":
            return ModelResponse(text="", tool_calls=[ToolCall(id="c1", name="review", arguments={"kind": "x"})])
        return ModelResponse(text="done: " + str(messages[-1]["content"]))

    h = define_harness(name="asks", model=ScriptedModel(script), tools=[tool])
    log = open_log(f"sqlite:///{tmp_path}/h.db?max_record_bytes={LIMIT}")
    client = HarnessClient(log=f"sqlite:///{tmp_path}/h.db?max_record_bytes={10 * LIMIT}")
    try:
        async with HarnessHost(log=log) as host:
            session = await host.open(h, session_id="s")
            waiting = await asyncio.wait_for(session.send("review it", input_id="in-1"), 60)
            assert waiting.outcome == "waiting" and waiting.waiting[0].name == "review"
            big = await client.answer("s", "c1", "review", {"note": BIG})
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


async def test_a_client_send_over_the_limit_is_refused_to_it_and_nothing_is_written(tmp_path: Path) -> None:
    await SqliteLog(tmp_path / "h.db").close()  # a worker made the file
    client = HarnessClient(log=f"sqlite:///{tmp_path}/h.db")
    try:
        with pytest.raises(RecordTooLarge, match=r"send or store less, or raise the log's record limit") as refused:
            await client.send("s", "x" * 1_000_001, input_id="in-1", harness="h")
        assert refused.value.limit == DEFAULT_MAX_RECORD_BYTES
        assert await client.log.read("s") == []
    finally:
        await client.close()


# --- harness send ----------------------------------------------------------------------------------


def _make_log(path: Path) -> None:
    async def made() -> None:
        await SqliteLog(path).close()

    asyncio.run(made())


def test_harness_send_of_a_text_over_the_limit_says_so_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    _make_log(tmp_path / "h.db")
    # (in-process: a text this long does not fit in one command-line argument of a new process)
    code = harness_cli(["send", "s-1", "x" * 1_000_001, "--harness", "h", "--log", "sqlite:///h.db"])
    err = capsys.readouterr().err
    assert code == 1, err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith("harness send: a harness.input.message record of session 's-1' is 100")
    assert "more than the session log accepts (1000000 bytes); nothing of it was written" in err
    assert "sqlite:///h.db?max_record_bytes=N" in err
    code = harness_cli(["send", "s-1", "x" * 2000, "--harness", "h", "--log", "sqlite:///h.db?max_record_bytes=1000"])
    err = capsys.readouterr().err
    assert code == 1 and err.count("\n") == 1 and "(1000 bytes)" in err, err

    async def nothing_written() -> None:
        log = SqliteLog(tmp_path / "h.db")
        try:
            assert await log.read("s-1") == []
        finally:
            await log.close()

    asyncio.run(nothing_written())


def test_harness_send_with_a_bad_limit_in_the_url_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    _make_log(tmp_path / "h.db")
    code = harness_cli(["send", "s-1", "hi", "--harness", "h", "--log", "sqlite:///h.db?max_record_bytes=lots"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert "max_record_bytes must be a whole number of bytes above 0" in err and "'lots'" in err


async def test_an_answer_too_large_for_the_log_still_logs_its_usage(tmp_path: Path) -> None:
    """The provider was paid for an answer the log refuses: its usage is logged with the
    failed turn's end (session.usage, harness show), and the turn fails as before."""
    model = ScriptedModel(lambda messages: ModelResponse(text=BIG, usage=Usage(1200, 50_000, "big-model", 0.75)))
    log = open_log(f"sqlite:///{tmp_path}/h.db?max_record_bytes={LIMIT}")
    try:
        async with HarnessHost(log=log) as host:
            session = await host.open(define_harness(name="big", model=model), session_id="s-usage")
            result = await asyncio.wait_for(session.send("answer", input_id="in-1"), 60)
            assert (result.outcome, result.code) == ("failed", "record_too_large"), result
            assert (session.usage.calls, session.usage.input_tokens, session.usage.output_tokens) == (1, 1200, 50_000)
            assert session.usage.cost == 0.75
        records = [e.record for e in await log.read("s-usage")]
        assert [r.TYPE for r in records] == [
            "harness.input.message", "harness.turn.started", "harness.model.usage",
            "harness.turn.finished", "harness.input.settled",
        ]
        usage = records[2]
        assert (usage.turn, usage.index, usage.model, usage.input_tokens, usage.output_tokens) == (1, 0, "big-model", 1200, 50_000)
    finally:
        await log.close()
