"""The secrets a worker gives to its sessions' tools (``ctx.secrets``).

* ``--secrets-dir DIR`` (``HARNESS_SECRETS_DIR``): one file per secret, its name the
  key and its content the value, the layout of a Kubernetes Secret mounted as a
  volume. Dotfiles are skipped (Kubernetes keeps ``..data`` and timestamped folders
  next to the keys); one trailing newline is dropped (``echo`` adds one).
* ``HARNESS_SECRET_<NAME>=value``: one secret each, its key ``<name>`` lower-cased.

A key given both ways is refused. A rotated Secret is picked up without a restart
(:class:`WorkerSecrets`): the folder is checked again at most every
``RECHECK_SECONDS`` when a session starts, and sessions started after a change get the
new values (a running session keeps the ones it started with). Every value, old and
new, is registered with :data:`harness.logs.SECRETS`, so no log line ever shows it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from types import MappingProxyType

from harness.errors import ConfigError
from harness.logs import SECRETS
from harness.services.mounted import RECHECK_SECONDS, Recheck

__all__ = [
    "ENV_PREFIX",
    "RECHECK_SECONDS",
    "WorkerSecrets",
    "load_secrets",
    "secrets_from_dir",
    "secrets_from_env",
    "static_secrets_for",
]

log = logging.getLogger("harness.worker")

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
    return WorkerSecrets(folder, env).current()


def _merged(from_dir: Mapping[str, str], from_env: Mapping[str, str]) -> Mapping[str, str]:
    both = sorted(set(from_dir) & set(from_env))
    if both:
        raise ConfigError(
            f"secret {both[0]!r} is given twice (a file in --secrets-dir and {ENV_PREFIX}{both[0].upper()}): "
            "keep one", setting="--secrets-dir",
        )
    return MappingProxyType({**from_dir, **from_env})


class WorkerSecrets:
    """The secrets a worker gives to the sessions it starts: ``--secrets-dir`` (looked at
    again at most every ``recheck`` seconds, and read again when it changed) and the
    ``HARNESS_SECRET_*`` variables (read once).

    A change that cannot be used (a file that is not UTF-8, a key now also in the
    environment, the folder gone) is logged as a warning and the previous secrets stay.

    Raises:
        ConfigError: at construction, as :func:`load_secrets`.
    """

    def __init__(
        self,
        folder: str | Path | None,
        env: Mapping[str, str],
        *,
        recheck: float = RECHECK_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._folder = Path(folder) if folder else None
        self._env = secrets_from_env(env)
        self._recheck = Recheck([self._folder] if self._folder is not None else [], every=recheck, clock=clock)
        self._current = _merged(secrets_from_dir(self._folder) if self._folder is not None else {}, self._env)
        SECRETS.add(self._current)

    def __len__(self) -> int:
        return len(self._current)

    @property
    def hook(self) -> Callable[[str, str], Mapping[str, str]] | None:
        """The ``Worker(secrets_for=)`` hook: :meth:`secrets_for`, or None when there is
        neither a folder nor a secret to give."""
        return self.secrets_for if self._folder is not None or self._current else None

    def current(self) -> Mapping[str, str]:
        """The secrets now (reading the folder again first if it is time and it changed)."""
        if self._folder is not None and self._recheck.changed():
            self._reload(self._folder)
        return self._current

    def secrets_for(self, session_id: str, harness_name: str) -> Mapping[str, str]:
        """The ``Worker(secrets_for=)`` hook: every session the same secrets."""
        return self.current()

    def _reload(self, folder: Path) -> None:
        try:
            new = _merged(secrets_from_dir(folder), self._env)
        except ConfigError as exc:
            log.warning("the secrets in %s changed but cannot be used (%s); new sessions keep the previous ones",
                        folder, exc)
            return
        SECRETS.add(new)  # before anyone can log one; the old values stay registered too
        old = self._current
        changed = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
        self._current = new
        if changed:
            log.info("the secrets in %s changed (%s); sessions started from now on get them",
                     folder, ", ".join(changed))


def static_secrets_for(secrets: Mapping[str, str]) -> Callable[[str, str], Mapping[str, str]]:
    """A ``secrets_for`` hook giving every session the same secrets."""

    def secrets_for(session_id: str, harness_name: str) -> Mapping[str, str]:
        return secrets

    return secrets_for
