"""The live event: one text delta of a model answer being streamed."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["LIVE_TEXT_DELTA", "LiveEvent"]

LIVE_TEXT_DELTA = "model.text.delta"


@dataclass(frozen=True, slots=True)
class LiveEvent:
    """A piece of a model answer, as it arrives (never in the log).

    ``turn`` and ``index`` name the model call (as its ``harness.model.response`` will);
    ``retry`` counts its transient failures before this try: a new ``retry`` starts the
    text over. ``position`` is where ``text`` starts in the answer's text (characters),
    so a subscriber can tell a gap or a repeat.

    ``after``: the session's log position when it was published (its last record then,
    at least the turn's ``harness.turn.started``); a reader that merges live events with
    records (``merge_live``, the gateway's SSE) holds it until it has given out the
    record at that position, so no live text comes before the records that precede it.
    None from publishers that do not say (older ones): shown as it comes.
    """

    session_id: str
    turn: int
    index: int
    retry: int
    position: int
    text: str
    ts: int
    type: str = LIVE_TEXT_DELTA
    after: int | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def encode(self) -> bytes:
        """Compact JSON (UTF-8): the value of a message on the live topic."""
        return json.dumps(self.to_json(), separators=(",", ":"), ensure_ascii=False).encode("utf-8")

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> LiveEvent:
        return cls(
            session_id=str(data["session_id"]),
            turn=int(data["turn"]),
            index=int(data["index"]),
            retry=int(data.get("retry", 0)),
            position=int(data.get("position", 0)),
            text=str(data["text"]),
            ts=int(data.get("ts", 0)),
            type=str(data.get("type", LIVE_TEXT_DELTA)),
            after=int(data["after"]) if data.get("after") is not None else None,
        )

    @classmethod
    def decode(cls, raw: bytes) -> LiveEvent:
        """The event of a live topic message.

        Raises:
            ValueError: not a live event.
        """
        try:
            data = json.loads(raw)
            return cls.from_json(data)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ValueError(f"not a live event: {raw[:80]!r}") from exc
