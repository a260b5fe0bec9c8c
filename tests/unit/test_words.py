"""harness.words: the article of a noun a message names at run time."""

from __future__ import annotations

import pytest

from harness.words import with_article


@pytest.mark.parametrize(("noun", "says"), [
    ("input id", "an input id"), ("session id", "a session id"), ("ask name", "an ask name"),
    ("step name", "a step name"), ("int", "an int"), ("Decimal", "a Decimal"), ("user", "a user"),
    ("Exception", "an Exception"), ("tool call id", "a tool call id"), ("", "a "),
])
def test_with_article(noun: str, says: str) -> None:
    assert with_article(noun) == says
