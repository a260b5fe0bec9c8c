"""Rendering the chart with helm, and reading what it rendered."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from ops_tools import CHART, KUBE_VERSION, python_tool, run, tool

RELEASE = "t"


def write_values(path: Path, values: Mapping[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(dict(values)))
    return path


def template(
    values: Path | None = None, *, release: str = RELEASE, namespace: str | None = None, check: bool = True,
    chart: Path = CHART,
) -> tuple[int, str, str]:
    """``helm template`` (always for Kubernetes KUBE_VERSION): (exit code, manifests, stderr)."""
    argv = [tool("helm"), "template", release, str(chart), "--kube-version", KUBE_VERSION]
    if namespace is not None:
        argv += ["--namespace", namespace]
    if values is not None:
        argv += ["-f", str(values)]
    proc = run(argv, check=check)
    return proc.returncode, proc.stdout, proc.stderr


def render(values: Path | None = None, *, release: str = RELEASE, namespace: str | None = None,
           chart: Path = CHART) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(template(values, release=release, namespace=namespace, chart=chart)[1]) if d]


def chart_copy(workdir: Path, **chart_yaml: str) -> Path:
    """A copy of the chart in ``workdir`` with fields of its Chart.yaml replaced (``version="0.2.0"``)."""
    import shutil

    copy = workdir / CHART.name
    shutil.copytree(CHART, copy)
    meta = yaml.safe_load((copy / "Chart.yaml").read_text())
    meta.update(chart_yaml)
    (copy / "Chart.yaml").write_text(yaml.safe_dump(meta, sort_keys=False))
    return copy


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


def entrypoint() -> list[str]:
    """The image's ENTRYPOINT, read from the Containerfile (exec form)."""
    import json as _json

    from ops_tools import REPO

    lines = [ln for ln in (REPO / "Containerfile").read_text().splitlines() if ln.startswith("ENTRYPOINT ")]
    assert len(lines) == 1, "one exec-form ENTRYPOINT in the Containerfile"
    return list(_json.loads(lines[0][len("ENTRYPOINT "):]))


def process_of(
    docs: list[dict[str, Any]], workload: dict[str, Any], *, pod_name: str, secrets: Mapping[str, Mapping[str, str]],
    pod_ip: str = "10.244.0.7",
) -> tuple[list[str], dict[str, str]]:
    """What a pod of ``workload`` would run: (argv, environment), resolved the way the
    kubelet does it: ENTRYPOINT + args, envFrom ConfigMaps, then env (values, the pod's
    name and IP, Secret keys from ``secrets`` {secret: {key: value}}), and ``$(VAR)`` in
    the args replaced by the container's variable."""
    c = container(workload)
    argv = list(c.get("command") or entrypoint()) + list(c.get("args") or [])
    configmaps = {d["metadata"]["name"]: d.get("data", {}) for d in docs if d["kind"] == "ConfigMap"}
    env: dict[str, str] = {}
    for source in c.get("envFrom", []):
        name = source["configMapRef"]["name"]
        assert name in configmaps, f"envFrom names a ConfigMap the chart does not render: {name}"
        env.update(configmaps[name])
    for item in c.get("env", []):
        if "value" in item:
            env[item["name"]] = str(item["value"])
            continue
        ref = item["valueFrom"]
        if "fieldRef" in ref:
            field = ref["fieldRef"]["fieldPath"]
            assert field in ("metadata.name", "status.podIP"), ref
            env[item["name"]] = pod_name if field == "metadata.name" else pod_ip
        elif "secretKeyRef" in ref:
            key = ref["secretKeyRef"]
            env[item["name"]] = secrets[key["name"]][key["key"]]
        else:
            raise AssertionError(f"unexpected valueFrom {ref}")
    # (the kubelet expands $(VAR) of the container's environment; an unknown one stays as it is)
    argv = [re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env.get(m.group(1), m.group(0)), arg) for arg in argv]
    return argv, env
