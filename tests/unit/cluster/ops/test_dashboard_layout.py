"""The shipped Grafana dashboard imports cleanly: unique panel ids, panels that do not overlap
on Grafana's 24-column grid, every target on the dashboard's Prometheus variable, and the panels
the operations guide promises. (Its queries are checked against a running cluster's ``/metrics``
in ``tests/integration/test_grafana_dashboard.py``.)"""

from __future__ import annotations

import json
from typing import Any

from cluster.serve.config_file import REPO_CONFIGS

DASHBOARD: dict[str, Any] = json.loads(
    (REPO_CONFIGS / "grafana" / "pdserve-dashboard.json").read_text()
)


def test_panels_have_unique_ids_and_do_not_overlap() -> None:
    panels = DASHBOARD["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    cells: set[tuple[int, int]] = set()
    for panel in panels:
        pos = panel["gridPos"]
        assert pos["x"] >= 0 and pos["x"] + pos["w"] <= 24, panel["title"]
        mine = {(x, y) for x in range(pos["x"], pos["x"] + pos["w"])
                for y in range(pos["y"], pos["y"] + pos["h"])}  # fmt: skip
        assert not cells & mine, f"{panel['title']} overlaps another panel"
        cells |= mine


def test_every_target_uses_the_datasource_variable_and_has_a_query() -> None:
    variables = {v["name"]: v for v in DASHBOARD["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    graphs = [p for p in DASHBOARD["panels"] if p["type"] != "row"]
    for panel in graphs:
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${datasource}"
            assert target["expr"].strip() and target["refId"]


def test_the_promised_views_are_there() -> None:
    titles = " | ".join(p["title"] for p in DASHBOARD["panels"]).lower()
    for view in ("time to first token", "inter-token", "end-to-end", "rejected", "kv blocks",
                 "transfer failures", "routing decisions", "disaggregation decisions"):  # fmt: skip
        assert view in titles, view
