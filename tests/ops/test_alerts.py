"""The alert rules: promtool checks them and runs their unit tests
(tests/ops/promtool/alerts.test.yaml); each alert has its runbook entry."""

from __future__ import annotations

import re
from pathlib import Path

import yaml
from ops_prometheus import promtool
from ops_tools import CHART, REPO

RULES = CHART / "alerts" / "durable-harness.rules.yaml"
ALERT_TESTS = Path(__file__).resolve().parent / "promtool" / "alerts.test.yaml"
RUNBOOK = REPO / "docs" / "runbook.md"
EXPECTED = {
    "HarnessWorkerDown", "HarnessInputLagGrowing", "HarnessDeadLetters", "HarnessFencingStorm",
    "HarnessRebuildSlow", "HarnessAttemptsExhaustedSpike", "HarnessEventLoopStalled", "HarnessHandOverCutCalls",
}


def _alerts() -> list[dict[str, object]]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [r for g in groups for r in g["rules"] if "alert" in r]


def test_promtool_checks_the_rules() -> None:
    out = promtool("check", "rules", str(RULES))
    assert f"SUCCESS: {len(_alerts())} rules found" in out, out


def test_promtool_unit_tests_of_the_alerts_pass() -> None:
    out = promtool("test", "rules", str(ALERT_TESTS))
    assert "SUCCESS" in out, out
    tested = set(re.findall(r"alertname: (\w+)", ALERT_TESTS.read_text()))
    assert tested == {a["alert"] for a in _alerts()}, "every alert has a promtool unit test"


def test_every_alert_has_a_runbook_entry() -> None:
    alerts = _alerts()
    assert {a["alert"] for a in alerts} == EXPECTED
    runbook = RUNBOOK.read_text()
    headings = {h.strip() for h in re.findall(r"^## (.+)$", runbook, flags=re.M)}
    for alert in alerts:
        name = str(alert["alert"])
        assert name in headings, f"docs/runbook.md has no '## {name}' entry"
        annotations = alert["annotations"]
        assert isinstance(annotations, dict)
        assert annotations["runbook_url"] == f"docs/runbook.md#{name.lower()}"
        section = runbook.split(f"## {name}", 1)[1].split("\n## ", 1)[0]
        for part in ("Meaning", "Impact", "Diagnosis", "Mitigation"):
            assert f"**{part}**" in section, f"runbook entry {name} lacks its {part}"
