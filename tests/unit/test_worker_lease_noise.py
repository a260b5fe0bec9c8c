"""Two workers on one SQLite file share its sessions: the one that finds a session held
by the other waits for it at INFO, not WARNING (it is how they share the file; an
operator learns to ignore a warning that is normal). A script's host keeps its warning."""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from harness import define_harness, durable_tool, tool_definition
from harness.client import HarnessClient
from harness.log.sqlite import SqliteLog
from harness.models import ModelResponse, ScriptedModel, ToolCall
from harness.runtime.worker import Worker


class Args(BaseModel):
    pass


async def test_a_worker_waiting_for_another_workers_lease_says_so_at_info(tmp_path: Path, caplog) -> None:
    path = tmp_path / "shared.db"
    entered = asyncio.Event()
    release = asyncio.Event()

    async def slow(args: Args, ctx: Any) -> str:
        entered.set()
        await release.wait()
        return "ok"

    def app() -> Any:
        tool = durable_tool(tool_definition(name="slow", description="d", input_schema=Args), slow)
        return define_harness(name="shared", tools=[tool], model=ScriptedModel([
            ModelResponse(tool_calls=[ToolCall(id="c1", name="slow", arguments={})]), ModelResponse(text="done"),
        ]))

    logs = [SqliteLog(path), SqliteLog(path)]
    workers = [Worker(log=log, harnesses=[app()], owner_id=f"w{k}", lease=timedelta(seconds=30),
                      poll_interval=timedelta(milliseconds=5)) for k, log in enumerate(logs)]
    stop = asyncio.Event()
    client = HarnessClient(log=SqliteLog(path))
    with caplog.at_level(logging.INFO, logger="harness"):
        runs = [asyncio.create_task(w.run(stop)) for w in workers]
        try:
            receipt = await client.send("s-1", "go", harness="shared", input_id="in-1")
            await asyncio.wait_for(entered.wait(), 30)
            for _ in range(400):  # both saw the input; the one that lost the claim waits
                if "waiting for the lease of session s-1" in caplog.text:
                    break
                await asyncio.sleep(0.01)
            release.set()
            settled = await asyncio.wait_for(client.wait_settled("s-1", receipt), 30)
            assert settled.outcome == "completed"
        finally:
            release.set()
            stop.set()
            await asyncio.gather(*runs)
            await client.close()
            for log in logs:
                await log.close()
    waits = [r for r in caplog.records if "waiting for the lease of session s-1" in r.getMessage()]
    assert waits, caplog.text  # the loser said it waits
    assert all(r.levelno == logging.INFO for r in waits), [(r.levelname, r.getMessage()) for r in waits]
