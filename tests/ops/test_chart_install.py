"""The chart installed on a real Kubernetes API (etcd, kube-apiserver, controller-manager,
scheduler; kwok nodes run the pods' lifecycle, not their containers): ``helm install
--wait`` with pods Running, ``helm upgrade`` with changed values, ``helm uninstall``, and
values the schema refuses never reach the cluster."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

from chart import chart_copy, write_values
from ops_kube import KubeCluster
from ops_tools import CHART, wait_for

INSTALL_TIMEOUT = "180s"


def _running(kube: KubeCluster, ns: str, release: str, component: str) -> list[dict[str, Any]]:
    selector = f"app.kubernetes.io/instance={release},app.kubernetes.io/component={component}"
    return [p for p in kube.pods(ns, selector) if p["status"].get("phase") == "Running" and "deletionTimestamp" not in p["metadata"]]


def _exists(kube: KubeCluster, path: str) -> bool:
    status, _ = kube._request("GET", path)
    return status == 200


def test_install_upgrade_uninstall(kube: KubeCluster, tmp_path: Path) -> None:
    ns = f"ops-{uuid.uuid4().hex[:6]}"
    release = "harness"
    base = tmp_path / "values.yaml"
    write_values(base, {"kafka": {"bootstrap": "kafka.example:9092", "topicPrefix": "acme"}, "networkPolicy": {"enabled": True}})

    out = kube.helm("install", release, str(CHART), "-n", ns, "--create-namespace", "-f", str(base),
                    "--wait", "--timeout", INSTALL_TIMEOUT).stdout
    assert "STATUS: deployed" in out, out
    workers = _running(kube, ns, release, "worker")
    assert sorted(p["metadata"]["name"] for p in workers) == [f"{release}-durable-harness-worker-{i}" for i in range(3)]
    assert all(p["spec"]["nodeName"].startswith("kwok-node-") for p in workers)
    assert len(_running(kube, ns, release, "gateway")) >= 1
    full = f"{release}-durable-harness"
    for path in (
        f"/apis/apps/v1/namespaces/{ns}/statefulsets/{full}-worker",
        f"/apis/apps/v1/namespaces/{ns}/deployments/{full}-gateway",
        f"/api/v1/namespaces/{ns}/services/{full}-gateway",
        f"/api/v1/namespaces/{ns}/configmaps/{full}",
        f"/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets/{full}-worker",
        f"/apis/autoscaling/v2/namespaces/{ns}/horizontalpodautoscalers/{full}-gateway",
        f"/apis/networking.k8s.io/v1/namespaces/{ns}/networkpolicies/{full}-worker",
    ):
        assert _exists(kube, path), f"{path} was not created"
    config = kube.api("GET", f"/api/v1/namespaces/{ns}/configmaps/{full}")["data"]
    assert config["HARNESS_LOG"].startswith("kafka://kafka.example:9092?topic_prefix=acme&")
    checksum = workers[0]["metadata"]["annotations"]["checksum/config"]

    # Upgrade: one more worker and another log level; the workers roll to the new config.
    changed = tmp_path / "changed.yaml"
    write_values(changed, {"worker": {"replicas": 4}, "logging": {"level": "DEBUG"}})
    out = kube.helm("upgrade", release, str(CHART), "-n", ns, "-f", str(base), "-f", str(changed),
                    "--wait", "--timeout", INSTALL_TIMEOUT).stdout
    assert "has been upgraded" in out, out
    config = kube.api("GET", f"/api/v1/namespaces/{ns}/configmaps/{full}")["data"]
    assert config["HARNESS_LOG_LEVEL"] == "DEBUG"

    def rolled() -> bool:
        pods = _running(kube, ns, release, "worker")
        return len(pods) == 4 and all(p["metadata"]["annotations"]["checksum/config"] != checksum for p in pods)

    wait_for(rolled, timeout=120, what="4 workers running the new config", details=kube.describe)
    history = kube.helm("history", release, "-n", ns).stdout
    assert "Upgrade complete" in history, history

    out = kube.helm("uninstall", release, "-n", ns, "--wait", "--timeout", INSTALL_TIMEOUT).stdout
    assert "uninstalled" in out, out
    assert not _exists(kube, f"/apis/apps/v1/namespaces/{ns}/statefulsets/{full}-worker")
    assert not _exists(kube, f"/api/v1/namespaces/{ns}/configmaps/{full}")
    wait_for(lambda: not kube.pods(ns, f"app.kubernetes.io/instance={release}"), timeout=120,
             what="the release's pods deleted", details=kube.describe)


def test_invalid_values_are_refused_at_install(kube: KubeCluster, tmp_path: Path) -> None:
    ns = f"ops-{uuid.uuid4().hex[:6]}"
    for name, values, says in (
        ("schema", {"kafka": {"partitions": -1}}, "partitions"),
        ("cross-field", {"worker": {"replicas": 20}}, "worker.replicas (20) is above kafka.partitions (12)"),
    ):
        bad = write_values(tmp_path / f"{name}.yaml", values)
        proc = kube.helm("install", f"bad-{name}", str(CHART), "-n", ns, "--create-namespace", "-f", str(bad),
                         "--wait", "--timeout", "30s", check=False)
        assert proc.returncode != 0, f"{values} was installed"
        assert says in proc.stderr, proc.stderr
        assert kube.helm("status", f"bad-{name}", "-n", ns, check=False).returncode != 0, "a refused release exists"
    assert not kube.pods(ns, "app.kubernetes.io/name=durable-harness")


def test_notes_say_how_to_reach_a_gateway_whose_hosts_leave_out_localhost(kube: KubeCluster, tmp_path: Path) -> None:
    """The NOTES' `kubectl port-forward svc/...-gateway` sends Host: localhost:8080, which a
    gateway with gateway.allowedHosts answers 400: the NOTES say so and give a request that works."""
    ns = f"ops-{uuid.uuid4().hex[:6]}"
    values = write_values(tmp_path / "hosts.yaml", {"gateway": {"allowedHosts": ["harness.acme.com"]}})
    out = kube.helm("install", "notes", str(CHART), "-n", ns, "--create-namespace", "-f", str(values),
                    "--dry-run=server").stdout
    assert "port-forward svc/notes-durable-harness-gateway 8080:80" in out, out
    assert "curl -H 'Host: harness.acme.com' http://localhost:8080/readyz" in out, out
    values = write_values(tmp_path / "local.yaml", {"gateway": {"allowedHosts": ["harness.acme.com", "localhost"]}})
    out = kube.helm("install", "notes", str(CHART), "-n", ns, "-f", str(values), "--dry-run=server").stdout
    assert "does not name localhost" not in out, out


def test_autoscaled_gateways_start_at_the_minimum_and_upgrades_keep_the_autoscalers_count(
    kube: KubeCluster, tmp_path: Path,
) -> None:
    """With the HPA on, the chart left out the gateway's replicas: a new Deployment started at 1
    (Kubernetes' default) until the autoscaler acted. Leaving it out only on upgrades would be
    worse: helm's three-way merge deletes a field the previous release set, so the first upgrade
    would scale the gateways down to 1. Now: the minimum at install, the live count at upgrades."""
    ns = f"ops-{uuid.uuid4().hex[:6]}"
    release = "hpa"
    deployment = f"/apis/apps/v1/namespaces/{ns}/deployments/{release}-durable-harness-gateway"
    base = write_values(tmp_path / "base.yaml", {"worker": {"enabled": False},
                                                  "gateway": {"autoscaling": {"minReplicas": 3, "maxReplicas": 8}}})
    kube.helm("install", release, str(CHART), "-n", ns, "--create-namespace", "-f", str(base))
    live = kube.api("GET", deployment)
    assert (live["spec"]["replicas"], live["metadata"]["generation"]) == (3, 1), "not created at the HPA's minimum"

    # The autoscaler scales it out (as the HPA would: the scale subresource); an upgrade that
    # changes something else keeps its count.
    scale = kube.api("GET", f"{deployment}/scale")
    scale["spec"]["replicas"] = 5
    del scale["metadata"]["resourceVersion"]  # unconditional, as the HPA's own write (status changes meanwhile)
    kube.api("PUT", f"{deployment}/scale", scale)
    level = write_values(tmp_path / "level.yaml", {"logging": {"level": "DEBUG"}})
    kube.helm("upgrade", release, str(CHART), "-n", ns, "-f", str(base), "-f", str(level))
    assert kube.api("GET", deployment)["spec"]["replicas"] == 5
    # A new minimum above the live count: the upgrade still writes the live count (the same
    # value: no conflict with the autoscaler's ownership under server-side apply) and the
    # autoscaler applies its new minimum.
    higher = write_values(tmp_path / "higher.yaml", {"gateway": {"autoscaling": {"minReplicas": 6}}})
    kube.helm("upgrade", release, str(CHART), "-n", ns, "-f", str(base), "-f", str(higher))
    assert kube.api("GET", deployment)["spec"]["replicas"] == 5
    wait_for(lambda: kube.api("GET", deployment)["spec"]["replicas"] == 6, timeout=90,
             what="the autoscaler raising the gateways to its new minimum", details=kube.describe)
    # Autoscaling off: gateway.replicas, as before.
    fixed = write_values(tmp_path / "fixed.yaml", {"gateway": {"autoscaling": {"enabled": False}, "replicas": 2}})
    kube.helm("upgrade", release, str(CHART), "-n", ns, "-f", str(base), "-f", str(fixed))
    assert kube.api("GET", deployment)["spec"]["replicas"] == 2
    kube.helm("uninstall", release, "-n", ns)


def test_a_new_chart_version_alone_rolls_no_pod(kube: KubeCluster, tmp_path: Path) -> None:
    """`helm upgrade` to a chart of another version with the same values and image: the objects'
    helm.sh/chart label follows it, but no pod template changes (generations stay), so no worker
    restarts (each would be a rebalance) and no gateway."""
    ns = f"ops-{uuid.uuid4().hex[:6]}"
    release = "ver"
    full = f"{release}-durable-harness"
    paths = {"worker": f"/apis/apps/v1/namespaces/{ns}/statefulsets/{full}-worker",
             "gateway": f"/apis/apps/v1/namespaces/{ns}/deployments/{full}-gateway"}
    kube.helm("install", release, str(CHART), "-n", ns, "--create-namespace")
    before = {name: kube.api("GET", path)["metadata"]["generation"] for name, path in paths.items()}
    kube.helm("upgrade", release, str(chart_copy(tmp_path, version="0.1.1")), "-n", ns)
    for name, path in paths.items():
        live = kube.api("GET", path)
        assert live["metadata"]["labels"]["helm.sh/chart"] == "durable-harness-0.1.1"
        assert live["metadata"]["generation"] == before[name], f"the {name} pod template changed"
    # (the same check fails as it should for a change the pods run: another image tag)
    kube.helm("upgrade", release, str(CHART), "-n", ns, "--set", "image.tag=0.1.1")
    assert all(kube.api("GET", path)["metadata"]["generation"] > before[name] for name, path in paths.items())
    kube.helm("uninstall", release, "-n", ns)
