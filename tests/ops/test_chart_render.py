"""The chart renders, for several values combinations, into manifests that Kubernetes 1.33
accepts (``kubernetes-validate --strict``), wired the way the worker and gateway expect;
bad values are refused with a line that says how to fix them."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from chart import chart_copy, container, find, kinds, process_of, render, template, validate, write_values
from ops_tools import CHART, KUBE_VERSION, run, tool

from harness.cli.common import kafka_client_config
from harness.services.gateway.settings import parse_settings as gateway_settings
from harness.services.worker.main import parse as worker_settings

FULL: dict[str, Any] = {
    "kafka": {
        "bootstrap": "b1:9093,b2:9093",
        "topicPrefix": "acme",
        "partitions": 24,
        "minInsyncReplicas": 2,
        "securityProtocol": "SASL_SSL",
        "sasl": {"mechanism": "SCRAM-SHA-512", "existingSecret": "kafka-creds"},
        "tls": {"existingSecret": "kafka-ca", "certKey": "tls.crt", "keyKey": "tls.key"},
        "config": {"socket.keepalive.enable": "true", "client.id": "harness", "log_level": "6"},
    },
    "apps": ["myapp.agents:assistant", "myapp.agents:helpers"],
    "appSecrets": {"existingSecret": "app-secrets", "env": [{"name": "openai", "secretName": "model-keys", "key": "openai"}]},
    "worker": {"kind": "Deployment", "staticMembership": False, "replicas": 6, "maxSessions": 500, "syncThreads": 32,
               # every form of a quantity the schema lets through, which Kubernetes accepts too
               "resources": {"requests": {"cpu": 1, "memory": "1.5Gi"},
                             "limits": {"cpu": "2", "memory": "2e9", "ephemeral-storage": "1G"}}},
    "gateway": {
        "resources": {"requests": {"cpu": 0.5, "memory": ".5Gi"}},
        "auth": {"mode": "jwt", "existingSecret": "gw-auth", "secretKey": "jwt.key",
                 "jwtIssuer": "https://id.example.com", "tenantClaim": "org"},
        "ingress": {"enabled": True, "className": "nginx",
                    "tls": [{"hosts": ["harness.example.com"], "secretName": "harness-tls"}]},
    },
    "networkPolicy": {
        "enabled": True, "restrictEgress": True,
        "metricsFrom": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}],
        "extraEgress": [{"to": [{"ipBlock": {"cidr": "0.0.0.0/0"}}], "ports": [{"port": 443, "protocol": "TCP"}]}],
    },
    "serviceMonitor": {"enabled": True},
    "prometheusRule": {"enabled": True},
    "grafanaDashboard": {"enabled": True},
}
WORKERS_ONLY: dict[str, Any] = {
    "gateway": {"enabled": False},
    "worker": {"staticMembership": False, "replicas": 12, "podDisruptionBudget": {"enabled": False}},
    "networkPolicy": {"enabled": True},
    "logging": {"format": "text", "level": "DEBUG"},
}
GATEWAY_ONLY: dict[str, Any] = {
    "worker": {"enabled": False},
    "gateway": {"auth": {"mode": "apiKeys", "existingSecret": "gw-keys", "secretKey": "keys.json"},
                "autoscaling": {"enabled": False}, "replicas": 3,
                "ingress": {"enabled": True},
                "allowedHosts": ["harness.example.com", "*.internal.example.com"], "rateLimit": 20,
                "authFailureLimit": 0, "forwardedAllowIps": ["10.244.0.0/16", "fd00::/8"]},
    "serviceMonitor": {"enabled": True},
}
COMBINATIONS = {"defaults": None, "full": FULL, "workers-only": WORKERS_ONLY, "gateway-only": GATEWAY_ONLY}


def _values(tmp_path: Path, name: str) -> Path | None:
    values = COMBINATIONS[name]
    return None if values is None else write_values(tmp_path / f"{name}.yaml", values)


def test_helm_lint_with_every_combination(tmp_path: Path) -> None:
    for name in COMBINATIONS:
        argv = [tool("helm"), "lint", "--strict", str(CHART), "--kube-version", KUBE_VERSION]
        values = _values(tmp_path, name)
        if values is not None:
            argv += ["-f", str(values)]
        out = run(argv).stdout
        assert "1 chart(s) linted, 0 chart(s) failed" in out, f"{name}: {out}"


def test_the_readmes_command_renders_without_naming_a_kubernetes_version() -> None:
    """As a user runs it: the helm that .ci/ops-tools.sh builds took a cluster of v1.20 and
    refused the chart (kubeVersion >= 1.25) unless --kube-version was given."""
    argv = [tool("helm"), "template", "acme", str(CHART), "--set", "kafka.bootstrap=kafka:9092",
            "--set", "kafka.topicPrefix=acme", "--set", "apps={myapp.agents:assistant}"]
    proc = run(argv, check=False)
    assert proc.returncode == 0 and "kind: StatefulSet" in proc.stdout, proc.stderr


@pytest.mark.parametrize("name", sorted(COMBINATIONS))
def test_rendered_manifests_pass_strict_validation(tmp_path: Path, name: str) -> None:
    _, manifests, _ = template(_values(tmp_path, name))
    out = validate(manifests, tmp_path)
    docs = [d for d in yaml.safe_load_all(manifests) if d]
    core = [d for d in docs if not d["apiVersion"].startswith("monitoring.coreos.com/")]
    assert out.count("passed for resource") == len(core), out


def test_defaults_render_every_part() -> None:
    docs = render()
    assert kinds(docs) == sorted([
        "ConfigMap", "Deployment", "HorizontalPodAutoscaler", "PodDisruptionBudget", "PodDisruptionBudget",
        "Service", "Service", "ServiceAccount", "StatefulSet",
    ])
    assert not any(d["kind"] == "Secret" for d in render(None)), "the chart never holds a secret value"


def test_full_render_has_every_optional_part(tmp_path: Path) -> None:
    docs = render(_values(tmp_path, "full"))
    assert {"Ingress", "NetworkPolicy", "ServiceMonitor", "PrometheusRule", "Deployment", "ConfigMap"} <= set(kinds(docs))
    assert not any(d["kind"] == "Secret" for d in docs)


def test_worker_pod_is_wired_for_the_worker_process(tmp_path: Path) -> None:
    docs = render(_values(tmp_path, "full"))
    config = find(docs, "ConfigMap", "durable-harness")["data"]
    assert config["HARNESS_LOG"] == (
        "kafka://b1:9093,b2:9093?topic_prefix=acme&partitions=24&replication_factor=3&min_insync_replicas=2"
    )
    assert config["HARNESS_APPS"] == "myapp.agents:assistant,myapp.agents:helpers"
    assert config["HARNESS_KAFKA_CONFIG_SECURITY_PROTOCOL"] == "SASL_SSL"
    assert config["HARNESS_KAFKA_CONFIG_SASL_MECHANISM"] == "SCRAM-SHA-512"
    assert config["HARNESS_KAFKA_CONFIG_SOCKET_KEEPALIVE_ENABLE"] == "true"
    assert config["HARNESS_KAFKA_CONFIG_SSL_CA_LOCATION"] == "/var/run/harness/kafka-tls/ca.crt"
    given = {"socket.keepalive.enable": "true", "client.id": "harness", "log_level": "6"}
    assert {k: v for k, v in kafka_client_config(config).items() if k in given} == given  # as the worker reads them
    assert not any("PASSWORD" in k or "USERNAME" in k for k in config), "credentials never in the ConfigMap"

    worker = find(docs, "Deployment", "-worker")
    c = container(worker)
    env = {e["name"]: e for e in c["env"]}
    assert "HARNESS_INSTANCE_ID" not in env  # (a Deployment's pods are new names each restart: no static id)
    assert env["HARNESS_KAFKA_CONFIG_SASL_PASSWORD"]["valueFrom"]["secretKeyRef"] == {"name": "kafka-creds", "key": "password"}
    assert env["HARNESS_SECRET_OPENAI"]["valueFrom"]["secretKeyRef"] == {"name": "model-keys", "key": "openai"}
    assert env["HARNESS_SECRETS_DIR"]["value"] == "/var/run/harness/secrets"
    assert env["HARNESS_MAX_SESSIONS"]["value"] == "500"
    assert env["HARNESS_SYNC_THREADS"]["value"] == "32"
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    assert mounts["app-secrets"]["mountPath"] == "/var/run/harness/secrets" and mounts["app-secrets"]["readOnly"]
    assert c["args"] == ["worker"]
    gw_env = {e["name"] for e in container(find(docs, "Deployment", "-gateway"))["env"]}
    assert "HARNESS_KAFKA_CONFIG_SASL_PASSWORD" in gw_env, "the gateway is a Kafka client too"
    assert not any(n.startswith("HARNESS_SECRET_") for n in gw_env), "app secrets are the workers' only"
    sc = c["securityContext"]
    assert sc["readOnlyRootFilesystem"] and not sc["allowPrivilegeEscalation"] and sc["capabilities"]["drop"] == ["ALL"]
    pod = worker["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] and pod["terminationGracePeriodSeconds"] >= 30
    # the drain, as the worker reads it, ends well before the pod is killed
    drain = worker_settings(["--app", "a:b"], {"HARNESS_DRAIN_TIMEOUT_SECONDS": env["HARNESS_DRAIN_TIMEOUT_SECONDS"]["value"]})
    assert 0 < drain.drain_timeout <= pod["terminationGracePeriodSeconds"] - 10
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert pod["topologySpreadConstraints"][0]["labelSelector"]["matchLabels"]["app.kubernetes.io/component"] == "worker"


def test_statefulset_workers_get_stable_names(tmp_path: Path) -> None:
    docs = render()
    sts = find(docs, "StatefulSet", "-worker")
    headless = find(docs, "Service", "-worker")
    assert sts["spec"]["serviceName"] == headless["metadata"]["name"]
    assert headless["spec"]["clusterIP"] == "None"
    assert sts["spec"]["podManagementPolicy"] == "Parallel"
    env = {e["name"]: e for e in container(sts)["env"]}
    assert env["HARNESS_INSTANCE_ID"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    no_static = render(write_values(tmp_path / "v.yaml", {"worker": {"staticMembership": False}}))
    # nothing else with the defaults but the drain (always set: the grace period is checked against it)
    assert container(find(no_static, "StatefulSet"))["env"] == [{"name": "HARNESS_DRAIN_TIMEOUT_SECONDS", "value": "20"}]


def test_gateway_args_follow_the_auth_mode(tmp_path: Path) -> None:
    gw = container(find(render(_values(tmp_path, "full")), "Deployment", "-gateway"))
    assert gw["args"] == [
        "gateway", "--host=0.0.0.0", "--port=8080", "--jwt-secret-file=/var/run/harness/gateway-auth/jwt.key",
        "--jwt-issuer=https://id.example.com", "--tenant-claim=org",
    ]
    keys = container(find(render(_values(tmp_path, "gateway-only")), "Deployment", "-gateway"))
    assert "--api-keys-file=/var/run/harness/gateway-auth/keys.json" in keys["args"]
    assert "--open-access" in container(find(render(), "Deployment", "-gateway"))["args"]
    assert gw["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}


def test_gateway_allowed_hosts_keep_the_pod_ip_for_the_probes(tmp_path: Path) -> None:
    """With gateway.allowedHosts the kubelet's probes (Host: the pod's IP) still pass: the
    gateway the pod would run, from its resolved args and environment, answers the chart's
    probe paths for its IP and refuses another Host."""
    import dataclasses

    import httpx

    from tests.gateway.helpers import ServerThread

    docs = render(_values(tmp_path, "gateway-only"))
    gw = find(docs, "Deployment", "-gateway")
    argv, env = process_of(docs, gw, pod_name="gw-0", secrets={}, pod_ip="10.244.3.9")
    assert argv[:2] == ["harness", "gateway"]
    settings = gateway_settings(argv[2:], env)
    assert settings.allowed_hosts == ("harness.example.com", "*.internal.example.com", "10.244.3.9")
    assert settings.rate_limit == 20 and not settings.rate_limit_reads
    assert (settings.auth_failure_limit, settings.forwarded_allow_ips) == (0, ("10.244.0.0/16", "fd00::/8"))
    plain = render()
    plain_argv, plain_env = process_of(plain, find(plain, "Deployment", "-gateway"), pod_name="gw-0", secrets={})
    defaults = gateway_settings(plain_argv[2:], plain_env)
    assert (defaults.auth_failure_limit, defaults.forwarded_allow_ips) == (10, ("127.0.0.1", "::1"))
    assert not any("--allowed-hosts" in arg for arg in container(find(render(), "Deployment", "-gateway"))["args"])

    (tmp_path / "keys").write_text("acme key-acme-1234\n")
    local = dataclasses.replace(settings, log=f"sqlite:///{tmp_path / 'h.db'}", api_keys_file=str(tmp_path / "keys"))
    c = container(gw)
    port = c["ports"][0]["containerPort"]
    with ServerThread(local) as server, httpx.Client(base_url=server.url, timeout=30) as http:
        for probe in ("livenessProbe", "readinessProbe"):
            path = c[probe]["httpGet"]["path"]
            assert http.get(path, headers={"Host": f"10.244.3.9:{port}"}).status_code == 200, probe
            assert http.get(path, headers={"Host": "harness.example.com"}).status_code == 200, probe
            assert http.get(path, headers={"Host": f"10.244.3.10:{port}"}).status_code == 400, probe


def test_service_monitors_select_the_services_and_their_metrics_port(tmp_path: Path) -> None:
    docs = render(_values(tmp_path, "full"))
    for component in ("worker", "gateway"):
        sm = find(docs, "ServiceMonitor", f"-{component}")
        svc = find(docs, "Service", f"-{component}")
        labels = svc["metadata"]["labels"]
        assert all(labels.get(k) == v for k, v in sm["spec"]["selector"]["matchLabels"].items())
        assert labels[sm["spec"]["jobLabel"]] == f"durable-harness-{component}"
        assert "metrics" in {p["name"] for p in svc["spec"]["ports"]}
        assert sm["spec"]["endpoints"][0]["port"] == "metrics"


def test_prometheus_rule_and_dashboard_configmap_ship_the_files(tmp_path: Path) -> None:
    """The PrometheusRule is the rules file, but for HarnessWorkerDown narrowed to the
    release's workers (promtool tests it: tests/ops/test_alerts.py) and runbook_url built from
    prometheusRule.runbookBaseUrl; a release without workers has no HarnessWorkerDown."""
    docs = render(_values(tmp_path, "full"))
    rules = yaml.safe_load((CHART / "alerts" / "durable-harness.rules.yaml").read_text())
    (worker_down,) = [r for g in rules["groups"] for r in g["rules"] if r.get("alert") == "HarnessWorkerDown"]
    selector = 'up{job="durable-harness-worker"}'
    assert worker_down["expr"].count(selector) == 2  # up == 0, and absent()
    worker_down["expr"] = worker_down["expr"].replace(
        selector, 'up{job="durable-harness-worker", namespace="default", service="t-durable-harness-worker"}')
    assert find(docs, "PrometheusRule")["spec"] == rules
    base = "https://wiki.acme.internal/ops/harness-runbook"
    other = render(write_values(tmp_path / "other.yaml", {
        "worker": {"enabled": False}, "prometheusRule": {"enabled": True, "runbookBaseUrl": base + "/"}}))
    shipped = [r for g in find(other, "PrometheusRule")["spec"]["groups"] for r in g["rules"]]
    assert "HarnessWorkerDown" not in {r["alert"] for r in shipped}
    assert len(shipped) == sum(len(g["rules"]) for g in rules["groups"]) - 1
    assert {r["annotations"]["runbook_url"] for r in shipped} == {f"{base}#{r['alert'].lower()}" for r in shipped}
    dashboard = find(docs, "ConfigMap", "-dashboard")
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    shipped = json.loads(dashboard["data"]["durable-harness.json"])
    assert shipped == json.loads((CHART / "dashboards" / "durable-harness.json").read_text())


def test_hpa_scales_gateways_only(tmp_path: Path) -> None:
    docs = render()
    hpa = find(docs, "HorizontalPodAutoscaler")
    assert hpa["spec"]["scaleTargetRef"]["name"].endswith("-gateway")
    # A new Deployment starts at the autoscaler's minimum (omitted, it started at 1 until the
    # HPA acted); upgrades keep the live count (test_chart_install).
    assert find(docs, "Deployment", "-gateway")["spec"]["replicas"] == hpa["spec"]["minReplicas"] == 2
    write_values(tmp_path / "min.yaml", {"gateway": {"autoscaling": {"minReplicas": 4}}})
    assert find(render(tmp_path / "min.yaml"), "Deployment", "-gateway")["spec"]["replicas"] == 4
    fixed = render(_values(tmp_path, "gateway-only"))
    assert find(fixed, "Deployment", "-gateway")["spec"]["replicas"] == 3
    assert not any(d["kind"] == "HorizontalPodAutoscaler" for d in fixed)


def _pod_templates(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return {d["metadata"]["name"]: d["spec"]["template"] for d in docs if d["kind"] in ("StatefulSet", "Deployment")}


@pytest.mark.parametrize("name", ["defaults", "full"])
def test_a_chart_upgrade_alone_restarts_no_pod(tmp_path: Path, name: str) -> None:
    """`helm.sh/chart` (the chart's version) was on the pod templates, and the config checksum
    hashed the ConfigMap's labels with it: every chart release rolled every worker (a rebalance
    each) and gateway, nothing about the pods changed. It stays on the objects' own labels."""
    values = _values(tmp_path, name)
    old = render(values)
    new = render(values, chart=chart_copy(tmp_path, version="0.1.1"))
    assert set(_pod_templates(old)) == {"t-durable-harness-worker", "t-durable-harness-gateway"}
    assert _pod_templates(new) == _pod_templates(old)
    for docs, version in ((old, "0.1.0"), (new, "0.1.1")):
        for kind, suffix in (("Deployment", "-gateway"), ("Service", "-gateway"), ("ConfigMap", "-harness")):
            assert find(docs, kind, suffix)["metadata"]["labels"]["helm.sh/chart"] == f"durable-harness-{version}"
    for workload in _pod_templates(old).values():
        assert "helm.sh/chart" not in workload["metadata"]["labels"]
    # A new image (its tag: the version label and the container's image) does roll them.
    write_values(tmp_path / "tag.yaml", {**(COMBINATIONS[name] or {}), "image": {"tag": "0.1.1"}})
    tagged = _pod_templates(render(tmp_path / "tag.yaml"))
    for pod_name, pod in _pod_templates(old).items():
        assert tagged[pod_name] != pod
        assert tagged[pod_name]["metadata"]["labels"]["app.kubernetes.io/version"] == "0.1.1"
        assert tagged[pod_name]["spec"]["containers"][0]["image"] == "localhost/durable-harness:0.1.1"
    # So does a changed config (the checksum of the ConfigMap's data).
    write_values(tmp_path / "level.yaml", {**(COMBINATIONS[name] or {}), "logging": {"level": "DEBUG"}})
    leveled = _pod_templates(render(tmp_path / "level.yaml"))
    for pod_name, pod in _pod_templates(old).items():
        assert leveled[pod_name]["metadata"]["annotations"]["checksum/config"] != pod["metadata"]["annotations"]["checksum/config"]


