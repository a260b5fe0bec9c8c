"""Property tests of the fold and the planner: a session's life cut by random crashes.

The test simulates the owner's loop of ``harness/runtime/driver.py`` (``drive``,
``_start_turn``, ``_call_model``, ``_run_batch``, ``_run_call``, ``step.do``) on top of
the REAL fold and planner, with its appends: the first model call of a turn made before
``turn.started`` lands (the answer in the start's append, or the start alone first), a
response logged with its batch's ``tool.started``
records (``first_runs``), a final answer with the turn's end. Every append is atomic;
a crash loses the append in flight (and whatever the process did since its last
commit, e.g. a step whose value was not committed yet, or a model answer) and the next
owner starts from a fresh fold of the committed log.

Invariants:
  (a) a step with a committed ``harness.step.result`` is never executed again;
  (b) no committed record is lost or reordered: the live state always equals the
      fold of the log, and the final fold holds every committed record;
  (c) a cut ``replay="never"`` call whose ``tool.started`` committed never runs
      again and ends with a ``cut`` error;
  (d) every call of a completed turn ends with exactly one result;
  (e) every turn finishes;
  plus SPEC 5.7: the model is never asked again for a response that is logged.
"""

from __future__ import annotations

import dataclasses
import random
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from hypothesis import event, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from harness.records import (
    AppRecord,
    InputMessage,
    InputSettled,
    LogEntry,
    ModelResponseRecord,
    Record,
    StepResult,
    ToolResult,
    ToolStarted,
    TurnFinished,
    TurnResumed,
    TurnStarted,
)
from harness.replay import (
    CallModel,
    CompleteTurn,
    FailTurn,
    RunBatch,
    SessionState,
    ToolPolicy,
    conversation,
    first_runs,
    fold,
    plan_turn,
)

S = "s-prop"
UNLIMITED = 10_000


# -- the scenario: tools and a model script -----------------------------------------------------


@dataclass(frozen=True)
class ToolSpec:
    name: str
    replay: str  # safe | never
    steps: int  # step.do calls per run
    appends: int  # app records staged with ctx.append per run


@dataclass(frozen=True)
class Scenario:
    tools: tuple[ToolSpec, ...]
    turns: tuple[tuple[tuple[str, ...], ...], ...]  # turn -> batches -> tool names
    max_attempts: int

    def response(self, turn: int, index: int) -> tuple[str | None, tuple[dict[str, Any], ...]]:
        batches = self.turns[turn - 1]
        if index < len(batches):
            calls = tuple(
                {"id": f"c{turn}.{index}.{pos}", "name": name, "arguments": {"pos": pos}}
                for pos, name in enumerate(batches[index])
            )
            return None, calls
        assert index == len(batches), f"the model was asked past its script: turn {turn} index {index}"
        return f"final {turn}", ()


@st.composite
def scenarios(draw: st.DrawFn) -> Scenario:
    n_tools = draw(st.integers(1, 4))
    tools = tuple(
        ToolSpec(
            f"t{i}",
            draw(st.sampled_from(["safe", "never"])),
            draw(st.integers(0, 3)),
            draw(st.integers(0, 2)),
        )
        for i in range(n_tools)
    )
    names = st.sampled_from([t.name for t in tools])
    batch = st.lists(names, min_size=1, max_size=4).map(tuple)
    turn = st.lists(batch, min_size=1, max_size=3).map(tuple)  # a turn without tools is trivial
    turns = draw(st.lists(turn, min_size=1, max_size=3).map(tuple))
    max_attempts = draw(st.sampled_from([UNLIMITED, UNLIMITED, UNLIMITED, 1, 2, 4]))
    return Scenario(tools, turns, max_attempts)


# -- the world: the log and what really happened ---------------------------------------------------


