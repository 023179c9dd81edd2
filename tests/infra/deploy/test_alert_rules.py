"""The shipped alert rules and dashboard (infra/deploy/prometheus, infra/deploy/grafana).

``promtool`` (Debian's ``prometheus`` package) checks the rules and runs their unit tests (``rules.test.yml``:
alerts shown firing and not firing); every runbook an alert names exists; and every durafix metric the rules
and the dashboard query is one the code exports, read from the real registries rendered (the worker's, its
supervisor's, the scrape-time gauges', the receiver's), never from a list kept by hand. The Temporal SDK's
metrics they query are checked against a live worker's ``/metrics`` (tests/e2e/test_pipeline.py).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections import Counter
from pathlib import Path

import yaml
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric

from pipeline.observability.gauges import OpenRunsSnapshot, OwnedSnapshot, open_runs_families, owned_families
from pipeline.observability.supervisor_metrics import SupervisorMetrics
from pipeline.observability.worker_metrics import WorkerMetrics
from pipeline.receiver.metrics import ReceiverMetrics
from tests.conftest import require
from tests.support.metrics_text import (
    RULE_TESTS,
    RULES,
    dashboard_expressions,
    metric_names,
    named_metrics,
    parse,
    rule_expressions,
)

REPO = Path(__file__).resolve().parents[3]


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    require(shutil.which("promtool") is not None, "promtool is not installed (apt-get install prometheus)")
    return subprocess.run(["promtool", *args], cwd=RULES.parent, capture_output=True, text=True, timeout=60)


def test_promtool_checks_the_rules_and_their_unit_tests_pass() -> None:
    checked = promtool("check", "rules", RULES.name)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    tested = promtool("test", "rules", RULE_TESTS.name)
    assert tested.returncode == 0, tested.stdout + tested.stderr


def test_at_least_five_alerts_are_unit_tested_firing_and_not_firing() -> None:
    cases = [case for test in yaml.safe_load(RULE_TESTS.read_text())["tests"] for case in test["alert_rule_test"]]
    firing = Counter(case["alertname"] for case in cases if case["exp_alerts"])
    quiet = Counter(case["alertname"] for case in cases if not case["exp_alerts"])
    both = set(firing) & set(quiet)
    assert len(both) >= 5, both


def test_every_alert_names_a_runbook_that_exists() -> None:
    rules = [rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]]
    index = (REPO / "docs" / "runbooks" / "alerts.md").read_text()
    for rule in rules:
        path, _, anchor = rule["annotations"]["runbook"].partition("#")
        target = REPO / path
        assert target.is_file(), (rule["alert"], path)
        if anchor:
            headings = {
                re.sub(r"[^a-z0-9 -]", "", h.lower()).replace(" ", "-")
                for h in re.findall(r"^#+ (.+)$", target.read_text(), re.M)
            }
            assert anchor in headings, (rule["alert"], anchor)
        assert rule["alert"] in index, f"{rule['alert']} is not in docs/runbooks/alerts.md"


def exported_durafix_names() -> set[str]:
    """Every name the durafix registries expose, rendered from the code (snapshots empty: the families are
    there all the same)."""
    gauges = CollectorRegistry()
    gauges.register(_Families([*open_runs_families(OpenRunsSnapshot()), *owned_families(OwnedSnapshot(Counter(), 0))]))
    texts = [
        WorkerMetrics().render(),
        generate_latest(SupervisorMetrics(lambda: False, lambda: None).registry),
        generate_latest(gauges),
        ReceiverMetrics().render(),
    ]
    names: set[str] = set()
    for text in texts:
        names |= parse(text.decode()).names
    return names


class _Families:
    """The scrape-time gauges' families as a collector (their own collectors need Temporal or providers)."""

    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> list[Metric]:
        return self.families


def test_every_durafix_metric_the_rules_and_dashboard_query_is_exported() -> None:
    named = {name for name in named_metrics() if name.startswith("durafix_")}
    assert len(named) > 10, named  # the rules and dashboard were read
    assert named - exported_durafix_names() == set()


def test_the_dashboard_queries_the_metrics_the_alerts_use() -> None:
    """An operator paged by an alert finds its metric on the dashboard."""
    in_rules = metric_names(rule_expressions())
    assert in_rules and in_rules - metric_names(dashboard_expressions()) == set()
