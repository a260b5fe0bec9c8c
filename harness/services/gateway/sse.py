"""Server-Sent Events for one session: framing and the stream. PURE framing, one generator.

The wire, per the HTML spec's ``text/event-stream``:

* ``retry`` and a ``hello`` event first (no ``id``, so it never moves a client's cursor);
* one event per committed record: ``id:`` its log position, ``event:`` its type,
  ``data:`` ``{"seq", "type", "ts", "data"}``;
* ``: heartbeat`` comments while idle, so proxies keep the connection open;
* live-only events (model text deltas) with no ``id``.

A later copy of an input (the same ``input_id`` and payload: SPEC 7.2, it has no effect;
racing producers may leave one in the log) is the event ``harness.input.resent``, its
``data`` naming the input, its record type and the position of the copy that counts
(``first_position``), never its payload: a client never reads a message or app records
twice, and never waits for the copy to settle.

A client resumes with ``Last-Event-ID`` (or ``?after=``): the stream starts strictly
after that position, with no gap and no duplicate.

Records come from :func:`harness.log.follow.subscribe` (every stream of a process
shares one reader of the log: per log on SQLite/memory, per partition on Kafka); live
events from a :class:`~harness.live.LiveSource` (the worker of ``harness serve`` in this
process, or the Kafka live topic), subscribed before the hello is sent, so a client
that waits for the hello before it sends a message misses none of its answer's deltas.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import OrderedDict
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import Any

from harness.live import LiveEvent, LiveOrder, LiveSource
from harness.log.follow import subscribe
from harness.records import LogEntry
from harness.replay import SessionState
from harness.replay.resends import FirstInputs

__all__ = ["RESENT_EVENT", "answering", "entry_json", "event_frame", "resent_json", "session_stream"]

RETRY_MS = 1000
MAX_FRAMES_PER_WRITE = 64
"""Events queued for a stream that go out in one write at most."""


def event_frame(event: str, data: Any, *, id: int | None = None,  # noqa: A002 - the SSE field name
                ascii_only: bool = False) -> bytes:
    if ascii_only:
        text = json.dumps(data, ensure_ascii=True, separators=(",", ":"), default=str)
        head = (f"id: {id}\n" if id is not None else "") + f"event: {event}\n"
        return (head + f"data: {text}\n\n").encode("ascii")
    lines = []
    if id is not None:
        lines.append(f"id: {id}")
    lines.append(f"event: {event}")
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"), default=str)
    lines.extend(f"data: {line}" for line in text.split("\n"))
    try:
        return ("\n".join(lines) + "\n\n").encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: JSON escapes keep the frame valid UTF-8
        return event_frame(event, json.loads(json.dumps(data, default=str)), id=id, ascii_only=True)


def entry_json(entry: LogEntry, public_session_id: str) -> dict[str, Any]:
    data = entry.data
    data["session_id"] = public_session_id
    return {"seq": entry.seq, "type": entry.type, "ts": entry.record.ts, "data": data}


FRAME_CACHE = 4096
"""Encoded frames kept: the streams of one session send the very same bytes per record."""
_frames: OrderedDict[tuple[str, int], bytes] = OrderedDict()


RESENT_EVENT = "harness.input.resent"


def resent_json(entry: LogEntry, public_session_id: str, first_position: int) -> dict[str, Any]:
    """The event of a later copy of an input: which input, and where the one that counts is."""
    data = {"session_id": public_session_id, "input_id": getattr(entry.record, "input_id", None),
            "resent_type": entry.record_type, "first_position": first_position}
    return {"seq": entry.seq, "type": RESENT_EVENT, "ts": entry.record.ts, "data": data}


def record_frame(entry: LogEntry, public_session_id: str, resent_of: int | None = None) -> bytes:
    """The frame of a committed record, encoded once for every stream of its session.

    Keyed by the LOG's session id (tenant included) and position: a position is unique
    within a session, and the public id is a function of the log's id. ``resent_of``:
    the record is a later copy of the input at that position (a fact of the log too).
    """
    key = (entry.session_id, entry.seq)
    frame = _frames.get(key)
    if frame is None:
        if resent_of is not None:
            frame = event_frame(RESENT_EVENT, resent_json(entry, public_session_id, resent_of), id=entry.seq)
        else:
            frame = event_frame(entry.type, entry_json(entry, public_session_id), id=entry.seq)
        _frames[key] = frame
        if len(_frames) > FRAME_CACHE:
            _frames.popitem(last=False)
    return frame


def answering(state: SessionState) -> bool:
    """Whether the session may be streaming a model answer now: a turn runs and no tool
    call of its last answer is still open (an ask waiting for days is not answering)."""
    turn = state.active_turn
    if turn is None:
        return False
    last = turn.last_response
    if last is None:
        return True
    calls = state.calls
    return all((call := calls.get(c["id"])) is not None and call.finished for c in last.tool_calls)


def live_frame(event: LiveEvent, public_session_id: str) -> bytes:
    data = event.to_json() if hasattr(event, "to_json") else dict(event)  # type: ignore[call-overload]
    data["session_id"] = public_session_id
    return event_frame(str(data.get("type", "live")), data)


async def session_stream(
    log: Any,
    live: LiveSource,
    *,
    log_session_id: str,
    public_session_id: str,
    after: int,
    heartbeat_s: float,
    register: Callable[[asyncio.Queue[Any]], Callable[[], None]],
    known: SessionState | None = None,
) -> AsyncGenerator[bytes, None]:
    """The SSE byte stream of one session from ``after`` on; ends when the server closes it.

    ``register(queue)`` lets the server push ``_END``-like closing into the stream; it
    returns the function that unregisters. ``known``: the session folded at least up to
    ``after`` (its inputs tell a resend after ``after`` from a first copy).
    """
    firsts = FirstInputs(known)
    order = LiveOrder(after)
    queue: asyncio.Queue[Any] = asyncio.Queue(maxsize=1024)

    async def pump(items: AsyncIterator[Any], kind: str, ends_stream: bool) -> None:
        try:
            async for item in items:
                await queue.put((kind, item))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - the stream says why and ends
            await queue.put(("error", exc))
            return
        if ends_stream:
            await queue.put(("end", None))

    unregister = register(queue)
    # Registered now, before the hello; first the answer being streamed as far as it came
    # (a page reloaded half-way through an answer gets its start back).
    deltas = live.subscribe(log_session_id, so_far=True, after=after, running=known is not None and answering(known))
    records = subscribe(log, log_session_id, after=after, dead_letter=False)  # a reader writes nothing
    tasks = [
        asyncio.create_task(pump(records, "entry", True)),
        asyncio.create_task(pump(deltas, "live", False)),
    ]
    try:
        yield f"retry: {RETRY_MS}\n\n".encode()
        yield event_frame("hello", {"session_id": public_session_id, "after": after, "heartbeat_s": heartbeat_s})
        while True:
            try:
                first = await asyncio.wait_for(queue.get(), heartbeat_s)
            except TimeoutError:
                yield b": heartbeat\n\n"
                continue
            # What queued meanwhile goes out in the same write (a turn's records come in
            # bursts): one send through the server and one read for the client, not one each.
            batch = [first]
            while len(batch) < MAX_FRAMES_PER_WRITE and not queue.empty():
                batch.append(queue.get_nowait())
            frames: list[bytes] = []
            for kind, item in batch:
                if kind == "entry":
                    frames.append(record_frame(item, public_session_id, firsts.see(item.seq, item.record)))
                    frames.extend(live_frame(e, public_session_id) for e in order.record(item.seq))
                elif kind == "live":
                    # (held until the records it follows went out: its turn's turn.started first)
                    frames.extend(live_frame(e, public_session_id) for e in order.live(item))
                else:  # an error, the end, or the server is closing: what came before it goes first
                    if kind == "error":
                        frames.append(event_frame("error", {"error": type(item).__name__, "message": str(item),
                                                            "resume": "reconnect with Last-Event-ID"}))
                    if frames:
                        yield b"".join(frames)
                    return
            yield b"".join(frames)
    finally:
        unregister()
        deltas.close()
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        with contextlib.suppress(Exception):
            await records.aclose()