@dataclass
class World:
    scenario: Scenario
    rng: random.Random
    log: list[LogEntry] = field(default_factory=list)
    next_seq: int = 0
    life: int = 0
    step_runs: Counter[tuple[str, str]] = field(default_factory=Counter)
    tool_runs: Counter[str] = field(default_factory=Counter)
    model_calls: Counter[tuple[int, int]] = field(default_factory=Counter)
    committed_steps: dict[tuple[str, str], Any] = field(default_factory=dict)
    started_in_life: dict[str, list[int]] = field(default_factory=dict)
    result_in_life: dict[str, list[int]] = field(default_factory=dict)
    stray_seqs: set[int] = field(default_factory=set)

    @property
    def tools(self) -> dict[str, ToolSpec]:
        return {t.name: t for t in self.scenario.tools}

    @property
    def policies(self) -> dict[str, ToolPolicy]:
        return {t.name: ToolPolicy(replay=t.replay) for t in self.scenario.tools}  # type: ignore[arg-type]

    def append(self, records: list[Record]) -> list[LogEntry]:
        """One atomic append; seq may skip (Kafka offsets skip transaction markers)."""
        out = []
        for r in records:
            out.append(LogEntry(self.next_seq, r))
            self.next_seq += self.rng.choice((1, 1, 2))
            if isinstance(r, StepResult):
                self.committed_steps.setdefault((r.tool_call_id, r.name), r.value)
            elif isinstance(r, ToolStarted):
                self.started_in_life.setdefault(r.tool_call_id, []).append(self.life)
            elif isinstance(r, ToolResult):
                self.result_in_life.setdefault(r.tool_call_id, []).append(self.life)
        self.log.extend(out)
        return out

    def append_stray(self, record: Record) -> LogEntry:
        """A duplicate a racing writer left behind (the fold must keep the first)."""
        entry = LogEntry(self.next_seq, record)
        self.next_seq += 1
        self.log.append(entry)
        self.stray_seqs.add(entry.seq)
        return entry

    def send_inputs(self) -> None:
        for t in range(1, len(self.scenario.turns) + 1):
            self.append([InputMessage(S, 0, f"in-{t}", f"please do {t}", "h")])


# -- one owner's life: session._drive on the real planner, as a generator of appends ---------------


