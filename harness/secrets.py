"""Keeping a session's secrets out of the log and away from the model.

Pure code. A session's secrets are given to ``host.open(..., secrets=)``; their
values must never reach a record (DESIGN: nothing secret in the log).

* A step value holding one is refused (SPEC 2.9); so is a name or an id holding one
  (step, ask and sleep names; input, session and tool call ids: SPEC 2.12): names are
  never rewritten, since a rewritten step name would run its step again after a crash.
* Tool call arguments holding one refuse that call (issue 13, ``runtime.arguments``).
* Every other text (the model's text, tool results, error messages, questions) has the
  secret replaced by a marker ``[secret:<name>]`` (SPEC 5.6).

What counts as holding a secret:

* Secrets of :data:`MIN_SUBSTRING_SECRET` characters or more are found anywhere inside
  a string (dict keys included). Shorter ones (a PIN, a CVV, a tenant number) would
  match ordinary text everywhere (ids, amounts, dates), so they are found only as a
  WHOLE string: a value, a key, an argument, a message that is exactly the secret.
  Numbers are never secrets: only strings are compared.
* Each secret is looked for in these forms: as it is; percent-encoded as URLs carry it
  (``urllib.parse.quote`` with and without ``/`` kept, ``quote_plus``, upper- and
  lower-case hex); JSON-escaped (``json.dumps`` with and without ``ensure_ascii``);
  Python-``repr``-escaped (``repr`` and ``ascii``). NOT caught: other encodings
  (base64, hex, hashes), two levels of escaping, a secret split across strings.

A marker never rebuilds a secret: markers that would contain one (a secret that is a
substring of ``[secret:name]``, or of its name) fall back to a plainer marker, and a
text that would still hold a secret once its markers are in (overlapping secrets,
markers next to text) is replaced whole by a marker.
"""

from __future__ import annotations

import dataclasses
import json
import re
import urllib.parse
from collections.abc import Iterator, Mapping
from types import MappingProxyType
from typing import Any

from pydantic import SecretStr

from harness.errors import DefinitionError, SecretInName
from harness.jsonvalues import json_path
from harness.records import Record

__all__ = [
    "IDENTITY_FIELDS",
    "MIN_SUBSTRING_SECRET",
    "SecretScrubber",
    "given_secrets",
    "redact_record",
    "secret_forms",
    "secret_values",
    "secrets_for_result",
]

MIN_SUBSTRING_SECRET = 8
"""Secrets at least this long are found inside other text; shorter ones only as a whole string."""

_FALLBACK_MARKERS = ("[secret]", "[redacted]", "[hidden]", "***", "#", "")
_HEX = re.compile(r"%[0-9A-F]{2}")


def secret_values(secrets: Mapping[str, str | SecretStr] | None) -> Mapping[str, str]:
    """A read-only name -> plain value mapping (SecretStr unwrapped)."""
    plain: dict[str, str] = {}
    for name, value in (secrets or {}).items():
        plain[name] = value.get_secret_value() if isinstance(value, SecretStr) else str(value)
    return MappingProxyType(plain)


def given_secrets(secrets: object, where: str) -> Mapping[str, str]:
    """:func:`secret_values` of the ``secrets=`` a caller gave ``where`` (``host.open()``,
    ``chat()``), checked first: a value that is not text would be compared as ``str(value)``
    with nothing, or worse, with the wrong thing.

    Raises:
        DefinitionError: not a mapping, a name that is not a string, a value that is
            neither a ``str`` nor a pydantic ``SecretStr``, or a name or value with a lone
            surrogate (no UTF-8 form) (the message never shows a value).
    """
    if secrets is None:
        return secret_values(None)
    if not isinstance(secrets, Mapping):
        raise DefinitionError(
            f"{where} takes secrets= as a mapping of name -> value, not {type(secrets).__name__}: "
            "e.g. secrets={'stripe': 'sk_live_...'}"
        )
    for name, value in secrets.items():
        if not isinstance(name, str) or not name:
            raise DefinitionError(f"{where}: a secret's name must be a non-empty string, not {name!r}")
        if not isinstance(value, str | SecretStr):
            raise DefinitionError(
                f"{where}: secret {name!r} must be a str or a pydantic SecretStr, not {type(value).__name__}"
            )
        if not _utf8(name):  # (it names the secret in the records it is replaced in)
            raise DefinitionError(f"{where}: a secret's name holds a lone surrogate (no UTF-8 form); give its real text")
        if not _utf8(value.get_secret_value() if isinstance(value, SecretStr) else value):
            raise DefinitionError(
                f"{where}: secret {name!r} holds a lone surrogate (text with no UTF-8 form: read with the wrong "
                "codec?); give its real text"
            )
    return secret_values(secrets)


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def secrets_for_result(given: object) -> Mapping[str, str]:
    """:func:`given_secrets` of what a worker's ``secrets_for(session_id, harness_name)``
    hook returned: a mapping of str names to str or ``SecretStr`` values, or None (no
    secrets).

    Raises:
        DefinitionError: anything else (the message names types, never a value).
    """
    if given is not None and not isinstance(given, Mapping):
        raise DefinitionError(
            f"secrets_for returned {type(given).__name__}, not a mapping of name -> value "
            "(or None for no secrets)"
        )
    return given_secrets(given, "secrets_for")


