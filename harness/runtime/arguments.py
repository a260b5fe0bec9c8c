"""The argument rule (issue 13, SPEC 7.6): a tool runs with exactly the model's arguments.

Arguments are never rewritten: a tool given ``order_id="ord-[secret:k]1"`` instead of
``"ord-11"`` would charge, ship or email the wrong thing. A call whose arguments hold
a session secret (a model can only have it from the user's text) is refused instead:
it never runs, its result is a tool error naming the argument's path, and the model
may try again. Its logged arguments are redacted (that call never runs, so no replay
needs them); every other call's arguments are logged exactly as the model gave them,
so a run after a crash gets the very same arguments.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from harness.records import ToolResult
from harness.secrets import SecretScrubber

__all__ = ["SECRET_ARGUMENTS_CODE", "refuse_secret_arguments", "refusal"]

SECRET_ARGUMENTS_CODE = "secret_in_arguments"


def refusal(scrubber: SecretScrubber, arguments: Any) -> dict[str, Any] | None:
    """The tool error for arguments holding a session secret, or None if they hold none."""
    found = scrubber.find(arguments) if scrubber else None
    if found is None:
        return None
    secret, path = found
    return {
        "error": SECRET_ARGUMENTS_CODE,
        "message": (
            f"the argument at {path} contains a session secret ({secret!r}); the call was "
            "not run. Secrets reach tools through ctx.secrets, never through arguments: "
            "call the tool again without it."
        ),
        "path": path,
    }


def refuse_secret_arguments(
    session_id: str, now_ms: int, calls: Sequence[dict[str, Any]], scrubber: SecretScrubber
) -> list[ToolResult]:
    """The refusal results of the calls whose arguments hold a session secret."""
    refused: list[ToolResult] = []
    if not scrubber:
        return refused
    for call in calls:
        content = refusal(scrubber, call["arguments"])
        if content is not None:
            refused.append(
                ToolResult(session_id, now_ms, call["id"], call["name"], content, True, False, SECRET_ARGUMENTS_CODE)
            )
    return refused
