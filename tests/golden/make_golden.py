"""Write the golden test vectors: one record of every type, as single-object bytes.

Usage (from the repo root)::

    python tests/golden/make_golden.py           # write files for record types (versions) that have none
    python tests/golden/make_golden.py --force   # overwrite ALL files (breaks compatibility!)

The checked-in ``<type>.bin`` files are the bytes that older code wrote; the test
``test_golden.py`` proves today's codec still decodes them to ``<type>.json``.
Never regenerate existing files to make a failing golden test pass: that hides
exactly the incompatible schema change the test exists to catch. Only add files
for new record types, and for the new version of a changed type (the default mode
does just that): a type whose older schemas are in ``schemas/history`` has its
current version's vector in ``<type>@<version>.bin``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))

from harness.codec import encode  # noqa: E402 - after the sys.path line, to run as a script
from harness.records import (  # noqa: E402
    RECORD_CLASSES,
    AppRecord,
    AskAnswered,
    AskOpened,
    InputAnswer,
    InputCancel,
    InputMessage,
    InputRecords,
    InputSettled,
    ModelResponseRecord,
    ModelRetry,
    ModelUsage,
    Record,
    SleepScheduled,
    StepResult,
    ToolResult,
    ToolStarted,
    TurnFinished,
    TurnResumed,
    TurnStarted,
)

S = "sess-golden-ü-01"
TS = 1_717_171_717_171


def examples() -> list[Record]:
    """One deterministic record per type; unicode and nested JSON on purpose."""
    nested = {
        "a": [1, 2.5, -3, None, True, False],
        "b": {"c": "ünïcødé ✓ 🚀", "d": []},
        "e": "",
    }
    return [
        InputMessage(S, TS, "in-1", "Bonjour, ça va ? 你好 👋", harness="support-bot"),
        InputAnswer(
            S,
            TS + 1,
            "in-2",
            "call-1",
            "approve",
            {"approved": True, "note": "ok — go"},
        ),
        InputRecords(
            S,
            TS + 2,
            "in-3",
            [{"type": "app.order", "id": 7, "lines": [{"sku": "X-1", "qty": 2}]}],
        ),
        InputSettled(
            S,
            TS + 3,
            "in-1",
            "rejected",
            code="input_conflict",
            reason="input_id already used with another payload",
            input_seq=42,
        ),
        InputCancel(S, TS + 3, "cancel:in-1", "in-1"),
        TurnStarted(S, TS + 4, "in-1", 1),
        TurnResumed(S, TS + 5, "in-1", 1, 2, counted=False),
        TurnFinished(
            S,
            TS + 6,
            "in-1",
            1,
            "failed",
            text=None,
            code="model_error",
            error="HTTP 500 ✗",
        ),
        ModelResponseRecord(
            S,
            TS + 7,
            1,
            0,
            text="Let me check… 🔍",
            tool_calls=(
                {
                    "id": "call-1",
                    "name": "search",
                    "arguments": {"q": "café", "filters": nested},
                },
                {"id": "call-2", "name": "noop", "arguments": {}},
            ),
            finish_reason="tool_calls",
            thinking=(
                {"type": "thinking", "thinking": "Sollte ich suchen? 🤔", "signature": "EqQBCgIYAhIM1gbcDa9GJwZA=="},
                {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix/LafPsn4a"},
            ),
        ),
        ToolStarted(S, TS + 8, "call-1", "search", 1),
        StepResult(S, TS + 9, "call-1", "fetch", nested),
        SleepScheduled(S, TS + 10, "call-1", "wait", TS + 60_000),
        AskOpened(
            S,
            TS + 11,
            "call-1",
            "approve",
            "Approve the refund of 12,50 €?",
            {
                "type": "object",
                "properties": {"approved": {"type": "boolean"}},
                "required": ["approved"],
            },
            expires_at=TS + 3_600_000,
        ),
        AskAnswered(S, TS + 12, "call-1", "approve", {"approved": True}, input_id="in-2"),
        ToolResult(
            S,
            TS + 13,
            "call-1",
            "search",
            ["résultat", {"n": 1}],
            is_error=True,
            replaced_by_hook=True,
            code="tool_failed",
        ),
        ModelUsage(S, TS + 15, 1, 0, model="gpt-ü-mini", input_tokens=1234, output_tokens=56, cost=0.00123,
                   tool_call_id="call-agent-ü"),
        ModelRetry(
            S,
            TS + 16,
            1,
            1,
            retry=2,
            wait_until=TS + 4_000,
            error="Rate limit reached — retry later ✗",
            status=429,
            kind="rate_limited",
        ),
        AppRecord(
            S,
            TS + 14,
            "app.note",
            {"type": "app.note", "text": "note ✎", "tags": ["x"]},
            tool_call_id="call-1",
        ),
    ]


def golden_stem(record_type: str) -> str:
    """``<type>`` for a type's first schema version, ``<type>@<n>`` for its n-th."""
    version = 1 + len(list((HERE.parents[1] / "schemas" / "history").glob(f"{record_type}.*.avsc")))
    return record_type if version == 1 else f"{record_type}@{version}"


def plain_fields(record: Record) -> dict[str, Any]:
    """The dataclass fields as JSON-ready values (tuples as lists)."""
    return {
        f.name: list(v) if isinstance(v := getattr(record, f.name), tuple) else v
        for f in dataclasses.fields(record)
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--force",
        action="store_true",
        help="overwrite existing files (breaks compatibility)",
    )
    args = parser.parse_args()
    records = examples()
    missing = {cls.TYPE for cls in RECORD_CLASSES} - {r.TYPE for r in records}
    if missing:
        raise SystemExit(f"add an example to examples() for: {sorted(missing)}")
    for record in records:
        stem = golden_stem(record.TYPE)
        bin_path = HERE / f"{stem}.bin"
        json_path = HERE / f"{stem}.json"
        if bin_path.exists() and not args.force:
            print(f"keep  {bin_path.name}")
            continue
        bin_path.write_bytes(encode(record))
        expected = {"type": record.TYPE, "fields": plain_fields(record)}
        json_path.write_text(json.dumps(expected, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        print(f"wrote {bin_path.name}")


if __name__ == "__main__":
    main()
