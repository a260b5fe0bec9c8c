"""Plain-JSON values: the one check of what the log can hold, the checked copy, its text.

Pure functions, no I/O. A step's value is stored as JSON text, so what a step
returns on its first run must equal what a run after a crash reads back
(SPEC 2.2): ``json_copy`` makes that copy and refuses anything the log cannot
carry, naming the path of the bad part (SPEC 2.7). Everything it accepts the
codec stores (a property test holds the two together). It refuses:

* what JSON has no word for: datetimes, sets, bytes, Decimals, objects, pydantic
  models, NaN and Infinity, non-string dict keys;
* strings (values or keys) with a lone surrogate (``"\\ud800"``): they have no
  UTF-8 form, and records are UTF-8;
* integers outside the signed 64-bit range: other languages read the records too
  (Java and Go parse JSON integers as 64-bit longs, Avro's ``long`` is 64 bits), so
  a bigger integer would be stored fine here and be wrong or refused elsewhere;
* nesting deeper than :data:`MAX_JSON_DEPTH` containers.
"""

from __future__ import annotations

import json
import math
from typing import Any

from harness.errors import EmptyMessage, StepValueError
from harness.words import with_article

__all__ = [
    "INT64_MAX",
    "INT64_MIN",
    "MAX_JSON_DEPTH",
    "answer_copy",
    "check_message",
    "check_text",
    "dumps",
    "json_copy",
    "json_path",
    "loads",
    "storable_text",
]

MAX_JSON_DEPTH = 64
"""Most nested containers (lists, objects) a value may have: ``[[1]]`` has 2.

Readers in other languages stop somewhere (Rust's serde_json at 128 by default,
with the record's own envelope around the value), and Python's own recursion
limit is near 1000; 64 is far below both and far above any sane value."""

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1


# Built once: json.dumps with non-default options builds a new encoder per call.
_encode = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode


_encode_str = json.encoder.encode_basestring  # (what _encode does with a str, without its frame)


def dumps(value: Any) -> str:
    """Compact JSON text; refuses NaN/Infinity."""
    return _encode_str(value) if type(value) is str else _encode(value)


def loads(text: str) -> Any:
    return json.loads(text)


def _has_surrogate(text: str) -> bool:
    if text.isascii():
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def storable_text(text: str) -> str:
    """``text`` with every lone surrogate written as ``\\udXXX`` (for error messages)."""
    if not _has_surrogate(text):
        return text
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def check_text(text: Any, *, what: str, path: str = "$") -> str:
    """``text`` if it is a string the log can hold; ``StepValueError`` otherwise."""
    if not isinstance(text, str):
        raise StepValueError(f"{what} must be a string, not {type(text).__name__}", path=path)
    if _has_surrogate(text):
        raise StepValueError(
            f"{what} at {path} holds a lone surrogate ({storable_text(text)[:60]!r}), which has no UTF-8 form",
            path=path,
        )
    # (a str subclass as its text, as JSON writes it: a (str, Enum) member is "red", not its str() "Color.RED")
    return text if type(text) is str else str.__str__(text)


def answer_copy(value: Any) -> Any:
    """An ask's answer as plain JSON: a pydantic model instance (the ask's own schema, as a
    person's code builds it) as its JSON dump, anything else as :func:`json_copy` takes it."""
    kind = type(value)
    if hasattr(kind, "model_fields") and callable(getattr(kind, "model_dump", None)):
        value = value.model_dump(mode="json")  # (a pydantic model, known by its shape: no pydantic import here)
    return json_copy(value, what="answer")


def check_message(text: Any, session_id: str | None = None) -> str:
    """A user message's text: a string the log can hold, and not empty (``EmptyMessage``)."""
    check_text(text, what="the message text")
    if not text:
        raise EmptyMessage(session_id)
    return str(text)


def json_path(parent: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{parent}[{key}]"
    if key.isidentifier():
        return f"{parent}.{key}"
    return f"{parent}[{json.dumps(key, ensure_ascii=_has_surrogate(key))}]"


def json_copy(value: Any, *, path: str = "$", what: str = "step value") -> Any:
    """A deep copy of ``value`` as plain JSON (tuples become lists).

    Raises:
        StepValueError: naming the path of the first part the log cannot hold
            (see the module docstring).
    """
    try:
        return _copy(value, path, what, 0)
    except StepValueError as exc:
        # The error names the path; the walk's frames (two a level, up to MAX_JSON_DEPTH levels)
        # say nothing more and made a logged traceback ~300 lines long: it starts here instead.
        raise exc.with_traceback(None) from None


def _copy(value: Any, path: str, what: str, depth: int) -> Any:
    if value is None or value is True or value is False:
        return value
    if isinstance(value, str):
        return check_text(value, what=what, path=path)
    if isinstance(value, int) and not isinstance(value, bool):
        if not INT64_MIN <= value <= INT64_MAX:
            raise StepValueError(
                f"{what} at {path} is an integer outside the signed 64-bit range, which other "
                "readers of the log cannot hold (store it as a string)",
                path=path,
            )
        return int(value)
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            raise StepValueError(f"{what} at {path} is {value!r}, which JSON cannot carry", path=path)
        return float(value)
    if isinstance(value, (list, tuple, dict)) and depth >= MAX_JSON_DEPTH:
        raise StepValueError(
            f"{what} at {path} nests deeper than {MAX_JSON_DEPTH} levels of lists and objects",
            path=path,
        )
    if isinstance(value, (list, tuple)):
        return [_copy(item, json_path(path, i), what, depth + 1) for i, item in enumerate(value)]
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise StepValueError(
                    f"{what} at {path} has a dict key {storable_text(repr(key))[:60]} of type {type(key).__name__}; "
                    "JSON object keys must be strings",
                    path=path,
                )
            if _has_surrogate(key):
                raise StepValueError(
                    f"{what} at {path} has a key with a lone surrogate ({storable_text(key)[:60]!r}), "
                    "which has no UTF-8 form",
                    path=path,
                )
            out[key if type(key) is str else str.__str__(key)] = _copy(item, json_path(path, key), what, depth + 1)
        return out
    hint = ""
    if hasattr(value, "model_dump"):
        hint = " (a pydantic model: return model.model_dump(mode='json'))"
    elif type(value).__name__ in {"datetime", "date", "time"}:
        hint = " (return value.isoformat())"
    elif isinstance(value, (bytes, bytearray)):
        hint = " (store the bytes elsewhere and return their id, or base64-encode them)"
    elif isinstance(value, (set, frozenset)):
        hint = " (return sorted(value) or list(value))"
    raise StepValueError(f"{what} at {path} is {with_article(type(value).__name__)}, which is not JSON{hint}", path=path)
