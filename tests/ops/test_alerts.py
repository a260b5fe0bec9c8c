"""The alert rules: promtool checks them and runs their unit tests
(tests/ops/promtool/alerts.test.yaml); each alert has its runbook entry."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import yaml
from chart import find, render, write_values
from ops_prometheus import promtool
from ops_tools import CHART, REPO

RULES = CHART / "alerts" / "durable-harness.rules.yaml"
ALERT_TESTS = Path(__file__).resolve().parent / "promtool" / "alerts.test.yaml"
CHART_ALERT_TESTS = ALERT_TESTS.with_name("chart-alerts.test.yaml")
# runbook_url = <base>#<alert>: the rules file's base is the chart's default
RUNBOOK_BASE = yaml.safe_load((CHART / "values.yaml").read_text())["prometheusRule"]["runbookBaseUrl"]
RUNBOOK = REPO / "docs" / "runbook.md"
EXPECTED = {
    "HarnessWorkerDown", "HarnessInputLagGrowing", "HarnessDeadLetters", "HarnessFencingStorm",
    "HarnessRebuildSlow", "HarnessAttemptsExhaustedSpike", "HarnessEventLoopStalled", "HarnessHandOverCutCalls",
    "HarnessSessionsHeld",
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


def test_the_charts_prometheus_rule_passes_its_promtool_unit_tests(tmp_path: Path) -> None:
    """The PrometheusRule as the chart renders it for a release: HarnessWorkerDown watches
    that release's workers only (a target down, or none at all), runbook_url is built from
    prometheusRule.runbookBaseUrl (full URLs Alertmanager links)."""
    values = write_values(tmp_path / "values.yaml", {
        "serviceMonitor": {"enabled": True},
        "prometheusRule": {"enabled": True,
                           "runbookBaseUrl": "https://git.acme.internal/harness/blob/main/docs/runbook.md"},
    })
    spec = find(render(values, release="acme", namespace="prod"), "PrometheusRule")["spec"]
    rules = tmp_path / "chart.rules.yaml"
    rules.write_text(yaml.safe_dump(spec))
    out = promtool("check", "rules", str(rules))
    assert f"SUCCESS: {len(_alerts())} rules found" in out, out
    tests = shutil.copy(CHART_ALERT_TESTS, tmp_path / CHART_ALERT_TESTS.name)
    out = promtool("test", "rules", str(tests))
    assert "SUCCESS" in out, out


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
        assert annotations["runbook_url"] == f"{RUNBOOK_BASE}#{name.lower()}"
        section = runbook.split(f"## {name}", 1)[1].split("\n## ", 1)[0]
        for part in ("Meaning", "Impact", "Diagnosis", "Mitigation"):
            assert f"**{part}**" in section, f"runbook entry {name} lacks its {part}"


# Log lines the runbook tells operators to look for: each is in the runbook and logged by the code.
RUNBOOK_LOG_LINES = [
    "owning partition", "gave up partition", "its producer stopped", "event loop has not run",
    "drain timed out", "is parked, not driven", "an unreadable record of no known session",
    "is held, not driven", "got its secrets: driving it", "input(s) of parked session",
]


def test_the_log_lines_the_runbook_names_are_logged() -> None:
    runbook = RUNBOOK.read_text()
    source = "\n".join(p.read_text() for p in (REPO / "harness").rglob("*.py"))
    for line in RUNBOOK_LOG_LINES:
        assert line in runbook, f"docs/runbook.md does not name the log line {line!r}"
        assert line in source, f"docs/runbook.md names {line!r}, which nothing logs"
