"""A thread that notices when a host's event loop stops running, and keeps its leases.

Async code that blocks (``time.sleep``, ``requests.post``, a long computation in an
``async def`` tool or step function) stops the event loop, and with it the poller that
renews the host's leases (SQLite). Without this thread, a block longer than the lease
lets another owner take the session over and run the step that is blocking a second
time: the one thing the harness promises never happens. So while the loop is stalled:

* after ``warn_after`` seconds it logs one WARNING naming where the loop is stuck (the
  innermost frame of the loop's thread outside the standard library) and what to do,
  and counts the stall (``harness_event_loop_stalls_total``: at once, since a loop hung
  for good never ends its stall); its length goes to ``harness_event_loop_stall_seconds``
  when it ends;
* it renews the held leases that are due itself, on this thread (``renew_blocking`` of
  the log's writers; a log without it, e.g. Kafka's, fences by partition instead), for
  at most ``keep_leases_for`` seconds (5 minutes, like Kafka's ``max.poll.interval.ms``):
  a loop stuck for longer is taken to be hung, so its leases lapse (one ERROR) and other
  owners take its sessions over, fencing it.

A frozen or dead process freezes or loses this thread too: its leases lapse as before.
"""

from __future__ import annotations

import io
import logging
import sys
import sysconfig
import threading
import time
import tokenize
import traceback
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.errors import FencedError, LogError
from harness.observability import metrics

if TYPE_CHECKING:
    import asyncio

    from harness.runtime.ownership import Ownership

__all__ = ["KEEP_LEASES_FOR_S", "LoopWatchdog"]

log = logging.getLogger("harness.host")

KEEP_LEASES_FOR_S = 300.0
"""How long a stalled loop's leases are still renewed by the watchdog."""

_STDLIB = tuple(str(Path(p).resolve()) for p in {sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["platstdlib"]})


class LoopWatchdog:
    """Watches one event loop from a daemon thread (start it on the loop's thread).

    Args:
        held: the ownerships whose leases to keep (called on the watchdog's thread).
        warn_after: seconds of stall before the WARNING.
        check_every: how often the thread looks.
    """

    def __init__(
        self,
        held: Callable[[], Iterable[Ownership]],
        *,
        warn_after: float,
        check_every: float = 0.5,
        keep_leases_for: float = KEEP_LEASES_FOR_S,
    ) -> None:
        self._held = held
        self._warn_after = warn_after
        self._check_every = check_every
        self._keep_leases_for = keep_leases_for
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread = 0
        self._answered = True
        self._asked_at = 0.0
        self._warned = False
        self._gave_up = False
        self.renewals = 0  # leases renewed by this thread (for tests and curiosity)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        if self.running:
            return
        self._loop, self._loop_thread = loop, threading.get_ident()
        self._stop.clear()
        self._answered = True
        self._thread = threading.Thread(target=self._watch, name="harness-loop-watchdog", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)

    # -- the thread ---------------------------------------------------------------------

    def _watch(self) -> None:
        loop = self._loop
        assert loop is not None
        while not self._stop.wait(self._check_every):
            now = time.monotonic()
            if self._answered:  # the loop ran since the last look: ask again
                self._answered = False
                self._asked_at = now
                try:
                    loop.call_soon_threadsafe(self._answer)
                except RuntimeError:  # the loop is closed
                    return
                continue
            try:
                self._stalled(now - self._asked_at)
            except Exception as exc:  # noqa: BLE001 - the watchdog must outlive a bad pass
                log.warning("loop watchdog: %s", exc)

    def _answer(self) -> None:
        """On the loop: it runs."""
        self._answered = True
        if self._warned:
            stalled = time.monotonic() - self._asked_at
            log.info("the event loop runs again after %.0f s", stalled)
            if not self._gave_up:  # (a stall that outlived the lease keeping was reported then)
                metrics.loop_stall(stalled)
        self._warned = self._gave_up = False

    def _stalled(self, seconds: float) -> None:
        if seconds >= self._warn_after and not self._warned:
            self._warned = True
            metrics.loop_stalled()
            log.warning(
                "the event loop has not run for %.0f s, blocked at %s: blocking calls in async code stop every "
                "session of this process; make the step function or the tool a plain def (they run on threads) "
                "or use asyncio.to_thread(...)%s",
                seconds, self._where(),
                f" (its leases are kept for up to {self._keep_leases_for:.0f} s)" if self._holds_leases() else "",
            )
        if seconds <= self._keep_leases_for:
            self._renew_due()
        elif not self._gave_up and self._holds_leases():
            self._gave_up = True
            metrics.loop_stall(seconds)
            log.error(
                "the event loop has not run for %.0f s: this process stops renewing its leases, so other owners "
                "take its sessions over (and fence it)", seconds,
            )

    def _holds_leases(self) -> bool:
        return any(callable(getattr(o.writer, "renew_blocking", None)) for o in self._snapshot())

    def _snapshot(self) -> list[Ownership]:
        try:
            return list(self._held())
        except RuntimeError:  # changed by the loop as it woke up: next look
            return []

    def _renew_due(self) -> None:
        for ownership in self._snapshot():
            writer = ownership.writer
            renew: Any = getattr(writer, "renew_blocking", None)
            now = ownership.clock.now()
            if not callable(renew) or now < ownership.next_renewal:
                continue
            try:
                renew()
            except FencedError:
                continue  # lost: the loop finds out at its next write
            except LogError as exc:
                log.warning("loop watchdog: renewing the lease of session %s: %s", ownership.session_id, exc)
                continue
            ownership.next_renewal = now + ownership.lease.total_seconds() / 3
            self.renewals += 1

    def _where(self) -> str:
        frame = sys._current_frames().get(self._loop_thread)
        if frame is None:
            return "an unknown place"
        stack = traceback.extract_stack(frame)
        mine = [f for f in stack if not str(Path(f.filename).resolve()).startswith(_STDLIB)]
        at = (mine or stack)[-1]
        line = _without_comment(at.line or "")
        code = f" ({line})" if line else ""
        return f"{at.filename}:{at.lineno} in {at.name}{code}"


def _without_comment(line: str) -> str:
    """A source line without its trailing ``# comment`` (a ``#`` inside a string stays)."""
    if "#" not in line:
        return line
    try:
        for token in tokenize.generate_tokens(io.StringIO(line).readline):
            if token.type == tokenize.COMMENT:
                return line[: token.start[1]].rstrip()
    except (tokenize.TokenError, SyntaxError):  # a line that is not whole on its own
        pass
    return line
