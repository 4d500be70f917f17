"""The generated Grafana dashboard: schema, ids, layout, datasource refs, variables, annotations."""

from __future__ import annotations

import json
import re
from typing import Any

from infersight.dashboards import build_dashboard
from infersight.dashboards._dashboard import DASHBOARD_UID, SCHEMA_VERSION

DASH = build_dashboard()
PANELS = [p for p in DASH["panels"] if p["type"] != "row"]


def _panel(title: str) -> dict[str, Any]:
    found = [p for p in PANELS if p["title"] == title]
    assert len(found) == 1, f"expected one panel titled {title!r}"
    return found[0]


def _exprs(panel: dict[str, Any]) -> list[str]:
    return [t["expr"] for t in panel["targets"]]


def test_dashboard_uses_a_current_grafana_schema_version() -> None:
    assert DASH["schemaVersion"] == SCHEMA_VERSION >= 39
    assert DASH["uid"] == DASHBOARD_UID and DASH["title"]
    assert json.loads(json.dumps(DASH)) == DASH  # plain JSON, nothing Python-only


def test_dashboard_is_deterministic() -> None:
    assert json.dumps(build_dashboard(), sort_keys=True) == json.dumps(DASH, sort_keys=True)


def test_panel_ids_are_unique_positive_integers() -> None:
    ids = [p["id"] for p in DASH["panels"]]
    assert all(isinstance(i, int) and i > 0 for i in ids)
    assert len(ids) == len(set(ids))


def test_panels_tile_the_grid_without_overlap() -> None:
    cells: set[tuple[int, int]] = set()
    for p in DASH["panels"]:
        g = p["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24, p["title"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"{p['title']!r} overlaps at {(x, y)}"
                cells.add((x, y))


def test_every_target_and_panel_uses_the_datasource_variable() -> None:
    for p in PANELS:
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        assert p["targets"], p["title"]
        refs = [t["refId"] for t in p["targets"]]
        assert len(refs) == len(set(refs)), p["title"]
        for t in p["targets"]:
            assert t["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
            assert t["expr"].strip(), p["title"]


def test_every_panel_sets_a_unit() -> None:
    for p in PANELS:
        if p["type"] != "state-timeline":
            assert p["fieldConfig"]["defaults"]["unit"], p["title"]


def test_variables_select_datasource_model_and_model_version() -> None:
    variables = {v["name"]: v for v in DASH["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    mv = variables["model_version"]
    assert mv["type"] == "query" and mv["datasource"]["uid"] == "${datasource}"
    assert re.fullmatch(r"label_values\(.+, model_version\)", mv["definition"])
    assert mv["includeAll"] and mv["multi"]
    # every inference query is filtered by the selected versions
    for p in PANELS:
        for expr in _exprs(p):
            if "gen_ai_server_" in expr:
                assert 'model_version=~"$model_version"' in expr, (p["title"], expr)


def test_latency_panels_take_quantiles_over_bucket_rates() -> None:
    for title, metric in [
        ("End-to-end latency p50 / p95 / p99", "gen_ai_server_request_duration_seconds"),
        ("Time to first token p50 / p95 / p99", "gen_ai_server_time_to_first_token_seconds"),
        ("Time per output token p50 / p95 / p99", "gen_ai_server_time_per_output_token_seconds"),
    ]:
        panel = _panel(title)
        assert panel["fieldConfig"]["defaults"]["unit"] == "s"
        qs = []
        for expr in _exprs(panel):
            m = re.match(
                rf"histogram_quantile\(([0-9.]+), sum by \(le, model_version\) \(rate\({metric}_bucket\{{",
                expr,
            )
            assert m, expr
            qs.append(float(m.group(1)))
        assert qs == [0.5, 0.95, 0.99]


def test_request_and_output_lengths_are_heatmaps_of_token_buckets() -> None:
    for title, kind in [
        ("Prompt length (input tokens)", "input"),
        ("Output length (output tokens)", "output"),
    ]:
        panel = _panel(title)
        assert panel["type"] == "heatmap" and panel["options"]["calculate"] is False
        (target,) = panel["targets"]
        assert target["format"] == "heatmap" and target["legendFormat"] == "{{le}}"
        assert (
            f'gen_ai_token_type="{kind}"' in target["expr"]
            and "gen_ai_server_token_usage_bucket" in target["expr"]
        )


def test_gpu_panel_labels_the_time_busy_fallback_as_not_sm_efficiency() -> None:
    panel = _panel("SM activity and occupancy")
    legends = {t["expr"].split("{")[0]: t["legendFormat"] for t in panel["targets"]}
    assert set(legends) == {
        "infersight_gpu_sm_activity_ratio",
        "infersight_gpu_sm_occupancy_ratio",
        "infersight_gpu_busy_time_ratio",
    }
    assert "NOT SM efficiency" in legends["infersight_gpu_busy_time_ratio"]
    assert panel["fieldConfig"]["defaults"]["unit"] == "percentunit"


def test_memory_and_slope_panels_cover_gpu_and_process() -> None:
    exprs = " ".join(e for p in PANELS for e in _exprs(p))
    for metric in (
        "infersight_gpu_memory_used_bytes",
        "infersight_gpu_memory_reserved_bytes",
        "infersight_gpu_memory_total_bytes",
        "infersight_gpu_memory_used_slope_bytes_per_minute",
        "infersight_process_resident_memory_bytes",
        "infersight_process_resident_memory_slope_bytes_per_minute",
        "gen_ai_server_requests_waiting",
        "gen_ai_server_requests_in_flight",
        "gen_ai_server_request_errors_total",
        "infersight_drift_p_value",
        "infersight_relevance_mean",
    ):
        assert metric in exprs, metric


def test_deploys_and_alerts_are_annotations() -> None:
    annotations = {a["name"]: a for a in DASH["annotations"]["list"]}
    assert "infersight_deploys_total" in annotations["Deploys and rollbacks"]["expr"]
    assert "infersight_model_info" in annotations["Serving version changed"]["expr"]
    assert "infersight_alerts_firing" in annotations["Alerts firing"]["expr"]
    for a in annotations.values():
        if not a.get("builtIn"):
            assert a["datasource"]["uid"] == "${datasource}" and a["enable"]