def secret_forms(secret: str) -> set[str]:
    """The forms of ``secret`` that are looked for (see the module docstring)."""
    forms = {secret}
    for quoted in (urllib.parse.quote(secret, safe=""), urllib.parse.quote(secret), urllib.parse.quote_plus(secret)):
        forms.add(quoted)
        forms.add(_HEX.sub(lambda m: m.group().lower(), quoted))
    forms.add(json.dumps(secret)[1:-1])
    forms.add(json.dumps(secret, ensure_ascii=False)[1:-1])
    forms.add(repr(secret)[1:-1])
    forms.add(ascii(secret)[1:-1])
    forms.discard("")
    return forms


class SecretScrubber:
    """Finds and removes secret values in JSON values and text."""

    __slots__ = ("_inside", "_markers", "_whole", "active")

    def __init__(self, secrets: Mapping[str, str]) -> None:
        inside: list[tuple[str, str]] = []  # (form, name) found anywhere in a string
        whole: dict[str, str] = {}  # form -> name, found as a whole string
        for name, value in secrets.items():
            if not value:
                continue
            for form in secret_forms(value):
                whole.setdefault(form, name)
                if len(value) >= MIN_SUBSTRING_SECRET:
                    inside.append((form, name))
        self._inside = sorted(inside, key=lambda i: -len(i[0]))  # longest first
        self._whole = whole
        self.active = bool(whole)
        """Whether there is any secret to find (read on hot paths: no call)."""
        fallback = next(m for m in _FALLBACK_MARKERS if not self.holds(m))
        self._markers: dict[str, str] = {}
        for name in secrets:
            marker = f"[secret:{name}]"
            self._markers[name] = marker if not self.holds(marker) else fallback
        self._markers[""] = fallback

    def __bool__(self) -> bool:
        return bool(self._whole)

    # -- finding -------------------------------------------------------------------------

    def secret_in(self, text: str) -> str | None:
        """The name of a secret ``text`` holds (see the module docstring), else None."""
        name = self._whole.get(text)
        if name is not None:
            return name
        for form, name in self._inside:
            if form in text:
                return name
        return None

    def holds(self, text: str) -> bool:
        return self.secret_in(text) is not None

    def find(self, value: Any, path: str = "$") -> tuple[str, str] | None:
        """The (secret name, path) of the first secret inside ``value``, else None."""
        if not self._whole:
            return None
        for text, where in _strings(value, path):
            name = self.secret_in(text)
            if name is not None:
                return name, where
        return None

    def find_in_name(self, name: str) -> str | None:
        """The secret a name or an id holds, else None."""
        return self.secret_in(name) if self._whole else None

    def check_name(self, kind: str, name: str, *, session_id: str | None = None) -> None:
        """Raise ``SecretInName`` if ``name`` (a ``kind`` such as "step name") holds a secret."""
        found = self.find_in_name(name) if isinstance(name, str) else None
        if found is not None:
            raise SecretInName(kind, secret_name=found, session_id=session_id)

    # -- removing -----------------------------------------------------------------------

    def redact_text(self, text: str) -> str:
        if not self._whole:
            return text
        name = self._whole.get(text)
        if name is not None:
            return self._markers[name]
        spans: list[tuple[int, int, str]] = []
        for form, name in self._inside:
            start = text.find(form)
            while start != -1:
                spans.append((start, start + len(form), name))
                start = text.find(form, start + 1)
        if not spans:
            return text
        spans.sort()
        out: list[str] = []
        cursor = 0
        start0, end0, name0 = spans[0]
        for start, end, name in spans[1:]:
            if start < end0:  # overlaps the span before: one marker for both
                end0 = max(end0, end)
                continue
            out += [text[cursor:start0], self._markers[name0]]
            cursor = end0
            start0, end0, name0 = start, end, name
        out += [text[cursor:start0], self._markers[name0], text[end0:]]
        redacted = "".join(out)
        if self.holds(redacted):  # the markers next to the text made a secret again
            return self._markers[""]
        return redacted

    def redact(self, value: Any) -> Any:
        """A copy of a JSON value with every secret value replaced (keys too)."""
        if not self._whole:
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


IDENTITY_FIELDS = frozenset({"session_id", "input_id", "target_input_id", "tool_call_id", "name", "record_type"})
"""Record fields that name or identify something: never rewritten. The log matches records
by them (a settlement to its input, a result to its call, a stored step to its name), so a
rewritten one would never match again (an input settled under another id is taken anew
forever). One holding a secret is refused before it is written, or, when it came into the
log from elsewhere (a gateway that does not know the worker's secrets), its input settles
``rejected`` / ``secret_in_name`` as it is (``runtime.answers.secret_refusals``)."""


def redact_record(record: Record, scrubber: SecretScrubber) -> Record:
    """A copy of ``record`` with every secret value replaced in its text and JSON fields
    (not in its :data:`IDENTITY_FIELDS`)."""
    if not scrubber:
        return record
    changes: dict[str, Any] = {}
    for f in dataclasses.fields(record):
        if f.name in IDENTITY_FIELDS:
            continue
        value = getattr(record, f.name)
        if isinstance(value, (str, list, dict, tuple)):
            redacted = scrubber.redact(value)
            if isinstance(value, tuple):
                redacted = tuple(redacted)
            if redacted != value:
                changes[f.name] = redacted
    return dataclasses.replace(record, **changes) if changes else record
