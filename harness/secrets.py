"""Keeping a session's secrets out of the log and away from the model.

Pure code. A session's secrets are given to ``host.open(..., secrets=)``; their
values must never reach a record (DESIGN: nothing secret in the log). A step
value holding one is refused (SPEC 2.9); every other record and every tool
result shown to the model has the values replaced by ``[secret:<name>]``
(SPEC 5.6).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from types import MappingProxyType
from typing import Any

from pydantic import SecretStr

from harness.jsonvalues import json_path
from harness.records import Record

__all__ = ["SecretScrubber", "redact_record", "secret_values"]


def secret_values(secrets: Mapping[str, str | SecretStr] | None) -> Mapping[str, str]:
    """A read-only name -> plain value mapping (SecretStr unwrapped)."""
    plain: dict[str, str] = {}
    for name, value in (secrets or {}).items():
        plain[name] = value.get_secret_value() if isinstance(value, SecretStr) else str(value)
    return MappingProxyType(plain)


class SecretScrubber:
    """Finds and removes secret values in JSON values and text."""

    __slots__ = ("_items",)

    def __init__(self, secrets: Mapping[str, str]) -> None:
        # Longest first, so a secret that contains another is replaced whole.
        self._items = sorted(((v, k) for k, v in secrets.items() if v), key=lambda i: -len(i[0]))

    def __bool__(self) -> bool:
        return bool(self._items)

    def find(self, value: Any, path: str = "$") -> tuple[str, str] | None:
        """The (secret name, path) of the first secret inside ``value``, else None."""
        for text, where in _strings(value, path):
            for secret, name in self._items:
                if secret in text:
                    return name, where
        return None

    def redact_text(self, text: str) -> str:
        for secret, name in self._items:
            if secret in text:
                text = text.replace(secret, f"[secret:{name}]")
        return text

    def redact(self, value: Any) -> Any:
        """A copy of a JSON value with every secret value replaced (keys too)."""
        if not self._items:
            return value
        if isinstance(value, str):
            return self.redact_text(value)
        if isinstance(value, (list, tuple)):
            return [self.redact(v) for v in value]
        if isinstance(value, dict):
            return {
                (self.redact_text(k) if isinstance(k, str) else k): self.redact(v)
                for k, v in value.items()
            }
        return value


def _strings(value: Any, path: str) -> Iterator[tuple[str, str]]:
    if isinstance(value, str):
        yield value, path
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            yield from _strings(item, json_path(path, i))
    elif isinstance(value, dict):
        for key, item in value.items():
            if isinstance(key, str):
                yield key, path
                yield from _strings(item, json_path(path, key))
            else:
                yield from _strings(item, path)


def redact_record(record: Record, scrubber: SecretScrubber) -> Record:
    """A copy of ``record`` with every secret value replaced in its text and JSON fields."""
    if not scrubber:
        return record
    changes: dict[str, Any] = {}
    for f in dataclasses.fields(record):
        if f.name == "session_id":
            continue
        value = getattr(record, f.name)
        if isinstance(value, (str, list, dict, tuple)):
            redacted = scrubber.redact(value)
            if isinstance(value, tuple):
                redacted = tuple(redacted)
            if redacted != value:
                changes[f.name] = redacted
    return dataclasses.replace(record, **changes) if changes else record
