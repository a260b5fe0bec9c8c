"""``from_uri``: a model adapter from one string, so a worker can take its model from config."""

from __future__ import annotations

from typing import Any

from harness.errors import DefinitionError
from harness.models.base import Model

__all__ = ["from_uri"]

_PROVIDERS = ("openai", "anthropic")


def from_uri(uri: str, **options: Any) -> Model:
    """The model an URI names; ``options`` go to the adapter (``api_key_secret``, ``pricing``,
    ``temperature`` ...).

    Forms:

    * ``openai:<model>`` (``openai:gpt-4.1-mini``): :class:`~harness.models.openai.OpenAIChat`;
    * ``anthropic:<model>`` (``anthropic:claude-sonnet-4-5``):
      :class:`~harness.models.anthropic.AnthropicMessages`;
    * ``<provider>+<base URL>:<model>``: the same on another server, e.g. any
      OpenAI-compatible one: ``openai+http://127.0.0.1:11434/v1:llama3.2``. The base URL
      needs a path (``/v1``); the model is what follows the first ``:`` after that path
      (so model names with ``:`` work: ``openai+http://127.0.0.1:11434/v1:llama3.2:3b``).
      Anthropic's SDK adds ``/v1`` to its base URL itself: give it the API root,
      ``anthropic+http://127.0.0.1:8080/:claude-sonnet-4-5``.

    API keys come from ``options`` (``api_key=``, ``api_key_secret=``) or else the SDK's
    own default (``OPENAI_API_KEY``, ``ANTHROPIC_API_KEY``); never from the URI.

    Raises:
        DefinitionError: an URI of no known form, or an unknown provider.
        MissingExtra: the provider's extra is not installed.
    """
    if not isinstance(uri, str) or ":" not in uri:
        raise DefinitionError(f"model URI {uri!r}: expected provider:model, e.g. 'openai:gpt-4.1-mini'")
    uri = uri.strip()  # from a file or an environment variable, often with a newline
    if any(c.isspace() for c in uri):
        raise DefinitionError(f"model URI {uri!r} holds a space: a model URI has none")
    head, _, rest = uri.partition(":")
    provider, plus, scheme = head.partition("+")
    if provider not in _PROVIDERS:
        raise DefinitionError(f"model URI {uri!r}: unknown provider {provider!r}; known: {', '.join(_PROVIDERS)}")
    base_url: str | None = None
    model = rest
    if plus:
        if scheme not in ("http", "https") or not rest.startswith("//"):
            raise DefinitionError(f"model URI {uri!r}: expected {provider}+http(s)://host[:port]/path:model")
        slash = rest.find("/", 2)
        colon = rest.find(":", slash) if slash != -1 else -1
        if slash == -1 or colon == -1:
            # (Anthropic's SDK adds /v1 to its base URL itself; OpenAI's does not.)
            example = ("anthropic+http://127.0.0.1:8080/:claude-sonnet-4-5 (the API root: the SDK adds /v1)"
                       if provider == "anthropic" else "openai+http://127.0.0.1:11434/v1:llama3.2")
            raise DefinitionError(
                f"model URI {uri!r}: the base URL needs a path and a model after it, e.g. {example}"
            )
        base_url, model = f"{scheme}:{rest[:colon]}", rest[colon + 1:]
    if not model:
        raise DefinitionError(f"model URI {uri!r} names no model")
    if "api_key" in options and options["api_key"] is None:
        options.pop("api_key")
    if provider == "openai":
        from harness.models.openai import OpenAIChat

        return OpenAIChat(model=model, base_url=base_url, **options)
    from harness.models.anthropic import AnthropicMessages

    return AnthropicMessages(model=model, base_url=base_url, **options)
