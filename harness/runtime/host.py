"""``HarnessHost``: opens durable sessions on a session log."""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Mapping
from datetime import timedelta

from pydantic import SecretStr

from harness.clock import Clock, SystemClock
from harness.definition import Harness
from harness.live import LivePublisher
from harness.log import open_log
from harness.log.base import SessionLog
from harness.replay import fold
from harness.runtime.session import Session
from harness.secrets import secret_values

__all__ = ["HarnessHost"]


class HarnessHost:
    """Runs durable sessions of one or more harnesses on a session log.

    Args:
        log: a ``SessionLog`` or a URL for ``open_log``.
        lease: how long an owner's claim on a session lasts without renewal;
            another process may take a session over once it expired.
        clock: the time source (a ``FakeClock`` in tests).
        owner_id: this host's name in ownership records (default host:pid:random).
        poll_interval: how often an owned session looks for inputs that other
            processes put in the log (answers, records, messages).
        live: where text deltas of streamed model answers go for other processes
            (a ``KafkaLivePublisher``; workers on Kafka set one). In-process
            subscribers (``session.events(live=True)``) get them in any case.
    """

    def __init__(
        self,
        *,
        log: SessionLog | str,
        lease: timedelta = timedelta(seconds=30),
        clock: Clock | None = None,
        owner_id: str | None = None,
        poll_interval: timedelta = timedelta(milliseconds=200),
        live: LivePublisher | None = None,
    ) -> None:
        self.log: SessionLog = open_log(log) if isinstance(log, str) else log
        self._owns_log = isinstance(log, str)
        self.lease = lease
        self.clock: Clock = clock or SystemClock()
        self.owner_id = owner_id or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.poll_interval = poll_interval.total_seconds()
        self.live = live
        self._sessions: list[Session] = []

    async def open(
        self,
        harness: Harness,
        *,
        session_id: str,
        secrets: Mapping[str, str | SecretStr] | None = None,
    ) -> Session:
        """A handle on the session, its state rebuilt from the log.

        Opening claims nothing: the first write (``send``, ``recover``, ...) does.
        """
        state = fold(session_id, await self.log.read(session_id))
        session = Session(
            host=self, harness=harness, session_id=session_id, secrets=secret_values(secrets), state=state
        )
        self._sessions.append(session)
        return session

    async def close(self) -> None:
        for session in self._sessions:
            await session.close()
        self._sessions.clear()
        if self._owns_log:
            await self.log.close()

    async def __aenter__(self) -> HarnessHost:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