class Life:
    """An owner from a fresh fold of the committed log until it crashes or has nothing to do."""

    def __init__(self, world: World) -> None:
        world.life += 1
        self.world = world
        self.state: SessionState = fold(S, world.log)
        self.own_turns: set[int] = set()
        self._gen = self._drive()
        self.pending: list[Record] | None = next(self._gen, None)

    @property
    def done(self) -> bool:
        return self.pending is None

    def commit(self) -> None:
        """The in-flight append lands; the owner folds it and goes on to its next append."""
        assert self.pending is not None
        for entry in self.world.append(self.pending):
            self.state.apply_entry(entry)
        self.pending = next(self._gen, None)

    def crash(self) -> None:
        """The process dies: the append in flight is lost."""
        self.pending = None
        self._gen.close()

    # -- the loop ----------------------------------------------------------------------------

    def _drive(self) -> Iterator[list[Record]]:
        while True:
            turn = self.state.active_turn
            if turn is None:
                nxt = next((i for i in self.state.pending_inputs() if i.kind == "message"), None)
                if nxt is None:
                    return
                n = len(self.state.turns) + 1
                self.own_turns.add(n)
                # The first model call runs beside turn.started: a quick answer rides in
                # its append, else the start is appended alone first. A crash in that
                # append loses the answer too.
                answer = self._call_model(CallModel(n, 0), starting=nxt.input_id)
                start = TurnStarted(S, 0, nxt.input_id, n)
                if self.world.rng.random() < 0.5:
                    yield from self._logged(answer, nxt.input_id, head=[start])
                else:
                    yield [start]
                    yield from self._logged(answer, nxt.input_id)
                continue
            if turn.turn not in self.own_turns:
                self.own_turns.add(turn.turn)
                yield [TurnResumed(S, 0, turn.input_id, turn.turn, turn.attempts + 1)]
                continue
            action = plan_turn(self.state, self.world.policies, max_attempts=self.world.scenario.max_attempts)
            assert action is not None
            yield from self._do(action)

    def _do(self, action: Any) -> Iterator[list[Record]]:
        turn = self.state.active_turn
        assert turn is not None
        if isinstance(action, CompleteTurn):
            yield [
                TurnFinished(S, 0, turn.input_id, turn.turn, "completed", action.text),
                InputSettled(S, 0, turn.input_id, "completed"),
            ]
        elif isinstance(action, FailTurn):
            yield [
                TurnFinished(S, 0, turn.input_id, turn.turn, "failed", None, action.code, action.error),
                InputSettled(S, 0, turn.input_id, "failed", action.code, action.error),
            ]
        elif isinstance(action, CallModel):
            yield from self._logged(self._call_model(action), turn.input_id)
        else:
            assert isinstance(action, RunBatch)
            yield from self._run_batch(action)

    def _logged(
        self, response: ModelResponseRecord, input_id: str, head: list[Record] | None = None
    ) -> Iterator[list[Record]]:
        """The answer's append (after ``head``, its turn's start when it rides along):
        with the turn's end (a final answer) or its batch's tool.started records, then
        the batch runs at once."""
        head = head or []
        if not response.tool_calls:
            yield [
                *head,
                response,
                TurnFinished(S, 0, input_id, response.turn, "completed", response.text),
                InputSettled(S, 0, input_id, "completed"),
            ]
            return
        starts = first_runs(response)
        yield [*head, response, *(ToolStarted(S, 0, d.tool_call_id, d.name, d.attempt) for d in starts)]
        yield from self._run_calls([d.tool_call_id for d in starts])

    def _call_model(self, action: CallModel, starting: str | None = None) -> ModelResponseRecord:
        # SPEC 5.7: never ask the model again for a response the log holds.
        logged = {
            (e.record.turn, e.record.index)
            for e in self.world.log
            if isinstance(e.record, ModelResponseRecord)
        }
        assert (action.turn, action.index) not in logged, f"model asked again for {action}"
        self.world.model_calls[(action.turn, action.index)] += 1
        # The request the model gets: this turn's user message, then `index` responses,
        # each followed by the results of all its calls, in call order.
        messages = conversation(self.state, starting=starting)
        last_user = max(i for i, m in enumerate(messages) if m["role"] == "user")
        assert messages[last_user]["content"] == f"please do {action.turn}"
        this_turn = messages[last_user + 1 :]
        assert sum(m["role"] == "assistant" for m in this_turn) == action.index
        expected: list[tuple[str, str | None]] = []
        for index in range(action.index):
            _, calls = self.world.scenario.response(action.turn, index)
            expected.append(("assistant", None))
            expected.extend(("tool", c["id"]) for c in calls)
        assert [(m["role"], m.get("tool_call_id")) for m in this_turn] == expected
        text, calls = self.world.scenario.response(action.turn, action.index)
        return ModelResponseRecord(S, 0, action.turn, action.index, text, calls)

    def _run_batch(self, action: RunBatch) -> Iterator[list[Record]]:
        head: list[Record] = [
            ToolResult(S, 0, d.tool_call_id, d.name, {"error": "cut"}, True, False, "cut")
            for d in action.calls
            if d.action == "cut"
        ]
        head.extend(ToolStarted(S, 0, d.tool_call_id, d.name, d.attempt) for d in action.to_start)
        if head:
            yield head
        yield from self._run_calls([d.tool_call_id for d in action.to_start])

    def _run_calls(self, tool_call_ids: list[str]) -> Iterator[list[Record]]:
        # The calls run concurrently: any of them may append next.
        running = [self._run_call(cid) for cid in tool_call_ids]
        while running:
            call = self.world.rng.choice(running)
            try:
                records = next(call)
            except StopIteration:
                running.remove(call)
                continue
            yield records

    def _run_call(self, tool_call_id: str) -> Iterator[list[Record]]:
        world = self.world
        call = self.state.calls[tool_call_id]  # live: every commit is folded into it
        spec = world.tools[call.name]
        if spec.replay == "never":
            # (c): a never call runs only in the life that committed its one tool.started.
            assert world.started_in_life.get(tool_call_id) == [world.life], (
                f"never call {tool_call_id} runs again: started in lives {world.started_in_life.get(tool_call_id)}, "
                f"now life {world.life}"
            )
        world.tool_runs[tool_call_id] += 1
        values = []
        for i in range(spec.steps):
            name = f"step{i}"
            if name in call.steps:  # step.do: a finished step returns its stored value
                values.append(call.steps[name])
                continue
            # (a): a step whose value committed never runs again.
            assert (tool_call_id, name) not in world.committed_steps, f"step {tool_call_id}/{name} ran again"
            world.step_runs[(tool_call_id, name)] += 1
            value = f"{tool_call_id}/{name}#{world.step_runs[(tool_call_id, name)]}"
            yield [StepResult(S, 0, tool_call_id, name, value)]
            values.append(value)
        records: list[Record] = [
            AppRecord(S, 0, "app", {"type": "app", "call": tool_call_id, "n": k}, tool_call_id)
            for k in range(spec.appends)
        ]
        records.append(ToolResult(S, 0, tool_call_id, call.name, {"steps": values}))
        yield records


