"""Output on a terminal that is not UTF-8 (an ASCII or ISO-8859-1 locale, ``LANG=C`` with
Python's locale coercion off, ``PYTHONIOENCODING=ascii``).

The timeline's marks (``·``, ``→``, ``…``) and the status line's spinner are spelt in
ASCII there, and any other character the stream cannot encode (a message's ``é``) is
escaped (``\\xe9``), instead of the command failing with ``UnicodeEncodeError`` halfway
through its output (``harness send`` after its turn had completed).
"""

from __future__ import annotations

import codecs
import sys
from typing import Any

__all__ = ["ERRORS", "PLAIN", "plain_where_not_utf8"]

ERRORS = "harness-plain"
"""The codec error handler that spells what a stream cannot encode (see ``PLAIN``)."""

PLAIN = {"·": "-", "→": "->", "…": "...", **dict.fromkeys("⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏", "*")}
"""The marks the CLI prints, in ASCII."""


def _spell(exc: UnicodeError) -> tuple[str, int]:
    if not isinstance(exc, UnicodeEncodeError):
        raise exc
    bad = exc.object[exc.start:exc.end]
    return "".join(PLAIN.get(ch) or ch.encode("ascii", "backslashreplace").decode("ascii") for ch in bad), exc.end


codecs.register_error(ERRORS, _spell)


def plain_where_not_utf8(*streams: Any) -> None:
    """Give each text stream (default: stdout and stderr) whose encoding is not UTF-8 the
    ``harness-plain`` error handler; a UTF-8 stream, or one that cannot be reconfigured
    (a test's capture), is left as it is."""
    for stream in streams or (sys.stdout, sys.stderr):
        encoding = getattr(stream, "encoding", None)
        if not encoding or not hasattr(stream, "reconfigure"):
            continue
        try:
            if codecs.lookup(encoding).name == "utf-8":
                continue
            stream.reconfigure(errors=ERRORS)
        except (LookupError, ValueError, OSError):  # an unknown codec, a closed stream: as it is
            continue
