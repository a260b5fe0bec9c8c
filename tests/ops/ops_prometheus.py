"""A real Prometheus (Debian's) scraping targets on this machine, queried over its HTTP API;
and promtool."""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from ops_tools import Proc, free_port, http_get, run, tool, wait_for

SCRAPE_INTERVAL_S = 1


class Prometheus:
    """``Prometheus(workdir, jobs={"durable-harness-worker": ["127.0.0.1:9464"]}).start()``."""

    def __init__(self, workdir: Path, jobs: Mapping[str, Sequence[str]], *, rule_files: Sequence[Path] = ()) -> None:
        self.dir = workdir
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.bin = tool("prometheus")
        config = {
            "global": {"scrape_interval": f"{SCRAPE_INTERVAL_S}s", "evaluation_interval": f"{SCRAPE_INTERVAL_S}s"},
            "rule_files": [str(p) for p in rule_files],
            "scrape_configs": [
                {"job_name": job, "static_configs": [{"targets": list(targets)}]} for job, targets in jobs.items()
            ],
        }
        self.config = self.dir / "prometheus.yml"
        self.config.write_text(yaml.safe_dump(config))
        self.proc: Proc | None = None

    def start(self) -> Prometheus:
        self.proc = Proc("prometheus", [
            self.bin, f"--config.file={self.config}", f"--storage.tsdb.path={self.dir / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn",
        ], workdir=self.dir)
        proc = self.proc

        def ready() -> bool:
            proc.check_alive()
            return http_get(f"{self.url}/-/ready", timeout=2)[0] == 200

        wait_for(ready, timeout=30, what="prometheus ready", details=proc.describe)
        return self

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop()

    def query(self, expr: str) -> list[dict[str, Any]]:
        """The instant vector of ``expr`` now (fails on a query error)."""
        status, body = http_get(f"{self.url}/api/v1/query?{urllib.parse.urlencode({'query': expr})}")
        answer = json.loads(body) if body.startswith("{") else {"status": "error", "error": body}
        if status != 200 or answer.get("status") != "success":
            raise AssertionError(f"query {expr!r} failed: {answer.get('error', body)}")
        return list(answer["data"]["result"])

    def wait_data(self, expr: str, *, timeout: float = 60, what: str | None = None) -> list[dict[str, Any]]:
        """Poll until ``expr`` returns at least one series."""
        result: list[dict[str, Any]] = []

        def has_data() -> bool:
            nonlocal result
            result = self.query(expr)
            return bool(result)

        wait_for(has_data, timeout=timeout, what=what or f"data for {expr!r}", details=self.targets)
        return result

    def targets(self) -> str:
        return http_get(f"{self.url}/api/v1/targets")[1][:3000]


def promtool(*args: str) -> str:
    """Run promtool; returns its output (fails with it on a non-zero exit)."""
    proc = run([tool("promtool"), *args], timeout=120)
    return proc.stdout + proc.stderr


def check_exprs(exprs: Mapping[str, str], workdir: Path) -> None:
    """Every expression parses as PromQL: written as recording rules and checked by promtool."""
    rules = [{"record": f"check:{i}", "expr": expr} for i, expr in enumerate(exprs.values())]
    path = workdir / "exprs.rules.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "exprs", "rules": rules}]}))
    promtool("check", "rules", str(path))
