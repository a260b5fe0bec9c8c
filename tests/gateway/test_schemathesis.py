"""schemathesis against the live gateway's /openapi.json: no 5xx on any generated request.

Every operation is fuzzed with valid (positive) and invalid (negative) requests, on
random session ids and on a real session that waits on an ask (so answers, records
and cancels reach the judging code, not only the 404)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable

from tests.apps.approvals import approvals
from tests.gateway.helpers import HARNESS, ServerThread, open_settings, wait_for


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    path: Path = tmp_path_factory.mktemp("schemathesis") / "h.db"
    with ServerThread(open_settings(f"sqlite:///{path}"), harnesses=[approvals], worker=True) as server:
        yield server


def test_no_server_error_on_any_request(live: ServerThread) -> None:
    with httpx.Client(base_url=live.url, timeout=30) as http:
        http.post("/v1/sessions/known/messages", json={"text": "please approve", "harness": HARNESS})
        wait_for(lambda: http.get("/v1/sessions/known").json()["summary"]["state"] == "waiting",
                 timeout=30, what="the session to wait")
    api = schemathesis.openapi.from_url(f"{live.url}/openapi.json")
    operations = [result.ok() for result in api.get_all_operations()]
    assert len(operations) >= 8
    failures: list[str] = []
    statuses: Counter[int] = Counter()
    for operation in operations:
        if operation.path.endswith("/events"):
            continue  # any valid id opens a stream that never ends (tests/gateway/test_sse.py drives it)
        pinned = "{session_id}" in operation.path
        for mode in schemathesis.GenerationMode:
            for path_parameters in [None, {"session_id": "known"}] if pinned else [None]:
                strategy = operation.as_strategy(mode, path_parameters=path_parameters)

                @given(case=strategy)
                @settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck), database=None)
                def check(case: Any) -> None:
                    wait = (case.query or {}).get("wait")
                    if isinstance(wait, int | float) and not isinstance(wait, bool) and wait > 0.2:
                        case.query["wait"] = 0.2  # a message's ?wait holds the request; a long one proves nothing more
                    response = case.call(timeout=20)
                    statuses[response.status_code] += 1
                    if response.status_code >= 500:
                        failures.append(
                            f"{case.method} {case.formatted_path} -> {response.status_code}: {response.text[:300]}")

                try:
                    check()
                except Unsatisfiable:
                    # an operation without inputs has no invalid request to make
                    assert mode is schemathesis.GenerationMode.NEGATIVE, operation.path
    assert failures == []
    print("statuses", dict(statuses))
    assert statuses[200] > 0 and statuses[422] > 0 and statuses[404] > 0, statuses