def test_restricted_egress_lets_the_pods_reach_the_bootstrap_ports(tmp_path: Path) -> None:
    """Kafka on 9093 (FULL's bootstrap) with egress restricted: the bootstrap's ports are allowed
    out as well as networkPolicy.kafkaPorts, else no worker or gateway could reach the broker."""
    docs = render(_values(tmp_path, "full"))
    for component in ("worker", "gateway"):
        egress = find(docs, "NetworkPolicy", f"-{component}")["spec"]["egress"]
        ports = {p["port"] for rule in egress for p in rule.get("ports", [])}
        assert {9093, 9092} <= ports, (component, ports)


# --------------------------------------------------------------------------- refused values

SCHEMA_REFUSALS = [
    ({"kafka": {"partitions": 0}}, "partitions"),
    ({"kafka": {"securityProtocol": "TLS"}}, "securityProtocol"),
    ({"worker": {"kind": "DaemonSet"}}, "kind"),
    ({"apps": ["not-a-module-attribute"]}, "apps"),
    ({"kafak": {"bootstrap": "x:1"}}, "kafak"),
    ({"kafka": {"bootstrap": "kafka"}}, "bootstrap"),  # (no port: every worker exited 2 on it)
    ({"logging": {"level": "LOUD"}}, "level"),
    ({"metrics": {"port": 70000}}, "port"),
    ({"prometheusRule": {"runbookBaseUrl": "docs/runbook.md"}}, "/prometheusRule/runbookBaseUrl"),
    ({"worker": {"replicas": "three"}}, "replicas"),
    # (only the API server refused them, at install: the schema names the value)
    ({"worker": {"resources": {"limits": {"memory": "lots"}}}}, "/worker/resources/limits/memory"),
    ({"worker": {"resources": {"requests": {"cpu": "250 m"}}}}, "/worker/resources/requests/cpu"),
    ({"gateway": {"resources": {"requests": {"memory": "128MB"}}}}, "/gateway/resources/requests/memory"),
    ({"gateway": {"resources": {"limits": {"cpu": -1}}}}, "/gateway/resources/limits/cpu"),
    ({"gateway": {"allowedHosts": ["harness.example.com:443"]}}, "/gateway/allowedHosts/0"),
    ({"gateway": {"rateLimit": -1}}, "/gateway/rateLimit"),
    ({"gateway": {"authFailureLimit": -1}}, "/gateway/authFailureLimit"),
    ({"gateway": {"forwardedAllowIps": ["ingress.local"]}}, "/gateway/forwardedAllowIps/0"),
]
TEMPLATE_REFUSALS = [
    ({"worker": {"replicas": 13}}, "worker.replicas (13) is above kafka.partitions (12)"),
    ({"kafka": {"sasl": {"mechanism": "PLAIN"}, "securityProtocol": "SASL_SSL"}}, "kafka.sasl.existingSecret is empty"),
    ({"kafka": {"sasl": {"mechanism": "PLAIN", "existingSecret": "s"}}}, "needs kafka.securityProtocol SASL_SSL"),
    ({"kafka": {"config": {"sasl.password": "hunter2"}}}, "looks like a credential"),
    ({"kafka": {"securityProtocol": "SASL_SSL"}}, "kafka.securityProtocol SASL_SSL needs kafka.sasl.mechanism"),
    ({"kafka": {"tls": {"existingSecret": "ca"}}}, "kafka.tls.existingSecret needs kafka.securityProtocol SSL"),
    ({"gateway": {"ingress": {"enabled": True}}}, "gateway.auth.allowOpenIngress"),
    ({"gateway": {"auth": {"mode": "jwt"}}}, "needs gateway.auth.existingSecret"),
    ({"worker": {"enabled": False}, "gateway": {"enabled": False}}, "nothing to deploy"),
    ({"worker": {"drainTimeoutSeconds": 55}}, "worker.drainTimeoutSeconds (55) needs worker.terminationGracePeriodSeconds of at least 65"),
    # (both on one container: the gateway could not bind its second listener and crash-looped)
    ({"gateway": {"port": 9464}}, "gateway.port (9464) is metrics.port too"),
    ({"gateway": {"rateLimitReads": True}}, "gateway.rateLimitReads needs gateway.rateLimit"),
    # (the gateway refuses a JWT option in another auth mode: the pod would crash-loop on it)
    ({"gateway": {"auth": {"mode": "apiKeys", "existingSecret": "keys", "secretKey": "keys", "tenantClaim": "org"}}},
     "gateway.auth.jwtIssuer, jwtAudience and tenantClaim apply to JWTs only (gateway.auth.mode jwt or jwks), not "
     "to mode apiKeys"),
    ({"gateway": {"auth": {"jwtIssuer": "https://id.example.com"}}}, "not to mode open: the gateway refuses them"),
    # (rendered no Ingress at all, silently: the operator found the hosts unreachable)
    ({"gateway": {"enabled": False, "ingress": {"enabled": True}}},
     "gateway.ingress.enabled needs gateway.enabled: without the gateway there is nothing to route to"),
    # (each of these rendered, and broke or exposed something once installed)
    ({"gateway": {"service": {"type": "LoadBalancer"}}}, "a LoadBalancer Service would expose it outside the cluster"),
    ({"gateway": {"service": {"type": "NodePort"}}}, "a NodePort Service would expose it outside the cluster"),
    ({"fullnameOverride": "My_Harness"}, 'fullnameOverride "My_Harness" is not a Kubernetes name'),
    ({"fullnameOverride": "h" * 46}, "set fullnameOverride to at most 45 characters"),
    ({"worker": {"kind": "Deployment"}}, "set worker.staticMembership=false, or keep worker.kind StatefulSet"),
    ({"gateway": {"autoscaling": {"minReplicas": 5, "maxReplicas": 2}}},
     "gateway.autoscaling.minReplicas (5) is above gateway.autoscaling.maxReplicas (2)"),
    ({"kafka": {"bootstrap": "kafka:99999"}}, 'kafka.bootstrap "kafka:99999": port 99999 is not a TCP port'),
    ({"appSecrets": {"env": [{"name": "openai.key", "secretName": "s", "key": "k"}]}},
     "appSecrets.env name \"openai.key\": a secret's name is letters, digits and '_'"),
    ({"appSecrets": {"env": [{"name": "OPENAI", "secretName": "s", "key": "a"},
                             {"name": "openai", "secretName": "s", "key": "b"}]}},
     'appSecrets.env names "openai" twice'),
]


