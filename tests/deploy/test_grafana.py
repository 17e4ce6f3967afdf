"""deploy/grafana/drahealth.json: well-formed, laid out on Grafana's 24-column grid,
and every query names only metrics the components really export (so a renamed metric
fails here, not on an operator's empty panel)."""

from __future__ import annotations

import json
import re
from typing import Any

from prometheus_client import CollectorRegistry

from drahealth.driver._metrics import DriverMetrics
from drahealth.driver._prepare import _make_counter
from drahealth.driver._types import PluginOptions
from drahealth.node._metrics import AgentMetrics
from drahealth.remedy._metrics import ControllerMetrics
from tests.deploy._render import ROOT

DASHBOARD = ROOT / "deploy" / "grafana" / "drahealth.json"


def exported_series() -> set[str]:
    """Series names (with _total/_bucket/... suffixes) the three components export."""
    agent = AgentMetrics("n")
    agent.watch(dict, int)  # the readings the running agent registers
    registries = [agent.registry, DriverMetrics("d.example.com").registry,
                  ControllerMetrics().registry]  # fmt: skip
    claims = CollectorRegistry()
    _make_counter(PluginOptions("d.example.com", metrics_registry=claims))
    registries.append(claims)
    names: set[str] = set()
    for reg in registries:
        for fam in reg.collect():
            if fam.type == "counter":
                names |= {fam.name + "_total"}
            elif fam.type == "histogram":
                names |= {fam.name + s for s in ("_bucket", "_sum", "_count")}
            else:
                names.add(fam.name)
    return names


def dashboard() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return data


def test_queries_use_only_exported_metrics() -> None:
    exported = exported_series()
    used: set[str] = set()
    for panel in dashboard()["panels"]:
        for target in panel["targets"]:
            expr = target["expr"]
            assert expr.count("(") == expr.count(")") and expr.count("{") == expr.count("}"), expr
            used |= set(re.findall(r"drahealth_[a-z_]+", expr))
    assert used, "no queries"
    assert used <= exported, sorted(used - exported)
    # every component is on the dashboard
    assert {n.split("_")[1] for n in used} == {"node", "driver", "remedy"}


def test_layout_ids_and_datasource() -> None:
    d = dashboard()
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids))
    for p in d["panels"]:
        g = p["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24 and g["h"] > 0, p["title"]
        assert p["datasource"]["uid"] == "${datasource}" and p["description"]
    variables = {v["name"] for v in d["templating"]["list"]}
    assert {"datasource", "node"} <= variables
    assert d["uid"] == "drahealth"
