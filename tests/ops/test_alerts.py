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


# Log lines the runbook tells operators to look for: each is in the runbook and logged by the code.
RUNBOOK_LOG_LINES = [
    "owning partition", "gave up partition", "its producer stopped", "event loop has not run",
    "drain timed out", "is parked, not driven", "an unreadable record of no known session",
]


def test_the_log_lines_the_runbook_names_are_logged() -> None:
    runbook = RUNBOOK.read_text()
    source = "\n".join(p.read_text() for p in (REPO / "harness").rglob("*.py"))
    for line in RUNBOOK_LOG_LINES:
        assert line in runbook, f"docs/runbook.md does not name the log line {line!r}"
        assert line in source, f"docs/runbook.md names {line!r}, which nothing logs"
