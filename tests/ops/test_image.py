"""The container image: hadolint finds nothing in the Containerfile; podman builds it from
the offline Debian base; it runs non-root with a read-only root filesystem, holds no
installer or compiler, and runs as a worker (host network) that drives a session on the
test broker until it settles, sent through the image's own gateway (the chart runs both
roles from it), then both stop cleanly on SIGTERM."""

from __future__ import annotations

import asyncio
import json
import urllib.request
from pathlib import Path

import pytest
from ops_podman import Container, podman, source_commit
from ops_tools import REPO, free_port, http_get, python_tool, run, wait_for

from harness.build import build_info
from harness.client import HarnessClient


def test_hadolint_finds_nothing() -> None:
    proc = run([*python_tool("hadolint"), str(REPO / "Containerfile")], check=False)
    assert proc.returncode == 0 and not proc.stdout.strip(), proc.stdout + proc.stderr


def test_image_is_non_root_without_build_tools(harness_image: str) -> None:
    info = json.loads(run([podman(), "image", "inspect", harness_image]).stdout)[0]
    config = info["Config"]
    assert config["User"] == "10001:10001"
    assert config["Entrypoint"] == ["harness"]
    probe = (
        "import importlib.util, shutil, sys; "
        "found = [m for m in ('pip', 'setuptools', 'ensurepip') if importlib.util.find_spec(m)]; "
        "found += [b for b in ('gcc', 'cc', 'make', 'pip', 'pip3') if shutil.which(b)]; "
        "print(found); sys.exit(1 if found else 0)"
    )
    proc = run([podman(), "run", "--rm", "--read-only", "--entrypoint", "python3", harness_image, "-c", probe], check=False)
    assert proc.returncode == 0, f"build tools in the final image: {proc.stdout}{proc.stderr}"
    helped = run([podman(), "run", "--rm", "--read-only", harness_image, "--help"])
    assert "worker" in helped.stdout + helped.stderr


def test_image_names_its_source_commit(harness_image: str) -> None:
    """Two builds of one version differ by commit: the image's label and `harness --version`
    in it name the commit it was built from (no .git in the image: the build's baked file)."""
    commit = source_commit()
    if not commit:
        pytest.skip("the source is not a git checkout: the image was built without a REVISION")
    info = json.loads(run([podman(), "image", "inspect", harness_image]).stdout)[0]
    assert info["Config"]["Labels"]["org.opencontainers.image.revision"] == commit
    out = run([podman(), "run", "--rm", "--read-only", harness_image, "--version"]).stdout
    assert out == f"harness {build_info().version} (commit {commit[:7]})\n"


HARDENED = ["--network", "host", "--read-only", "--cap-drop", "ALL", "--security-opt", "no-new-privileges"]


def start_ready(image: str, args: list[str], workdir: Path, ready_url: str, what: str) -> Container:
    """A hardened container of the image (host network), once ``ready_url`` answers 200."""
    container = Container(image, args, workdir=workdir, options=HARDENED)

    def ready() -> bool:
        if not container.running():
            raise AssertionError(f"the {what} container exited\n{container.describe()}")
        return http_get(ready_url, timeout=2)[0] == 200

    try:
        wait_for(ready, timeout=120, what=f"the containerized {what} ready", details=container.describe)
    except BaseException:
        container.remove()
        raise
    return container


@pytest.mark.kafka
def test_image_runs_a_worker_that_settles_a_session(
    harness_image: str, kafka_bootstrap: str, unique_prefix: str, tmp_path: Path
) -> None:
    log_url = f"kafka://{kafka_bootstrap}?topic_prefix={unique_prefix}&partitions=2"
    metrics_port = free_port()
    worker = start_ready(harness_image, ["worker", "--log", log_url, "--app", "harness.testing.smoke:harness",
                                         "--metrics-port", str(metrics_port)],
                         tmp_path, f"http://127.0.0.1:{metrics_port}/readyz", "worker")
    try:
        async def session() -> str:
            async with HarnessClient(bootstrap=kafka_bootstrap, topic_prefix=unique_prefix, partitions=2) as client:
                input_id = await client.send("img-1", "from the image", harness="harness/smoke")
                return (await client.wait_settled("img-1", input_id, timeout=90)).outcome

        assert asyncio.run(session()) == "completed"
        assert "worker ready" in worker.output()

        port = free_port()
        gateway = start_ready(harness_image, ["gateway", "--log", log_url, "--host", "127.0.0.1", "--port", str(port),
                                              "--open-access"],
                              tmp_path, f"http://127.0.0.1:{port}/readyz", "gateway")
        try:
            body = json.dumps({"text": "through the gateway", "harness": "harness/smoke"}).encode()
            request = urllib.request.Request(
                f"http://127.0.0.1:{port}/v1/sessions/img-2/messages?wait=90", data=body,
                headers={"content-type": "application/json"}, method="POST")
            with urllib.request.urlopen(request, timeout=120) as answer:
                receipt = json.loads(answer.read())
            assert receipt["settlement"]["outcome"] == "completed", receipt
            assert gateway.stop(timeout=60) == 0, gateway.describe()
        finally:
            gateway.remove()
        assert worker.stop(timeout=60) == 0, worker.describe()
    finally:
        worker.remove()
