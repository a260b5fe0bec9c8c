"""A blocking Kafka client call awaited on a daemon thread of its own.

Not ``asyncio.to_thread``: a call on the default pool holds it up (while the broker is
down, reads may hold every thread of it until their deadline), and ``asyncio.run`` waits
for that pool at exit, so a command stopped by Ctrl-C in the middle of a 5-second probe
of a broker that does not answer went on, silent, until the probe gave up. A daemon
thread is awaited while its caller waits, and left behind when the caller stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["on_own_thread"]


async def on_own_thread(fn: Callable[..., None], *args: Any, name: str = "harness-kafka-probe") -> None:
    """``fn(*args)`` on a new daemon thread; its exception is raised here."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()

    def settle(error: BaseException | None) -> None:
        if done.done():
            return
        if error is None:
            done.set_result(None)
        else:
            done.set_exception(error)

    def run() -> None:
        error: BaseException | None = None
        try:
            fn(*args)
        except BaseException as exc:  # noqa: BLE001 - handed to the awaiting coroutine
            error = exc
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: nobody waits
            loop.call_soon_threadsafe(settle, error)

    threading.Thread(target=run, name=name, daemon=True).start()
    await done
