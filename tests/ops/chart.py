"""Rendering the chart with helm, and reading what it rendered."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from ops_tools import CHART, KUBE_VERSION, python_tool, run, tool

RELEASE = "t"


def write_values(path: Path, values: Mapping[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(dict(values)))
    return path


def template(values: Path | None = None, *, release: str = RELEASE, check: bool = True) -> tuple[int, str, str]:
    """``helm template`` (always for Kubernetes KUBE_VERSION): (exit code, manifests, stderr)."""
    argv = [tool("helm"), "template", release, str(CHART), "--kube-version", KUBE_VERSION]
    if values is not None:
        argv += ["-f", str(values)]
    proc = run(argv, check=check)
    return proc.returncode, proc.stdout, proc.stderr


def render(values: Path | None = None, *, release: str = RELEASE) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(template(values, release=release)[1]) if d]


def validate(manifests: str, workdir: Path) -> str:
    """``kubernetes-validate --strict`` for KUBE_VERSION; returns its output (fails on any error)."""
    path = workdir / "manifests.yaml"
    path.write_text(manifests)
    proc = run([*python_tool("kubernetes-validate"), "-k", KUBE_VERSION, "--strict", str(path)], check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "ERROR" not in out, f"kubernetes-validate failed:\n{out}"
    return out


def find(docs: list[dict[str, Any]], kind: str, name_suffix: str = "") -> dict[str, Any]:
    matches = [d for d in docs if d["kind"] == kind and d["metadata"]["name"].endswith(name_suffix)]
    assert len(matches) == 1, f"expected one {kind} named *{name_suffix}, found {[d['metadata']['name'] for d in matches]}"
    return matches[0]


def kinds(docs: list[dict[str, Any]]) -> list[str]:
    return sorted(d["kind"] for d in docs)


def container(workload: dict[str, Any]) -> dict[str, Any]:
    (c,) = workload["spec"]["template"]["spec"]["containers"]
    return dict(c)
