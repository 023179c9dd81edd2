"""Reading Prometheus text expositions in tests (a worker's or receiver's ``/metrics``, a rendered registry), and
the metric names the shipped alert rules and dashboard use (``infra/deploy/``)."""

from __future__ import annotations

import json
import re
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import yaml
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

DEPLOY = Path(__file__).resolve().parents[2] / "infra" / "deploy"
RULES = DEPLOY / "prometheus" / "rules.yml"
RULE_TESTS = DEPLOY / "prometheus" / "rules.test.yml"
DASHBOARD = DEPLOY / "grafana" / "durafix.json"
_METRIC = re.compile(r"\b(?:durafix|temporal)_[a-zA-Z0-9_]+")
_SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "summary": ("_sum", "_count")}


@dataclass
class Exposition:
    samples: list[Sample]
    names: set[str]
    """Every name a query may use: families, their samples, and the suffixed names of their types."""

    def values(self, name: str, **labels: str) -> list[float]:
        return [
            s.value for s in self.samples if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
        ]

    def total(self, name: str, **labels: str) -> float:
        return sum(self.values(name, **labels))

    def label_values(self) -> set[str]:
        return {v for s in self.samples for v in s.labels.values()}


def parse(text: str) -> Exposition:
    samples: list[Sample] = []
    names: set[str] = set()
    for family in text_string_to_metric_families(text):
        names.add(family.name)
        names.update(family.name + suffix for suffix in _SUFFIXES.get(family.type, ()))
        for sample in family.samples:
            samples.append(sample)
            names.add(sample.name)
    return Exposition(samples, names)


def scrape(url: str) -> Exposition:
    with urllib.request.urlopen(url, timeout=20) as answer:
        return parse(answer.read().decode())


def rule_expressions() -> list[str]:
    document = yaml.safe_load(RULES.read_text())
    return [rule["expr"] for group in document["groups"] for rule in group["rules"]]


def dashboard_expressions() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])]


def metric_names(expressions: list[str]) -> set[str]:
    """The durafix and Temporal SDK metric names ``expressions`` (PromQL) query."""
    return {name for expr in expressions for name in _METRIC.findall(expr)}


def named_metrics() -> set[str]:
    """The durafix and Temporal SDK metric names the rules and the dashboard query."""
    return metric_names([*rule_expressions(), *dashboard_expressions()])
