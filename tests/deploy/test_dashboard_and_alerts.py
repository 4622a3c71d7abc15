"""The Grafana dashboard and the Prometheus alerts query metrics fairq really exports.

A fairq with a simulated backend serves a request; its /metrics is scraped over HTTP and
parsed like Prometheus would. Every metric name in a dashboard or alert expression must be
in it (histogram and counter series by their family), and every label a panel groups by must
be a label of that metric.
"""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import grpc
import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from fairq.v1 import scheduler_pb2, scheduler_pb2_grpc
from fairq_sim import SimServer

from ..conftest import FairqFactory, make_config, sim_backend

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "dashboards" / "fairq.json"
ALERTS = ROOT / "deploy" / "prometheus" / "alerts.yml"

# Series Prometheus itself adds, not fairq.
PROMETHEUS_SERIES = {"up"}
TARGET_LABELS = {"instance", "job"}
_SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "info": ("_info",),
    "gauge": ("",),
}
_NOT_METRICS = {
    "by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless",
    "bool", "offset", "inf", "nan",
}  # fmt: skip


def metric_names(expr: str) -> set[str]:
    """Metric names in a PromQL expression (functions, labels, strings and ranges removed)."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', "", expr)
    expr = re.sub(r"\{[^}]*\}", "", expr)
    expr = re.sub(r"\[[^\]]*\]", "", expr)
    expr = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", expr)
    names = set()
    for match in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", expr):
        rest = expr[match.end() :].lstrip()
        if rest.startswith("(") or match.group() in _NOT_METRICS:
            continue
        names.add(match.group())
    return names


def grouping_labels(expr: str) -> dict[str, set[str]]:
    """For each ``sum by (labels) (...metric...)``, the labels grouped by, per metric inside."""
    found: dict[str, set[str]] = {}
    for match in re.finditer(r"by \(([^)]*)\)\s*\((.*)", expr):
        labels = {label.strip() for label in match.group(1).split(",")} - {"le"}
        for name in metric_names(match.group(2).split(")")[0] + ")"):
            found.setdefault(name, set()).update(labels)
    return found


def dashboard_exprs() -> list[str]:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return [t["expr"] for p in panels for t in p.get("targets", [])]


def alert_exprs() -> list[str]:
    groups = yaml.safe_load(ALERTS.read_text())["groups"]
    return [rule["expr"] for g in groups for rule in g["rules"]]


@pytest.fixture
async def exported(sim: SimServer, fairq_factory: FairqFactory) -> dict[str, set[str]]:
    """fairq's /metrics after one request: series name -> label names seen on it."""
    config = replace(make_config([sim_backend(sim)]), metrics_listen="127.0.0.1:0")
    server = await fairq_factory(config)
    request = scheduler_pb2.GenerateRequest(
        model="sim", prompt="hi", sampling=scheduler_pb2.SamplingParams(max_tokens=3)
    )
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        [e async for e in scheduler_pb2_grpc.SchedulerStub(channel).Generate(request)]
    async with httpx.AsyncClient() as http:
        text = (await http.get(f"http://127.0.0.1:{server.metrics_port}/metrics")).text
    series: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(text):
        for suffix in _SUFFIXES.get(family.type, ("",)):
            series.setdefault(family.name + suffix, set())
        for sample in family.samples:
            series.setdefault(sample.name, set()).update(sample.labels)
    return series


def test_the_expression_parser_finds_metrics_and_groupings() -> None:
    expr = (
        'histogram_quantile(0.99, sum by (tier, le) (rate(fairq_queue_wait_seconds_bucket'
        '{instance=~"$instance"}[$__rate_interval]))) > on (tier) group_left() up'
    )  # fmt: skip
    assert metric_names(expr) == {"fairq_queue_wait_seconds_bucket", "up"}
    assert grouping_labels(expr) == {"fairq_queue_wait_seconds_bucket": {"tier"}}


async def test_every_dashboard_metric_and_grouping_exists(exported: dict[str, set[str]]) -> None:
    exprs = dashboard_exprs()
    assert len(exprs) >= 15
    queried = set().union(*(metric_names(e) for e in exprs))
    # What the issue asks the dashboard to show.
    for wanted in (
        "fairq_queue_depth", "fairq_queue_wait_seconds_bucket",
        "fairq_time_to_first_token_seconds_bucket", "fairq_gate_refusals_total",
        "fairq_backend_waiting", "fairq_backend_running", "fairq_backend_tpot_seconds",
        "fairq_tokens_total", "fairq_event_loop_lag_seconds_bucket",
    ):  # fmt: skip
        assert wanted in queried
    assert queried - set(exported) == set()
    for expr in exprs:
        for name, labels in grouping_labels(expr).items():
            if exported[name]:  # families without samples yet carry no label names
                assert labels - exported[name] - TARGET_LABELS == set(), (name, labels)


async def test_every_alert_metric_exists(exported: dict[str, set[str]]) -> None:
    queried = set().union(*(metric_names(e) for e in alert_exprs()))
    assert "fairq_backend_healthy" in queried and "fairq_event_loop_lag_seconds_bucket" in queried
    assert queried - set(exported) - PROMETHEUS_SERIES == set()


def test_dashboard_panels_are_well_formed() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        if panel["type"] == "row":
            continue
        assert panel["datasource"]["uid"] == "${datasource}"
        assert panel["targets"] and all(t["expr"] for t in panel["targets"])
    names = [v["name"] for v in dashboard["templating"]["list"]]
    assert names == ["datasource", "instance"]
