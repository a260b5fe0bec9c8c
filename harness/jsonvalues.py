"""Plain-JSON values: the checked copy a step returns, its size, its text.

Pure functions, no I/O. A step's value is stored as JSON text, so what a step
returns on its first run must equal what a run after a crash reads back
(SPEC 2.2): ``json_copy`` makes that copy and refuses anything JSON cannot
carry, naming the path of the bad part (SPEC 2.7).
"""

from __future__ import annotations

import json
import math
from typing import Any

from harness.errors import StepValueError

__all__ = ["dumps", "json_copy", "json_path", "loads"]


def dumps(value: Any) -> str:
    """Compact JSON text; refuses NaN/Infinity."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def loads(text: str) -> Any:
    return json.loads(text)


def json_path(parent: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{parent}[{key}]"
    if key.isidentifier():
        return f"{parent}.{key}"
    return f"{parent}[{json.dumps(key, ensure_ascii=False)}]"


def json_copy(value: Any, *, path: str = "$", what: str = "step value") -> Any:
    """A deep copy of ``value`` as plain JSON (tuples become lists).

    Raises:
        StepValueError: naming the path of the first part that is not JSON
            (datetime, set, bytes, Decimal, objects, pydantic models, NaN and
            Infinity, non-string dict keys).
    """
    if value is None or value is True or value is False:
        return value
    if isinstance(value, str):
        return str(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return int(value)
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            raise StepValueError(f"{what} at {path} is {value!r}, which JSON cannot carry", path=path)
        return float(value)
    if isinstance(value, (list, tuple)):
        return [json_copy(item, path=json_path(path, i), what=what) for i, item in enumerate(value)]
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise StepValueError(
                    f"{what} at {path} has a dict key {key!r} of type {type(key).__name__}; "
                    "JSON object keys must be strings",
                    path=path,
                )
            out[str(key)] = json_copy(item, path=json_path(path, key), what=what)
        return out
    hint = ""
    if hasattr(value, "model_dump"):
        hint = " (a pydantic model: return model.model_dump(mode='json'))"
    elif type(value).__name__ in {"datetime", "date", "time"}:
        hint = " (return value.isoformat())"
    elif isinstance(value, (bytes, bytearray)):
        hint = " (store the bytes elsewhere and return their id, or base64-encode them)"
    raise StepValueError(
        f"{what} at {path} is a {type(value).__name__}, which is not JSON{hint}", path=path
    )
