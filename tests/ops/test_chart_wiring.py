"""The chart's wiring is what runs: the rendered worker pod's entrypoint, args and
environment (ConfigMap, pod name, Secret references) start a local worker process that
drives a session on the test broker to completion, joins the group under the pod's
name, and answers its probes where the chart points them."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path
from typing import Any

import pytest
from chart import find, process_of, render, write_values
from ops_tools import REPO, Proc, free_port, http_get, wait_for

from harness import ids
from harness.client import HarnessClient
from harness.records import TurnFinished
from harness.services.worker.secrets import ENV_PREFIX, secrets_from_env

pytestmark = pytest.mark.kafka

SECRETS = {"model-keys": {"openai": "sk-test-not-a-real-key"}}


def _group_instance_ids(bootstrap: str, group: str) -> list[str]:
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})
    description = admin.describe_consumer_groups([group])[group].result(timeout=30)
    return sorted(m.group_instance_id or "" for m in description.members)


async def _drive_one_session(bootstrap: str, prefix: str, partitions: int) -> list[Any]:
    async with HarnessClient(bootstrap=bootstrap, topic_prefix=prefix, partitions=partitions) as client:
        input_id = await client.send("wired-1", "hello from the chart", harness="harness/smoke")
        settled = await client.wait_settled("wired-1", input_id, timeout=90)
        assert settled.outcome == "completed", settled
        return [e.record for e in await client.log.read("wired-1")]


def test_rendered_worker_pod_runs_a_session(kafka_bootstrap: str, unique_prefix: str, tmp_path: Path) -> None:
    metrics_port = free_port()
    values = write_values(tmp_path / "values.yaml", {
        "kafka": {"bootstrap": kafka_bootstrap, "topicPrefix": unique_prefix, "partitions": 3, "replicationFactor": 1,
                  "config": {"client.id": "ops-wiring-test"}},
        "worker": {"replicas": 1},
        "metrics": {"port": metrics_port},
        "logging": {"format": "text"},
        "appSecrets": {"env": [{"name": "openai", "secretName": "model-keys", "key": "openai"}]},
    })
    docs = render(values, release="wired")
    sts = find(docs, "StatefulSet", "-worker")
    pod_name = f"{sts['metadata']['name']}-0"
    argv, env = process_of(docs, sts, pod_name=pod_name, secrets=SECRETS)
    assert argv == ["harness", "worker"]
    assert env["HARNESS_INSTANCE_ID"] == pod_name
    # App secrets (model API keys) reach the sessions' tools through the worker only (as the
    # worker reads them); the gateway never calls a model or runs a tool, so its pods get none.
    assert secrets_from_env(env) == {"openai": "sk-test-not-a-real-key"}
    gw_argv, gw_env = process_of(docs, find(docs, "Deployment", "-gateway"), pod_name="gw", secrets=SECRETS)
    assert gw_argv[:2] == ["harness", "gateway"]
    assert not [k for k in gw_env if k.startswith(ENV_PREFIX)], "a gateway pod got the workers' app secrets"
    assert "sk-test-not-a-real-key" not in gw_env.values()

    # The image's `harness` is this checkout's CLI: run it with this interpreter.
    proc_env = {k: v for k, v in os.environ.items() if not k.startswith("HARNESS_")}
    proc_env.update(env)
    proc_env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    worker = Proc("worker", [sys.executable, "-m", "harness.cli", *argv[1:]], workdir=tmp_path, env=proc_env)
    try:
        container = sts["spec"]["template"]["spec"]["containers"][0]
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        probe = container["readinessProbe"]["httpGet"]
        ready_url = f"http://127.0.0.1:{ports[probe['port']]}{probe['path']}"

        def ready() -> bool:
            worker.check_alive()
            return http_get(ready_url, timeout=2)[0] == 200

        wait_for(ready, timeout=90, what="the worker's readiness probe", details=worker.describe)
        live = container["livenessProbe"]["httpGet"]
        assert http_get(f"http://127.0.0.1:{ports[live['port']]}{live['path']}")[0] == 200

        records = asyncio.run(_drive_one_session(kafka_bootstrap, unique_prefix, 3))
        finished = [r for r in records if isinstance(r, TurnFinished)]
        assert [(f.outcome, f.text) for f in finished] == [("completed", "smoke ok: hello from the chart")]

        assert _group_instance_ids(kafka_bootstrap, ids.workers_group(unique_prefix)) == [pod_name]
        status, metrics = http_get(f"http://127.0.0.1:{metrics_port}/metrics")
        assert status == 200 and "harness_partitions_owned 3.0" in metrics
        assert "sk-test-not-a-real-key" not in metrics + worker.output(), "a secret reached a metric or a log line"
    finally:
        worker.proc.send_signal(signal.SIGTERM)
        grace = sts["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
        code = worker.proc.wait(grace)
        worker.stop()
    assert code == 0, worker.describe()
