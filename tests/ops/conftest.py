"""Fixtures of the ops tests: the real control plane, the built image. Every test here is
marked ``ops``; a missing tool fails it in CI and skips it elsewhere (see ops_tools)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from ops_kube import KubeCluster
from ops_podman import build_image

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.ops)


@pytest.fixture(scope="session")
def kube(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeCluster]:
    """etcd + kube-apiserver + controller-manager + scheduler + kwok nodes, for the whole run."""
    cluster = KubeCluster(tmp_path_factory.mktemp("kube")).start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def harness_image() -> str:
    """The project's image, built by podman from the Containerfile (cached layers when warm)."""
    return build_image()
