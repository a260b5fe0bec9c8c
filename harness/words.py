"""English for messages: the article of a noun a message names at run time."""

from __future__ import annotations

__all__ = ["with_article"]


def with_article(noun: str) -> str:
    """``noun`` after ``a`` or ``an`` by its first sound: ``an input id``, ``a session id``,
    ``an ask name``, ``a user``, ``an int``. (Spelling-based: the nouns our messages name
    start with no silent h.)"""
    first = noun[:1].lower()
    vowel = first != "" and first in "aeiou" and not noun.lower().startswith(("us", "uni", "eu", "one"))
    return f"{'an' if vowel else 'a'} {noun}"