# -- the checks -------------------------------------------------------------------------------


def run_to_end(world: World, life: Life) -> Life:
    for _ in range(UNLIMITED):
        if life.done:
            return life
        life.commit()
    raise AssertionError("the session never ended")


def check_final(world: World, life: Life) -> None:
    scenario = world.scenario
    state = fold(S, world.log)
    records = [e.record for e in world.log]

    # (b) the live state is the fold of the log, which holds every committed record.
    assert life.state == state
    assert state.last_seq == world.log[-1].seq
    assert state.anomalies == len(world.stray_seqs)
    for (cid, name), value in world.committed_steps.items():
        assert state.calls[cid].steps[name] == value
    logged_app = [r.body for r in records if isinstance(r, AppRecord)]
    assert [e.body for e in state.app_records] == logged_app
    responses = [r for r in records if isinstance(r, ModelResponseRecord)]
    assert [r for t in state.turns for r in t.responses] == responses

    # (e) every turn finished, every input settled.
    assert state.ended
    assert [t.input_id for t in state.turns] == [f"in-{n}" for n in range(1, len(scenario.turns) + 1)]
    results = Counter(
        e.record.tool_call_id
        for e in world.log
        if isinstance(e.record, ToolResult) and e.seq not in world.stray_seqs
    )
    for turn in state.turns:
        assert turn.finished is not None
        inp = state.inputs[turn.input_id]
        assert inp.settled is not None
        assert inp.settled.outcome == turn.finished.outcome
        if turn.finished.outcome == "failed":
            event("a turn failed: attempts_exhausted")
            assert turn.finished.code == "attempts_exhausted"
            assert turn.attempts > scenario.max_attempts
            continue
        assert turn.finished.outcome == "completed"
        assert turn.finished.text == f"final {turn.turn}"
        # (d) every call of the turn has exactly one result.
        assert len(turn.responses) == len(scenario.turns[turn.turn - 1]) + 1
        for response in turn.responses:
            for c in response.tool_calls:
                assert results[c["id"]] == 1, f"{c['id']} has {results[c['id']]} results"
    assert all(n <= 1 for n in results.values())

    for cid, call in state.calls.items():
        spec = world.tools[call.name]
        if call.result is None:
            continue
        if call.result.code == "cut":
            # (c) only a never call is cut, and only once its tool.started committed and
            # its first run did not reach its result.
            event("a never call was cut")
            assert spec.replay == "never"
            assert call.attempts == 1
            assert world.started_in_life[cid][0] < world.result_in_life[cid][0]
            assert world.tool_runs[cid] <= 1
        else:
            # The result the tool built used each step's FIRST committed value.
            assert call.result.content == {"steps": [call.steps[f"step{i}"] for i in range(spec.steps)]}
            if call.attempts > 1:
                event("a safe call ran again")
            if spec.replay == "never":
                assert world.tool_runs[cid] == 1
                assert world.started_in_life[cid] == world.result_in_life[cid]
            app = [e.body for e in state.app_records if e.tool_call_id == cid]
            assert app == [{"type": "app", "call": cid, "n": k} for k in range(spec.appends)]

    # (a) a committed step value is its LAST run's: nothing ran the step after the commit.
    for (cid, name), runs in world.step_runs.items():
        if runs > 1:
            event("a step ran again after its value was lost")
        if (cid, name) in world.committed_steps:
            assert world.committed_steps[(cid, name)] == f"{cid}/{name}#{runs}"

    # SPEC 5.7 (also asserted when the model is called): one logged response per ask
    # that got through; the model may be asked twice only if a crash lost the first.
    assert set(world.model_calls) >= {(r.turn, r.index) for r in responses}


