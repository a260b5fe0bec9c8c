"""The worker service on the embedded SQLite log, SIGKILLed mid-run and started again:
every session settles once and every side effect happens once (no Kafka needed)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from harness.client import HarnessClient
from harness.log import open_log
from harness.testing.payments import FakePaymentProvider
from tests.integration.fleet_helpers import (
    Fleet,
    LogFollower,
    Plan,
    check_invariants,
    read_everything,
    submit,
    wait_until,
)

pytestmark = pytest.mark.crash

LEASE_S = "1"
"""Session lease of the workers: the restarted worker takes the sessions over once the
dead one's leases ran out."""


async def test_sigkill_sqlite_worker_every_session_settles_once(tmp_path: Path) -> None:
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    print(f"seed={seed}")
    provider = tmp_path / "payments.db"
    FakePaymentProvider(provider)
    url = f"sqlite:///{tmp_path / 'log.db'}"
    fleet = Fleet(log_url=url, workdir=tmp_path, provider=provider)
    plans = [Plan(f"sq-{i}", order=str(i), nap=float(1 + i % 2), ask=i % 3 == 0) for i in range(20)]
    ids = [p.session_id for p in plans]
    client = HarnessClient(log=open_log(url))
    try:
        async with LogFollower(client, answer={"approved": True}) as follower:
            first = fleet.start("--lease", LEASE_S)
            await fleet.wait_ready(first)
            await submit(client, plans)
            more = rng.randint(40, 200)
            await wait_until(lambda: follower.count >= more, timeout=60, what=f"{more} records",
                             details=fleet.describe)
            first.kill()
            second = fleet.start("--lease", LEASE_S)
            await wait_until(lambda: follower.all_settled(ids), timeout=120, what="every session settled",
                             details=lambda: f"unsettled: {follower.unsettled(ids)}\n{fleet.describe()}")
            counts = check_invariants(await read_everything(client), plans, provider)
            print(f"killed after {more} records; {counts}")
            assert second.terminate() == 0, second.describe()
    finally:
        fleet.cleanup()
        await client.log.close()
