"""docs/operations.md: its alerting rules parse, and name only metrics jobsd exposes.

The rules' block is loaded with PyYAML; each ``expr`` is split into the metric names
it reads, and each name is looked up in what a real app (an API with a daemon
attached, after a run that failed) serves on /metrics.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from apikit import running_api, running_daemon, settings_for, wait_until
from prometheus_client.parser import text_string_to_metric_families

import jobsd
from jobsd.registry import Registry

yaml = pytest.importorskip("yaml")

pytestmark = pytest.mark.anyio

DOC = Path(__file__).resolve().parents[2] / "docs" / "operations.md"

# not jobsd's: Prometheus's own, and the blackbox exporter's probe of /health
FOREIGN = {"up", "probe_success"}

_SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_count", "_sum", "_created"),
    "summary": ("_count", "_sum", "_created"),
}
_KEYWORDS = {"and", "or", "unless", "by", "without", "on", "ignoring", "bool", "offset"}
_KEYWORDS |= {"group_left", "group_right"}
_IDENT = re.compile(r"(?<![\w.:])([a-zA-Z_:][\w:]*)(\s*\()?")
_SELECTOR = re.compile(r"([a-zA-Z_:][\w:]*)\s*\{([^}]*)\}")


def rules() -> list[dict[str, Any]]:
    """Return the rules of the doc's ``groups:`` block."""
    text = DOC.read_text(encoding="utf-8")
    blocks = [b for b in re.findall(r"```yaml\n(.*?)```", text, re.S) if b.startswith("groups:")]
    assert len(blocks) == 1, "one block of alerting rules"
    loaded = yaml.safe_load(blocks[0])
    return [rule for group in loaded["groups"] for rule in group["rules"]]


def metric_names(expr: str) -> set[str]:
    """Return the metric names a PromQL expression reads: its identifiers, less the
    functions, operators, label matchers, grouping labels and durations."""
    text = re.sub(r'"[^"]*"', '""', expr)  # label values
    text = re.sub(r"\{[^}]*\}", "", text)  # matchers
    text = re.sub(r"\[[^\]]*\]", "", text)  # ranges
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", text)
    names = set()
    for name, call in _IDENT.findall(text):
        if not call and name not in _KEYWORDS:
            names.add(name)
    return names


def test_metric_names_of_an_expression() -> None:
    expr = (
        'max by (queue) (jobsd_queue_depth{status="queued"}) > 0\n'
        "and on () sum(rate(jobsd_job_errors_total[5m])) / 1e-9 unless up == 0"
    )
    assert metric_names(expr) == {"jobsd_queue_depth", "jobsd_job_errors_total", "up"}


def test_the_rules_parse_and_have_what_prometheus_needs() -> None:
    found = rules()
    names = [rule["alert"] for rule in found]
    assert len(names) == len(set(names)), "alert names are unique"
    for rule in found:
        assert set(rule) <= {"alert", "expr", "for", "labels", "annotations"}, rule
        assert isinstance(rule["expr"], str) and rule["expr"].strip()
        assert re.fullmatch(r"\d+[smh]", str(rule.get("for", "0s"))), rule
        assert "summary" in rule["annotations"]
    # the four kinds of trouble the page promises
    exprs = "\n".join(rule["expr"] for rule in found)
    for metric in (
        "jobsd_queue_oldest_age_seconds",
        "jobsd_job_errors_total",
        "jobsd_slots",
        "jobsd_seconds_since_last_notify",
        "probe_success",
    ):
        assert metric in exprs
    assert 'jobsd_queue_depth{status="recovery_required"}' in exprs


async def test_every_metric_the_rules_read_is_served(db_url: str) -> None:
    registry = Registry()

    @jobsd.handler("fails", registry=registry)
    async def fails(ctx: jobsd.JobContext) -> None:
        raise ValueError("no such mailbox")

    settings = settings_for(db_url)
    async with (
        running_daemon(settings, registry) as daemon,
        running_api(settings, daemon=daemon) as api,
    ):
        async with jobsd.Client(db_url) as client:
            await client.enqueue("fails", org_id="acme")

        async def scraped() -> str | None:
            text = (await api.client.get("/metrics")).text
            return text if "jobsd_job_errors_total{" in text else None

        text = await wait_until(scraped, what="the failed run in /metrics")
    served: set[str] = set()
    label_values: dict[tuple[str, str], set[str]] = {}
    for family in text_string_to_metric_families(text):
        served.add(family.name)
        served.update(family.name + suffix for suffix in _SUFFIXES.get(family.type, ()))
        for sample in family.samples:
            for label, value in sample.labels.items():
                label_values.setdefault((sample.name, label), set()).add(value)
    for rule in rules():
        unknown = metric_names(rule["expr"]) - served - FOREIGN
        assert not unknown, f"{rule['alert']} reads {sorted(unknown)}, which jobsd does not serve"
        # each label value a selector asks for is one the metric has
        for name, matchers in _SELECTOR.findall(rule["expr"]):
            for label, value in re.findall(r'(\w+)\s*=\s*"([^"]*)"', matchers):
                if name in FOREIGN or label == "job":
                    continue
                assert value in label_values.get((name, label), set()), (rule["alert"], name)