def check_refold(world: World, k: int) -> None:
    """Folding a prefix then re-reading the whole log gives the fold of the log."""
    k = min(k, len(world.log))
    state = fold(S, world.log[:k])
    for entry in world.log:
        state.apply_entry(entry)
    assert state == fold(S, world.log)


# -- the tests ----------------------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(
    scenario=scenarios(),
    crashes=st.lists(st.integers(0, 12), max_size=8),
    rng=st.randoms(use_true_random=False),
    refold_at=st.integers(0, 200),
)
def test_crash_points_keep_the_invariants(
    scenario: Scenario, crashes: list[int], rng: random.Random, refold_at: int
) -> None:
    world = World(scenario, rng)
    world.send_inputs()
    life = Life(world)
    for commits_before_crash in crashes:
        for _ in range(commits_before_crash):
            if life.done:
                break
            life.commit()
        assert life.state == fold(S, world.log)
        life.crash()
        life = Life(world)
    check_final(world, run_to_end(world, life))
    check_refold(world, refold_at)


class SessionLives(RuleBasedStateMachine):
    """Commits and crashes in any order; the invariants hold after every one."""

    world: World
    life: Life

    @initialize(scenario=scenarios(), rng=st.randoms(use_true_random=False))
    def start(self, scenario: Scenario, rng: random.Random) -> None:
        self.world = World(scenario, rng)
        self.world.send_inputs()
        self.life = Life(self.world)

    @rule(n=st.integers(1, 6))
    def commit(self, n: int) -> None:
        for _ in range(n):
            if self.life.done:
                return
            self.life.commit()

    @rule()
    def crash(self) -> None:
        self.life.crash()
        self.life = Life(self.world)

    @rule(pick=st.integers(0, 1000))
    def stray_duplicate(self, pick: int) -> None:
        """A second step value or tool result for one already committed."""
        candidates = [
            e.record
            for e in self.world.log
            if isinstance(e.record, (StepResult, ToolResult)) and e.seq not in self.world.stray_seqs
        ]
        if not candidates:
            return
        record = candidates[pick % len(candidates)]
        if isinstance(record, StepResult):
            stray: Record = dataclasses.replace(record, value="stray")
        else:
            stray = dataclasses.replace(record, content="stray", is_error=True)
        self.life.state.apply_entry(self.world.append_stray(stray))  # the owner reads it too

    @invariant()
    def live_state_is_the_fold_of_the_log(self) -> None:
        if hasattr(self, "life"):
            assert self.life.state == fold(S, self.world.log)

    def teardown(self) -> None:
        if hasattr(self, "life"):
            check_final(self.world, run_to_end(self.world, self.life))


SessionLives.TestCase.settings = settings(max_examples=150, stateful_step_count=30, deadline=None)
TestSessionLives = SessionLives.TestCase
