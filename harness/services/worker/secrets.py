"""The secrets a worker gives to its sessions' tools (``ctx.secrets``).

* ``--secrets-dir DIR`` (``HARNESS_SECRETS_DIR``): one file per secret, its name the
  key and its content the value, the layout of a Kubernetes Secret mounted as a
  volume. Dotfiles are skipped (Kubernetes keeps ``..data`` and timestamped folders
  next to the keys); one trailing newline is dropped (``echo`` adds one).
* ``HARNESS_SECRET_<NAME>=value``: one secret each, its key ``<name>`` lower-cased.

A key given both ways is refused. Read once, at start: restart the worker to pick up
a rotated secret. Every value is registered with :data:`harness.logs.SECRETS`, so no
log line ever shows it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from types import MappingProxyType

from harness.errors import ConfigError
from harness.logs import SECRETS

__all__ = ["ENV_PREFIX", "load_secrets", "secrets_from_dir", "secrets_from_env", "static_secrets_for"]

ENV_PREFIX = "HARNESS_SECRET_"


def secrets_from_dir(folder: str | Path) -> dict[str, str]:
    """Every regular file of ``folder`` (not a dotfile): name -> content.

    Raises:
        ConfigError: the folder does not exist, or a file cannot be read as UTF-8.
    """
    path = Path(folder)
    if not path.is_dir():
        raise ConfigError(f"--secrets-dir {folder}: no such folder (mount the Secret there, or fix the path)",
                          setting="--secrets-dir")
    out: dict[str, str] = {}
    for item in sorted(path.iterdir()):
        if item.name.startswith(".") or not item.is_file():  # ..data, ..2024_.., hidden files, folders
            continue
        try:
            text = item.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(
                f"--secrets-dir: cannot read secret {item.name!r} ({type(exc).__name__}); a secret is UTF-8 text",
                setting="--secrets-dir",
            ) from exc
        out[item.name] = text[:-2] if text.endswith("\r\n") else text[:-1] if text.endswith("\n") else text
    return out


def secrets_from_env(env: Mapping[str, str]) -> dict[str, str]:
    """``HARNESS_SECRET_<NAME>=value`` -> ``{"<name>": value}`` (name lower-cased)."""
    return {
        name[len(ENV_PREFIX):].lower(): value
        for name, value in env.items()
        if name.startswith(ENV_PREFIX) and len(name) > len(ENV_PREFIX)
    }


def load_secrets(folder: str | Path | None, env: Mapping[str, str]) -> Mapping[str, str]:
    """The worker's secrets from ``folder`` and the environment, registered for log scrubbing.

    Raises:
        ConfigError: see :func:`secrets_from_dir`; or one key given both ways.
    """
    from_dir = secrets_from_dir(folder) if folder else {}
    from_env = secrets_from_env(env)
    both = sorted(set(from_dir) & set(from_env))
    if both:
        raise ConfigError(
            f"secret {both[0]!r} is given twice (a file in --secrets-dir and {ENV_PREFIX}{both[0].upper()}): "
            "keep one", setting="--secrets-dir",
        )
    secrets = {**from_dir, **from_env}
    SECRETS.add(secrets)
    return MappingProxyType(secrets)


def static_secrets_for(secrets: Mapping[str, str]) -> Callable[[str, str], Mapping[str, str]]:
    """A ``secrets_for`` hook giving every session the same secrets."""

    def secrets_for(session_id: str, harness_name: str) -> Mapping[str, str]:
        return secrets

    return secrets_for
