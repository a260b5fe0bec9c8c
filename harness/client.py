"""``HarnessClient``: what another service needs to use sessions run by workers.

It only produces inputs and reads committed records; it never drives a turn. The
same can be done from any language with the Avro schemas alone (``schemas/README.md``).

    client = HarnessClient(bootstrap="kafka:9092", topic_prefix="acme")
    receipt = await client.send("s-1", "check out order 42", harness="acme/assistant", input_id="in-1")
    settled = await client.wait_settled("s-1", receipt, timeout=60)

Every send returns an :class:`InputReceipt`: the input's id and its log position, so
waiting for its settlement reads from there on, never from the start of the log. Reads
follow the log through :func:`harness.log.follow.subscribe`: on Kafka one shared tailing
consumer per partition per process, however many waiters.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections import OrderedDict
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from harness.clock import duration_seconds
from harness.context import check_app_records
from harness.errors import DefinitionError, InvalidId
from harness.ids import answer_input_id, check_id, check_sent_input_id
from harness.jsonvalues import answer_copy, check_message
from harness.live import LiveEvent, merge_live
from harness.log import check_log
from harness.log.base import SessionLog
from harness.log.follow import subscribe
from harness.records import (
    InputAnswer,
    InputCancel,
    InputMessage,
    InputRecords,
    InputSettled,
    LogEntry,
    Record,
)
from harness.replay.payload import PAYLOAD_FIELDS, input_payload

__all__ = ["HarnessClient", "InputReceipt"]

SENT_REMEMBERED = 10_000
"""How many of its latest inputs a client remembers the positions of, for
``wait_settled(session, input_id)`` without a receipt."""

_SETTLING = frozenset(
    {InputMessage.TYPE, InputAnswer.TYPE, InputRecords.TYPE, InputCancel.TYPE, InputSettled.TYPE}
)
"""What ``wait_settled`` reads of a session: its inputs and their settlements (on Kafka
the rest of a turn's records are not even decoded)."""


@dataclass(frozen=True, slots=True)
class InputReceipt:
    """An input the log accepted: its ``input_id`` and its log ``position`` (``LogEntry.seq``).

    Pass it to :meth:`HarnessClient.wait_settled`, which then reads from ``position`` on.
    Resending an ``input_id`` has no second effect: the receipt of a resend points at the
    resent record, and the settlement of the first one may lie before it (wait with the
    first receipt, or with the ``input_id`` alone to look through the session's history).
    """

    session_id: str
    input_id: str
    position: int

def _check_options(bootstrap: object, topic_prefix: object, partitions: object, client_config: object) -> None:
    """Refuse options of ``HarnessClient`` that would fail only at its first call, or never.

    Raises:
        DefinitionError: what is wrong, and what to give instead.
    """
    if bootstrap is not None and (not isinstance(bootstrap, str) or not bootstrap.strip()):
        raise DefinitionError(
            f"HarnessClient takes bootstrap= as a string 'host:port[,host:port]', not {bootstrap!r}: "
            "e.g. bootstrap='127.0.0.1:9092'"
        )
    if not isinstance(topic_prefix, str) or not topic_prefix.strip():
        raise DefinitionError(f"HarnessClient takes topic_prefix= as a non-empty string, not {topic_prefix!r}")
    if partitions is not None and (isinstance(partitions, bool) or not isinstance(partitions, int) or partitions < 1):
        raise DefinitionError(
            f"HarnessClient(partitions=) must be a whole number of at least 1, or None (read from the broker), "
            f"not {partitions!r}"
        )
    if client_config is not None and not isinstance(client_config, Mapping):
        # (its type only: a config may hold a password)
        raise DefinitionError(
            f"HarnessClient takes client_config= as a dict of librdkafka settings, not {type(client_config).__name__}"
        )


def _timeout_seconds(timeout: object) -> float | None:
    """``wait_settled``'s ``timeout``: None, or a timedelta or a number of seconds, zero or more."""
    if timeout is None:
        return None
    try:
        seconds = duration_seconds(timeout, "wait_settled(timeout=)")
    except ValueError as exc:
        raise DefinitionError(f"{exc}, or None to wait as long as it takes") from None
    if seconds < 0:
        raise DefinitionError(f"wait_settled(timeout=) must be zero or more seconds, or None, not {timeout!r}")
    return seconds


class HarnessClient:
    """Send inputs to sessions and read their records.

    Args:
        bootstrap: Kafka bootstrap servers (``host:port[,host:port]``); or
        log: any session log, or its URL (``sqlite:///harness.db``,
            ``kafka://host:9092?topic_prefix=acme``: opened and closed by the client).
        topic_prefix: the topics' prefix on Kafka.
        partitions: None (the default): the sessions topic's partition count is read
            from the broker. A number is checked against the topic (one of another
            shape is refused).
        client_config: librdkafka settings (security ...), copied.

    On Kafka the client never creates a topic: workers (or ``harness topics create``)
    do. Its first call raises ``TopicNotFound`` while the sessions topic is missing.
    """

    def __init__(
        self,
        *,
        bootstrap: str | None = None,
        topic_prefix: str = "harness",
        partitions: int | None = None,
        client_config: Mapping[str, Any] | None = None,
        log: SessionLog | str | None = None,
    ) -> None:
        if (bootstrap is None) == (log is None):
            raise ValueError("give bootstrap= (Kafka) or log=, one of them")
        _check_options(bootstrap, topic_prefix, partitions, client_config)
        if isinstance(log, str):
            from harness.log import open_client_log

            options = {"client_config": dict(client_config or {})} if log.startswith("kafka://") else {}
            self.log: SessionLog = open_client_log(log, **options)
            self._owns_log = True
        elif log is None:
            from harness.log.kafka.log import KafkaLog

            log = KafkaLog(
                bootstrap=bootstrap or "", topic_prefix=topic_prefix, partitions=partitions,
                client_config=client_config, create_topics=False,
            )
            self.log = log
            self._owns_log = True
        else:
            self.log = check_log(log)
            self._owns_log = False
        # (session, input id) -> {payload: position of the first record this client sent with
        # it}, the payload sent last at the end. A resend is settled on the first record of
        # its payload; a reuse of the id with another payload on its own (input_seq).
        # (bounded: the latest SENT_REMEMBERED inputs; pass the receipt to wait on older ones)
        self._sent: OrderedDict[tuple[str, str], dict[tuple[Any, ...], int]] = OrderedDict()
        # (session, position of a record this client sent) -> the first position of its payload
        self._first_of: OrderedDict[tuple[str, int], int] = OrderedDict()

    @staticmethod
    def _now() -> int:
        return int(time.time() * 1000)

    async def _submit(self, record: Record, input_id: str) -> InputReceipt:
        check_id(record.session_id, "session id")
        check_id(input_id, "input id")
        entry = await self.log.submit(record)
        key = (record.session_id, input_id)
        payload = input_payload(record.TYPE, {name: getattr(record, name) for name in PAYLOAD_FIELDS[record.TYPE]})
        # A resend (a retry after a lost reply) keeps the first position of its payload: that
        # record is the one the owner settles, possibly before the resent one. The same id
        # with another payload is another request: its own position (it settles input_conflict).
        sent = self._sent.setdefault(key, {})
        sent[payload] = min(entry.seq, sent.pop(payload, entry.seq))  # (re-put: the last sent is last)
        self._first_of[(record.session_id, entry.seq)] = sent[payload]
        self._sent.move_to_end(key)
        while len(self._sent) > SENT_REMEMBERED:
            self._sent.popitem(last=False)
        while len(self._first_of) > SENT_REMEMBERED:
            self._first_of.popitem(last=False)
        return InputReceipt(record.session_id, input_id, entry.seq)

    async def send(
        self, session_id: str, text: str, *, harness: str | None = None, input_id: str | None = None
    ) -> InputReceipt:
        """Send a user message; resending an ``input_id`` with the same text has no second
        effect; with another text it is settled ``rejected`` / ``input_conflict``."""
        check_message(text, session_id)
        if harness is not None and (not isinstance(harness, str) or not harness):
            raise DefinitionError(
                f"send(harness=) takes the name of a harness (define_harness(name=...)) or None, not {harness!r}"
            )
        input_id = f"in-{uuid.uuid4().hex}" if input_id is None else check_sent_input_id(input_id)
        return await self._submit(InputMessage(session_id, self._now(), input_id, text, harness), input_id)

    async def answer(
        self, session_id: str, tool_call_id: str, name: str, value: Any, *, input_id: str | None = None
    ) -> InputReceipt:
        """Answer a ``step.ask``; the owner validates it against the ask's schema.

        Without ``input_id`` the answer's id depends on its value
        (``harness.ids.answer_input_id``): the same answer sent again is one input, and
        one the owner refused can be corrected by sending the corrected value.

        Raises:
            InvalidId: ``tool_call_id`` is not a usable id, ``name`` not a non-empty string.
        """
        check_id(tool_call_id, "tool call id")
        if not isinstance(name, str) or not name:
            raise InvalidId(f"the name of an ask must be a non-empty string, not {name!r}", kind="ask name")
        value = answer_copy(value)
        input_id = answer_input_id(tool_call_id, name, value) if input_id is None else input_id
        return await self._submit(
            InputAnswer(session_id, self._now(), input_id, tool_call_id, name, value), input_id
        )

    async def append_records(
        self, session_id: str, records: list[dict[str, Any]], *, input_id: str | None = None
    ) -> InputReceipt:
        """Append app records to a session (once per ``input_id``)."""
        checked = check_app_records(records)
        input_id = f"rec-{uuid.uuid4().hex}" if input_id is None else check_sent_input_id(input_id)
        return await self._submit(InputRecords(session_id, self._now(), input_id, checked), input_id)

    async def cancel(self, session_id: str, input_id: str) -> InputReceipt:
        """Cancel an input: its turn stops at its next boundary and settles ``aborted`` (a
        queued input never runs). Returns the receipt of the cancel request itself (its
        input id is ``cancel:<input_id>``); ``wait_settled(session_id, input_id)`` tells
        how the cancelled input ended."""
        check_id(input_id, "input id")
        cancel_id = f"cancel:{input_id}"
        return await self._submit(InputCancel(session_id, self._now(), cancel_id, input_id), cancel_id)

    def events(
        self, session_id: str, after: int | None = None, *, live: bool = False
    ) -> AsyncIterator[LogEntry] | AsyncIterator[LogEntry | LiveEvent]:
        """The session's committed records from position ``after`` on (all if None), live.

        Each entry's ``seq`` is its position: pass the last one seen as ``after`` to resume.
        With ``live=True`` (Kafka), the text deltas of model answers streamed from now on
        come too, as ``LiveEvent`` objects between the records, from the ``<prefix>.live``
        topic the workers publish to (best effort, never in the log; see ``harness.live``).
        Other logs have no live topic: there only the records come. The whole history
        (``after=None``) starts where the session starts in the log (on Kafka: from the
        partition's checkpoint), not at the log's beginning.
        """
        check_id(session_id, "session id")
        if after is not None and (isinstance(after, bool) or not isinstance(after, int)):
            raise DefinitionError(
                f"events(after=) takes a position (the seq of the last entry seen) or None, not {after!r}"
            )
        committed = self._committed_events(session_id, after)
        settings = getattr(self.log, "settings", None)
        if not live or settings is None or not hasattr(self.log, "partition_for"):
            return committed
        deltas = self._live_events(session_id, self._now())  # taken now: an answer to a message sent next is seen whole
        return merge_live(committed, deltas, after=after)

    async def _live_events(self, session_id: str, since_ms: int) -> AsyncGenerator[LiveEvent, None]:
        """The session's deltas on the live topic from ``since_ms``. The log is started first:
        a client's first call may be ``events(live=True)`` (its partition count is read from
        the broker then), which raised RuntimeError ('await start() first') at the call."""
        from harness.live.kafka import kafka_live_events

        log: Any = self.log  # (a Kafka log: it has settings and partition_for)
        await log.start()
        settings = log.settings
        deltas: Any = kafka_live_events(
            bootstrap=settings.bootstrap,
            topic_prefix=settings.topic_prefix,
            partition=log.partition_for(session_id),
            session_id=session_id,
            since_ms=since_ms,
            client_config=settings.client_config,
        )
        async with contextlib.aclosing(deltas):
            async for event in deltas:
                yield event

    async def _committed_events(
        self, session_id: str, after: int | None = None, types: frozenset[str] | None = None
    ) -> AsyncGenerator[LogEntry, None]:
        stream = subscribe(self.log, session_id, after=after, dead_letter=False, types=types)
        async with contextlib.aclosing(stream) as entries:
            async for entry in entries:
                yield entry

    async def wait_settled(
        self, session_id: str, input: InputReceipt | str, *, timeout: float | timedelta | None = None  # noqa: A002
    ) -> InputSettled:
        """Wait until the owner settled the input; returns its verdict.

        ``input``: the receipt of ``send``/``answer``/``append_records`` (the wait reads
        from the input's position on), or an ``input_id`` alone (the wait looks through
        the session's whole history).

        ``timeout``: seconds (or a ``timedelta``); None waits as long as it takes.

        Raises:
            TimeoutError: not settled within ``timeout`` seconds.
            DefinitionError: ``input`` is neither a receipt nor an input id, or ``timeout``
                not a duration of zero or more.
            InvalidId: ``session_id`` (or the input id) is not a usable id.
        """
        check_id(session_id, "session id")
        if not isinstance(input, InputReceipt | str):
            raise DefinitionError(
                f"wait_settled() takes the receipt of send/answer/append_records or an input id, "
                f"not {type(input).__name__}"
            )
        if isinstance(input, str):
            check_id(input, "input id")
        timeout_s = _timeout_seconds(timeout)
        mine: int | None
        after: int | None
        if isinstance(input, InputReceipt):
            input_id = input.input_id
            # From the first record this client sent with that payload under that id (a
            # resend's own receipt points at the resend, and the first may have settled before it).
            mine = self._first_of.get((session_id, input.position), input.position)
            after = mine - 1
        else:
            input_id, after = input, None
            sent = self._sent.get((session_id, input), {})
            mine = list(sent.values())[-1] if sent else None  # (the payload sent last)
        first: int | None = None  # position of the first input record of this id seen
        committed = self._committed_events(session_id, after, _SETTLING)
        try:
            async with asyncio.timeout(timeout_s), contextlib.aclosing(committed) as entries:
                async for entry in entries:
                    record = entry.record
                    if record.IS_INPUT and getattr(record, "input_id", None) == input_id and first is None:
                        first = entry.seq
                    if isinstance(record, InputSettled) and record.input_id == input_id:
                        # The verdict on the record this client sent: a reuse of the id with
                        # another payload is settled on its own position (input_seq).
                        settles = record.input_seq if record.input_seq is not None else first
                        if mine is None or settles == mine:
                            return record
        except TimeoutError:
            if timeout_s is None:
                raise
            raise TimeoutError(
                f"input {input_id!r} of session {session_id!r} was not settled within {timeout_s:g} s; "
                "it stays in the log and its owner settles it when it runs"
            ) from None
        raise AssertionError("unreachable: events() never ends")

    async def close(self) -> None:
        if self._owns_log:
            await self.log.close()

    async def __aenter__(self) -> HarnessClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
