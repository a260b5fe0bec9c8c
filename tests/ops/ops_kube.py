"""A real Kubernetes control plane on this machine: etcd, kube-apiserver,
kube-controller-manager, kube-scheduler, and kwok faking the nodes (and running no
containers: kwok marks scheduled pods Running).

    cluster = KubeCluster(workdir).start()
    cluster.api("GET", "/api/v1/nodes")
    cluster.helm("install", "x", CHART, "--wait")
    cluster.stop()

Everything listens on 127.0.0.1 on free ports; each process is stopped by its pid.
"""

from __future__ import annotations

import json
import os
import secrets
import textwrap
from pathlib import Path
from typing import Any

from ops_tools import Proc, free_port, http_get, run, tool, unavailable, wait_for

KWOK_STAGES = "kwok-v0.8.0-stages.yaml"
NODES = ("kwok-node-0", "kwok-node-1")


class KubeCluster:
    def __init__(self, workdir: Path) -> None:
        self.dir = workdir
        self.dir.mkdir(parents=True, exist_ok=True)
        self.procs: list[Proc] = []
        self.token = secrets.token_hex(16)
        self.api_port = free_port()
        self.kubeconfig = self.dir / "kubeconfig"
        from ops_tools import CACHE

        self.stages = CACHE / KWOK_STAGES
        self.bins = {name: tool(name) for name in (
            "etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok", "helm", "openssl",
        )}
        if not self.stages.exists():
            unavailable(f"the kwok stage file {self.stages} is missing")

    # -- lifecycle ------------------------------------------------------------------------

    def start(self) -> KubeCluster:
        try:
            self._etcd()
            self._apiserver()
            self._write_kubeconfig()
            common = ["--kubeconfig", str(self.kubeconfig), "--bind-address=127.0.0.1", "--leader-elect=false"]
            self.procs.append(Proc("kube-controller-manager", [
                self.bins["kube-controller-manager"], *common, f"--secure-port={free_port()}", "--controllers=*",
                "--use-service-account-credentials=false",
                f"--service-account-private-key-file={self.dir / 'sa.key'}",
            ], workdir=self.dir))
            self.procs.append(Proc("kube-scheduler", [
                self.bins["kube-scheduler"], *common, f"--secure-port={free_port()}",
            ], workdir=self.dir))
            self.procs.append(Proc("kwok", [
                self.bins["kwok"], "--kubeconfig", str(self.kubeconfig), "--config", str(self.stages),
                "--manage-all-nodes=false", "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
                "--node-ip=127.0.0.2", "--cidr=127.1.0.1/24", f"--server-address=127.0.0.1:{free_port()}",
            ], workdir=self.dir))
            self._nodes()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for proc in reversed(self.procs):
            proc.stop()
        self.procs.clear()

    def describe(self) -> str:
        return "\n".join(p.describe() for p in self.procs)

    # -- pieces ---------------------------------------------------------------------------

    def _etcd(self) -> None:
        port, peer = free_port(), free_port()
        self.etcd_url = f"http://127.0.0.1:{port}"
        etcd = Proc("etcd", [
            self.bins["etcd"], "--name=ops-test", f"--data-dir={self.dir / 'etcd'}",
            f"--listen-client-urls={self.etcd_url}", f"--advertise-client-urls={self.etcd_url}",
            f"--listen-peer-urls=http://127.0.0.1:{peer}", f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
            f"--initial-cluster=ops-test=http://127.0.0.1:{peer}", "--log-level=warn",
        ], workdir=self.dir)
        self.procs.append(etcd)

        def healthy() -> bool:
            etcd.check_alive()
            status, body = http_get(f"{self.etcd_url}/health", timeout=2)
            return status == 200 and '"true"' in body

        wait_for(healthy, timeout=30, what="etcd healthy", details=etcd.describe)

    def _apiserver(self) -> None:
        run([self.bins["openssl"], "genrsa", "-out", str(self.dir / "sa.key"), "2048"])
        run([self.bins["openssl"], "rsa", "-in", str(self.dir / "sa.key"), "-pubout", "-out", str(self.dir / "sa.pub")])
        (self.dir / "tokens.csv").write_text(f"{self.token},admin,admin,system:masters\n")
        os.chmod(self.dir / "tokens.csv", 0o600)
        api = Proc("kube-apiserver", [
            self.bins["kube-apiserver"], f"--etcd-servers={self.etcd_url}", "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1", f"--secure-port={self.api_port}", f"--cert-dir={self.dir / 'certs'}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={self.dir / 'sa.pub'}",
            f"--service-account-signing-key-file={self.dir / 'sa.key'}",
            f"--token-auth-file={self.dir / 'tokens.csv'}", "--authorization-mode=RBAC",
            "--service-cluster-ip-range=10.96.0.0/16", "--allow-privileged=true",
        ], workdir=self.dir)
        self.procs.append(api)

        def ready() -> bool:
            api.check_alive()
            return self._request("GET", "/readyz") == (200, "ok")

        wait_for(ready, timeout=90, what="kube-apiserver /readyz", details=api.describe)

    def _request(self, method: str, path: str, body: Any = None) -> tuple[int, str]:
        import ssl
        import urllib.error
        import urllib.request

        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE  # its serving certificate is self-signed, made at start
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            f"https://127.0.0.1:{self.api_port}{path}", data=data, method=method,
            headers={"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(req, timeout=3, context=ctx) as r:
                return int(r.status), r.read().decode()
        except urllib.error.HTTPError as e:
            return int(e.code), e.read().decode()
        except OSError as e:
            return 0, str(e)

    def _write_kubeconfig(self) -> None:
        self.kubeconfig.write_text(textwrap.dedent(f"""\
            apiVersion: v1
            kind: Config
            clusters:
              - name: ops
                cluster:
                  server: https://127.0.0.1:{self.api_port}
                  insecure-skip-tls-verify: true
            users:
              - name: admin
                user:
                  token: {self.token}
            contexts:
              - name: ops
                context: {{cluster: ops, user: admin, namespace: default}}
            current-context: ops
            """))
        os.chmod(self.kubeconfig, 0o600)

    def _nodes(self) -> None:
        resources = {"cpu": "32", "memory": "256Gi", "pods": "110"}
        for name in NODES:
            self.api("POST", "/api/v1/nodes", {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": name,
                    "annotations": {"kwok.x-k8s.io/node": "fake"},
                    "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "type": "kwok"},
                },
                "status": {"allocatable": resources, "capacity": resources},
            })

        def nodes_ready() -> bool:
            for p in self.procs:
                p.check_alive()
            items = self.api("GET", "/api/v1/nodes")["items"]
            ready = [
                n for n in items
                if any(c["type"] == "Ready" and c["status"] == "True" for c in n["status"].get("conditions", []))
            ]
            return len(ready) == len(NODES)

        wait_for(nodes_ready, timeout=60, what="kwok nodes Ready", details=self.describe)

    # -- clients --------------------------------------------------------------------------

    @property
    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["KUBECONFIG"] = str(self.kubeconfig)
        env["HELM_CACHE_HOME"] = str(self.dir / "helm-cache")
        env["HELM_CONFIG_HOME"] = str(self.dir / "helm-config")
        env["HELM_DATA_HOME"] = str(self.dir / "helm-data")
        return env

    def api(self, method: str, path: str, body: Any = None) -> Any:
        """One call of the Kubernetes REST API; its JSON answer (fails on an error status)."""
        status, text = self._request(method, path, body)
        if not 200 <= status < 300:
            raise AssertionError(f"{method} {path} -> {status}: {text[:2000]}")
        return json.loads(text)

    def pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        import urllib.parse

        query = urllib.parse.urlencode({"labelSelector": selector})
        return list(self.api("GET", f"/api/v1/namespaces/{namespace}/pods?{query}")["items"])

    def helm(self, *args: str, check: bool = True, timeout: float = 300) -> Any:
        return run([self.bins["helm"], *args], env=self.env, check=check, timeout=timeout)
