"""A harness whose model comes from ``from_uri``: the worker tests point it at the local
provider test server (``harness.testing.model_server``) through the environment.

``HARNESS_TEST_MODEL_URI``: the model URI (e.g. ``openai+http://127.0.0.1:PORT/v1:test-model``).
``HARNESS_TEST_HOLD_FILE``: while this file exists, the ``hold`` tool waits (after writing
``<file>.holding``), so a test can kill the worker while a tool runs.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from harness import define_harness, durable_tool, tool_definition
from harness.definition import Harness
from harness.models import from_uri

API_KEY = "sk-test-worker-key-000"


class HoldArgs(BaseModel):
    label: str


async def hold_impl(args: HoldArgs, ctx: Any) -> dict[str, Any]:
    hold = Path(os.environ.get("HARNESS_TEST_HOLD_FILE", "/nonexistent/hold"))
    runs = await ctx.step.do(f"ran:{args.label}", lambda: 1)
    while hold.exists():
        Path(f"{hold}.holding").write_text(str(os.getpid()))
        await asyncio.sleep(0.05)
    return {"held": args.label, "step": runs}


HOLD = durable_tool(
    tool_definition(name="hold", description="Waits while the hold file exists", input_schema=HoldArgs),
    hold_impl,
)


def assistant() -> Harness:
    """Made when the worker loads the app (the environment is read then, by the app)."""
    return define_harness(
        name="tests/real-model",
        model=from_uri(os.environ["HARNESS_TEST_MODEL_URI"], api_key=API_KEY),
        tools=[HOLD],
        system_prompt="You are a test.",
        durability={"model_backoff": __import__("datetime").timedelta(milliseconds=50)},
    )
