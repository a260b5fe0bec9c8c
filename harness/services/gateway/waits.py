"""How long a ``?wait`` request waits: until its turn settles or its seconds pass (that is
``Inputs.wait``), and never longer than its client stays or the server serves.

* The client goes away (``http.disconnect``, e.g. ``curl -m 1``): the wait ends, so the
  tenant's ``?wait`` slot it holds is free again at once, not when the turn ends.
* The server stops (SIGTERM, Ctrl-C: ``stopping`` is set): the wait answers ``running`` at
  once, as one whose seconds passed. The input is in the log already and its turn goes on
  (here after a restart, or on another worker); the client streams the events or asks again
  with the ``input_id``. Without this the server waited for the request up to its graceful
  timeout, then cancelled it: a bare 500 and a traceback, and the worker's drain started late.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable

from starlette.types import Receive

from harness.services.gateway.settlement import RUNNING, Settlement

__all__ = ["wait_while_served"]


async def wait_while_served(settling: Awaitable[Settlement], *, receive: Receive,
                            stopping: asyncio.Event) -> Settlement:
    """``settling``'s settlement, or ``RUNNING`` once ``stopping`` is set or the client left.

    Args:
        settling: the wait (``Inputs.wait``); cancelled when it is not what answers.
        receive: the request's ASGI receive, its body read already: what comes next is
            ``http.disconnect`` (the client left, or the answer was sent).
        stopping: set when the server begins to stop.
    """
    waiting = asyncio.ensure_future(settling)
    stopped = asyncio.ensure_future(stopping.wait())
    gone = asyncio.ensure_future(_disconnected(receive))
    try:
        await asyncio.wait((waiting, stopped, gone), return_when=asyncio.FIRST_COMPLETED)
        if waiting.done():  # (a settlement known at once wins over a stop that came with it)
            return waiting.result()
        return RUNNING  # the server stops, or nobody is there to read the answer
    finally:
        for task in (waiting, stopped, gone):
            task.cancel()
        await asyncio.gather(waiting, stopped, gone, return_exceptions=True)


async def _disconnected(receive: Receive) -> None:
    """Returns when the client has gone (ASGI ``http.disconnect``); no polling: the server
    answers ``receive`` only when something comes."""
    if (await receive())["type"] == "http.disconnect":
        return
    # A server that answers again with a body after the whole body was read (none that we
    # run does) cannot tell us: wait for nothing rather than spin on it.
    await asyncio.Event().wait()