@pytest.mark.parametrize(("values", "says"), SCHEMA_REFUSALS + TEMPLATE_REFUSALS)
def test_bad_values_are_refused_with_a_clear_line(tmp_path: Path, values: dict[str, Any], says: str) -> None:
    code, _, err = template(write_values(tmp_path / "bad.yaml", values), check=False)
    assert code != 0, f"{values} was accepted"
    assert says in err, err
    if "hunter2" in json.dumps(values):
        assert "hunter2" not in err, "a refused secret value is not echoed"


# --------------------------------------------------------------------------- docs


def _paths(node: Any, prefix: str = "") -> list[tuple[str, bool]]:
    """Every key path of the values, with whether it is a leaf."""
    if isinstance(node, dict) and node:
        out: list[tuple[str, bool]] = [(prefix, False)] if prefix else []
        for key, value in node.items():
            out += _paths(value, f"{prefix}.{key}" if prefix else str(key))
        return out
    return [(prefix, True)]


def test_chart_readme_documents_every_value() -> None:
    """Each leaf of values.yaml is in the README's tables, itself or through a parent
    documented whole (e.g. ``worker.resources``)."""
    paths = _paths(yaml.safe_load((CHART / "values.yaml").read_text()))
    readme = (CHART / "README.md").read_text()
    documented = set(re.findall(r"^\| `([^`]+)` \|", readme, flags=re.M))

    def covered(path: str) -> bool:
        parts = path.split(".")
        return any(".".join(parts[:i]) in documented for i in range(1, len(parts) + 1))

    missing = [p for p, leaf in paths if leaf and not covered(p)]
    assert not missing, f"values not in helm/durable-harness/README.md: {missing}"
    unknown = sorted(documented - {p for p, _ in paths})
    assert not unknown, f"README documents values that do not exist: {unknown}"


def test_a_long_release_name_is_refused_naming_the_fix() -> None:
    """A 45-character release name rendered a 69-character gateway Service name (Kubernetes
    takes 63) and a StatefulSet whose pods could never be created."""
    code, _, err = template(release="r" * 45, check=False)
    assert code != 0
    assert "set fullnameOverride to at most 45 characters, or use a shorter release name" in err, err
