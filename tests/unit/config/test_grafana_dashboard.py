"""config/grafana/capi-gpu-dashboard.json: every metric a panel queries is one the operator exports (read back
from its real exposition text after the product code recorded one sample of each), with labels it carries in
matchers and `by (...)`, label values from the product's enums; every exported capi_gpu metric is drawn; the
panels the issue asks for exist (provisioning durations, Robot budget and 403/401, gate latency, hosts by state,
claims waiting on the gate)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY, CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from capi_gpu.api.host import HostState
from capi_gpu.hetzner import account, budget
from capi_gpu.hetzner import budget_metrics as robot_metrics
from capi_gpu.runtime import metrics

DASHBOARD = Path(__file__).resolve().parents[3] / "config" / "grafana" / "capi-gpu-dashboard.json"
SCRAPE_LABELS = {"job", "instance"}  # added by Prometheus, not by the exporter
FUNCTIONS = {"sum", "min", "max", "avg", "rate", "increase", "histogram_quantile", "count"}
KEYWORDS = {"by", "without", "on", "ignoring", "and", "or", "unless"}
# Label values the dashboard may filter on, from the product's own enums.
KNOWN_VALUES = {"outcome": {o.value for o in robot_metrics.Outcome}, "state": {s.value for s in HostState}}


def exported() -> dict[str, set[str]]:
    """Sample name -> label names, from the exposition text after one observation of each metric."""
    metrics.observe_step("Install", 12.0)
    metrics.GATE_SECONDS.labels(transition="untaint").observe(0.2)
    metrics.STANDBY_HOSTS.labels(template="default/gpu").set(1)
    metrics.CLAIM_DECISIONS.labels(outcome="Bind").inc()
    metrics.host_state("default", "dash-test-host", HostState.PROVISIONING.value)
    metrics.CLAIMS_WAITING.labels(cluster="default/dev").set(0)
    robot = account.AccountRegistry(prometheus=(own := CollectorRegistry()))
    robot.account("robot-user").count(budget.Family.RESET_WRITE, robot_metrics.Outcome.RATE_LIMITED)
    try:
        labels: dict[str, set[str]] = {}
        for text in (generate_latest(REGISTRY), generate_latest(own)):
            for family in text_string_to_metric_families(text.decode()):
                for sample in family.samples:
                    if sample.name.startswith("capi_gpu_") and not sample.name.endswith("_created"):
                        labels.setdefault(sample.name, set()).update(sample.labels)
        return labels
    finally:
        metrics.host_state("default", "dash-test-host", None)


def exprs(dash: dict[str, Any]) -> list[str]:
    out = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    for v in dash["templating"]["list"]:
        if isinstance(v.get("query"), dict):  # label_values(metric, label) asks the same as sum by (label) (metric)
            out.append(re.sub(r"label_values\((\w+), (\w+)\)", r"sum by (\2) (\1)", v["query"]["query"]))
    return out


_TOKEN = re.compile(r'"[^"]*"|\[[^\]]*\]|\{[^}]*\}|[A-Za-z_][A-Za-z0-9_]*|\S')


def selectors(expr: str) -> list[tuple[str, dict[str, str], set[str]]]:
    """(metric, {label: value pattern}, grouping labels of the aggregation around it), parsed enough to check."""
    tokens = _TOKEN.findall(expr)
    found: list[tuple[str, dict[str, str], set[str]]] = []
    grouping: set[str] = set()
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        if tok in ("by", "without"):
            j = tokens.index(")", i)
            grouping |= {t for t in tokens[i + 2 : j] if t != ","}
            i = j + 1
            continue
        if re.fullmatch(r"[A-Za-z_]\w*", tok) and tok not in KEYWORDS:
            following = tokens[i + 1] if i + 1 < len(tokens) else ""
            if tok in FUNCTIONS:
                assert following in ("(", "by", "without"), f"{expr}: {tok} used as a metric"
            elif following == "(":
                raise AssertionError(f"{expr}: unknown function {tok}")
            else:
                matchers = tokens[i + 1] if i + 1 < len(tokens) and tokens[i + 1].startswith("{") else "{}"
                pairs = dict(re.findall(r'(\w+)\s*=~?\s*"([^"]*)"', matchers))
                found.append((tok, pairs, grouping))
        i += 1
    return found


def test_every_queried_metric_is_exported_with_its_labels() -> None:
    dash = json.loads(DASHBOARD.read_text())
    labels = exported()
    used: set[str] = set()
    for expr in exprs(dash):
        found = selectors(expr)
        assert found, expr
        for name, matchers, grouping in found:
            assert name in labels, f"{expr}: {name} is not exported (exported: {sorted(labels)})"
            used.add(name)
            have = labels[name] | SCRAPE_LABELS
            assert set(matchers) <= have, f"{expr}: {name} has no label {set(matchers) - have}"
            assert grouping <= have | {"le"}, f"{expr}: grouping by {grouping - have} that {name} lacks"
            for key, pattern in matchers.items():
                if key in KNOWN_VALUES:
                    assert set(pattern.split("|")) <= KNOWN_VALUES[key], f"{expr}: {key}={pattern}"
    families = {re.sub(r"_(bucket|sum|count)$", "", n) for n in labels}
    drawn = {re.sub(r"_(bucket|sum|count)$", "", n) for n in used}
    assert families <= drawn, f"exported but on no panel: {families - drawn}"


@pytest.mark.parametrize(
    ("topic", "metric"),
    [
        ("provisioning", "capi_gpu_host_step_duration_seconds_bucket"),
        ("budget left", "capi_gpu_robot_budget_remaining"),
        ("403", 'outcome=~"rate_limited|auth"'),
        ("gate latency", "capi_gpu_gate_latency_seconds_bucket"),
        ("hosts by state", "sum by (state) (capi_gpu_hosts"),
        ("waiting on the gate", "capi_gpu_claims_waiting_on_gate"),
    ],
)
def test_the_panels_the_issue_asks_for(topic: str, metric: str) -> None:
    dash = json.loads(DASHBOARD.read_text())
    panels = [p for p in dash["panels"] if p["type"] != "row" and topic.lower() in p["title"].lower()]
    assert panels, f"no panel titled with {topic!r}"
    assert any(metric in t["expr"] for p in panels for t in p["targets"]), (topic, metric)
    assert all(p["datasource"]["uid"] == "${datasource}" for p in panels)


def test_grid_positions_do_not_overlap() -> None:
    cells: set[tuple[int, int]] = set()
    for p in json.loads(DASHBOARD.read_text())["panels"]:
        g = p["gridPos"]
        mine = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not cells & mine, p["title"]
        assert g["x"] + g["w"] <= 24
        cells |= mine
