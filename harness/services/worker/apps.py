"""``--app module:attribute``: the harnesses a worker runs.

Modules are found from the current directory first (as ``uvicorn`` and ``gunicorn``
do), then on ``sys.path``. Every way this can go wrong is one ``ConfigError`` line
that says what to fix.
"""

from __future__ import annotations

import importlib
import os
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from harness.definition import Harness
from harness.errors import ConfigError
from harness.words import with_article

__all__ = ["load_harnesses"]


def _import(module_name: str, spec: str) -> Any:
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and (module_name == exc.name or module_name.startswith(exc.name + ".")):
            raise ConfigError(
                f"--app {spec}: no module named {exc.name!r} (looked in {cwd} and on sys.path); "
                "run the worker from the folder that holds it, or add its folder to PYTHONPATH",
                setting="--app",
            ) from exc
        raise ConfigError(
            f"--app {spec}: importing {module_name!r} failed: {exc} (a package the app needs is missing?)",
            setting="--app",
        ) from exc
    except Exception as exc:
        raise ConfigError(
            f"--app {spec}: importing {module_name!r} failed: {type(exc).__name__}: {exc} "
            "(run with --debug for the traceback)",
            setting="--app",
        ) from exc


def _module_for_path(path: str, attr: str) -> str:
    """What to write instead of the file ``path``: its dotted name if it lies under the current
    folder (where the worker looks first), else to run from the file's own folder."""
    file = Path(os.path.abspath(path.replace("\\", "/")))
    file = file.with_name(file.name.removesuffix(".py"))
    try:
        parts = file.relative_to(os.getcwd()).parts
    except ValueError:
        parts = ()
    if parts and all(part.isidentifier() for part in parts):
        return f"--app {'.'.join(parts)}:{attr} (from the current folder)"
    folder = shlex.quote(str(file.parent))
    return f"cd {folder} and use --app {file.name}:{attr} (or set PYTHONPATH={folder})"


def _harnesses_in(module: Any) -> list[str]:
    return sorted(name for name, value in vars(module).items() if isinstance(value, Harness))


def load_harnesses(specs: Sequence[str]) -> list[Harness]:
    """``module:attribute`` -> harnesses; the attribute may be a Harness, a list of them,
    or a function (without arguments) returning either.

    Raises:
        ConfigError: a malformed spec, a module that cannot be imported, an attribute
            that does not exist or holds no harness.
    """
    out: list[Harness] = []
    for spec in specs:
        module_name, _, attr = spec.partition(":")
        if not module_name or not attr:
            raise ConfigError(
                f"--app takes module:attribute (e.g. myapp.agents:assistant), not {spec!r}", setting="--app"
            )
        if "/" in module_name or "\\" in module_name or module_name.endswith(".py"):
            raise ConfigError(
                f"--app {spec}: {module_name!r} is a file path; --app takes a module name: "
                f"{_module_for_path(module_name, attr)}",
                setting="--app",
            )
        module = _import(module_name, spec)
        value: Any = module
        for part in attr.split("."):
            if not hasattr(value, part):
                found = _harnesses_in(module)
                hint = f"; harnesses in {module_name}: {', '.join(found)}" if found else ""
                raise ConfigError(
                    f"--app {spec}: module {module_name!r} has no attribute {attr!r}{hint}", setting="--app"
                )
            value = getattr(value, part)
        if callable(value) and not isinstance(value, Harness):
            try:
                value = value()
            except Exception as exc:
                raise ConfigError(
                    f"--app {spec}: calling {attr}() failed: {type(exc).__name__}: {exc}", setting="--app"
                ) from exc
        items = value if isinstance(value, (list, tuple)) else [value]
        if not items:
            raise ConfigError(
                f"--app {spec} gives no harness (an empty {type(value).__name__}): point it at the result of "
                "define_harness(...) (or a list of them, or a function returning them)",
                setting="--app",
            )
        for item in items:
            if not isinstance(item, Harness):
                kind = type(item).__name__
                raise ConfigError(
                    f"--app {spec} gives {with_article(kind)}, not a harness: "
                    "point it at the result of "
                    "define_harness(...) (or a list of them, or a function returning them)",
                    setting="--app",
                )
            out.append(item)
    names = [h.name for h in out]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ConfigError(f"--app: two harnesses are named {', '.join(map(repr, twice))}", setting="--app")
    return out
