"""The Grafana dashboard (``deploy/grafana/easkit-gateway.json``) asks only for metrics the
gateway exports: every metric named in its queries is read from ``/metrics`` of a running
gateway serving every kind of service the panels show (a worker pool, a queue, an
asynchronous service, a payload log) after a call to each."""

from __future__ import annotations

import json
import re
import urllib.request
from pathlib import Path
from typing import Any

from tests.e2e.gateway_proc import ROOT, GatewayProcess
from tests.waiting import wait_until

DASHBOARD = ROOT / "deploy" / "grafana" / "easkit-gateway.json"
ECHO = "samples/processors/echo.py:EchoProcessor"
# PromQL words that are not metric names.
_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "bool"}


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads: what is left once label matchers, ranges,
    strings, grouping clauses, functions and numbers are taken out."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', "", expr)
    text = re.sub(r"\{[^}]*\}", "", text)
    text = re.sub(r"\[[^\]]*\]", "", text)
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", text)
    names = set()
    for match in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", text):
        word = match.group(0)
        following = text[match.end() :].lstrip()[:1]
        if word in _KEYWORDS or following == "(":
            continue  # a keyword or a function
        names.add(word)
    return names


def queries(dashboard: dict[str, Any]) -> list[str]:
    out = []
    for panel in dashboard["panels"]:
        for target in panel.get("targets", ()):
            out.append(target["expr"])
    for var in dashboard["templating"]["list"]:
        if var["type"] == "query":
            out.append(re.sub(r"^label_values\((\w+),.*\)$", r"\1", var["definition"]))
    return out


def test_metric_names_are_read_from_promql() -> None:
    expr = 'histogram_quantile(0.99, sum by (service, le) (rate(a_bucket{s=~"x|y"}[$__rate_interval]))) - b'
    assert metric_names(expr) == {"a_bucket", "b"}
    assert metric_names("process_resident_memory_bytes / 1048576") == {"process_resident_memory_bytes"}


def _post(url: str, body: bytes) -> None:
    with urllib.request.urlopen(urllib.request.Request(url, data=body), timeout=10) as resp:
        resp.read()


def test_every_query_names_a_metric_the_gateway_exports(gateway_factory: Any, tmp_path: Path) -> None:
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    config = {
        "services": [
            {
                "name": "echo",
                "processor": "python",
                "entry": ECHO,
                "workers": 1,
                "payload_log": {"sink": f"file://{tmp_path}/payloads.jsonl"},
            },
            {"name": "jobs", "processor": "queue"},
            {"name": "later", "processor": "python", "entry": ECHO, "workers": 1, "async": True},
        ],
    }
    gw: GatewayProcess = gateway_factory(config)
    gw.wait_workers_ready("echo", 1)
    gw.wait_workers_ready("later", 1)
    _post(gw.url + "/api/predict/echo", b"hi")
    _post(gw.url + "/api/predict/jobs", b"job")
    _post(gw.url + "/api/predict/later", b"work")

    def exported() -> set[str]:
        with urllib.request.urlopen(gw.url + "/metrics", timeout=10) as resp:
            text = resp.read().decode()
        names = {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line and line[0] != "#"}
        # The async service's result is written once its record has run.
        return names if "easgw_async_results_total" in names else set()

    names = wait_until(exported, 30, "the asynchronous service's figures in /metrics")
    wanted = set().union(*(metric_names(q) for q in queries(dashboard)))
    assert wanted, "the dashboard has no queries"
    assert sorted(wanted - names) == []
