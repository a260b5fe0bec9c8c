"""The replay layer is pure: it imports no log backend, no network, no asyncio, no clock.

STYLE "The shape": the fold and the planner import no Kafka, no sqlite3, no asyncio,
no clock; this keeps the boundary honest.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

import harness.replay

REPLAY_DIR = Path(harness.replay.__file__).parent
ROOT = REPLAY_DIR.parent.parent  # the directory that holds the ``harness`` package

# Never in the replay layer, directly or through what it imports.
FORBIDDEN = (
    "sqlite3",
    "socket",
    "ssl",
    "selectors",
    "confluent_kafka",
    "asyncio",
    "concurrent.futures",
    "threading",
    "subprocess",
    "urllib.request",
    "http.client",
    "fastavro",
    "jsonschema",
    "pydantic",
    "harness.log",
    "harness.runtime",
    "harness.codec",
    "harness.clock",
)
# Not imported by the replay modules themselves either (a clock or a random source
# would make a replay depend on when or where it runs).
FORBIDDEN_DIRECT = (*FORBIDDEN, "time", "datetime", "random", "uuid", "os", "harness.secrets")
# What the replay layer may import of the rest of the package.
ALLOWED_HARNESS = ("harness.records", "harness.jsonvalues")

# Only what the import brings in counts: the interpreter's site hooks (.pth files)
# may load modules such as threading before any test code runs.
_PROBE = """
import json, sys
before = set(sys.modules)
{prelude}
import harness.replay
print(json.dumps(sorted(set(sys.modules) - before)))
"""

# Load ``harness.replay`` without running ``harness/__init__.py`` (which imports the
# whole library): the replay layer's own import closure.
_BYPASS_PACKAGE_INIT = f"""
import types
pkg = types.ModuleType("harness")
pkg.__path__ = [{str(ROOT / "harness")!r}]
sys.modules["harness"] = pkg
"""


def _modules_imported_by_replay(prelude: str = "") -> set[str]:
    code = _PROBE.format(prelude=prelude)
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return set(json.loads(out.stdout))


def _offenders(modules: set[str], forbidden: tuple[str, ...]) -> list[str]:
    return sorted(m for m in modules for f in forbidden if m == f or m.startswith(f + "."))


def test_replay_layer_import_closure_has_no_io_module() -> None:
    modules = _modules_imported_by_replay(_BYPASS_PACKAGE_INIT)
    assert "harness.replay.planner" in modules  # the probe really imported it
    assert _offenders(modules, FORBIDDEN) == []
    harness_modules = {m for m in modules if m.startswith("harness.") and not m.startswith("harness.replay")}
    # harness.errors comes in through harness.jsonvalues (StepValueError), and harness.words
    # (the article of a message's noun: imports nothing) through its messages.
    assert harness_modules <= {*ALLOWED_HARNESS, "harness.errors", "harness.words"}


def test_import_harness_replay_pulls_in_no_io_module() -> None:
    modules = _modules_imported_by_replay()
    assert "harness.replay" in modules
    assert _offenders(modules, FORBIDDEN) == []


def _imports(path: Path) -> list[str]:
    names: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path.name}: use absolute imports"
            assert node.module is not None
            names.append(node.module)
            # ``from concurrent import futures`` imports concurrent.futures.
            names.extend(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Call) and getattr(node.func, "id", None) == "__import__":
            names.append("__import__")
        elif isinstance(node, ast.Attribute) and node.attr == "import_module":
            names.append("importlib.import_module")
    return names


REPLAY_FILES = sorted(REPLAY_DIR.glob("*.py"))


def test_replay_files_are_found() -> None:
    assert {p.name for p in REPLAY_FILES} >= {"__init__.py", "state.py", "planner.py", "conversation.py"}


@pytest.mark.parametrize("path", REPLAY_FILES, ids=lambda p: p.name)
def test_no_replay_file_imports_an_io_module(path: Path) -> None:
    names = _imports(path)
    assert _offenders(set(names), FORBIDDEN_DIRECT) == []
    assert "__import__" not in names and "importlib.import_module" not in names
    for name in names:
        root = name.split(".")[0]
        if root == "harness":
            ok = name.startswith("harness.replay") or any(
                name == a or name.startswith(a + ".") for a in ALLOWED_HARNESS
            )
            assert ok, f"{path.name} imports {name}: the replay layer may only use {ALLOWED_HARNESS}"
