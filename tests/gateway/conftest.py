"""Fixtures of the gateway tests: a `serve`-like gateway + worker on a SQLite file."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.apps.approvals import approvals
from tests.gateway.helpers import ServerThread, open_settings


@pytest.fixture
def served(tmp_path: Path) -> Iterator[ServerThread]:
    """The gateway (open access) and a worker in one process on a fresh SQLite log."""
    with ServerThread(open_settings(f"sqlite:///{tmp_path / 'h.db'}"), harnesses=[approvals], worker=True) as server:
        yield server


@pytest.fixture
def http(served: ServerThread) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=served.url, timeout=30) as client:
        yield client
