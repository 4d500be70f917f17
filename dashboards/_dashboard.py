"""The infersight Grafana dashboard: variables, annotations and the rows, as one JSON object."""

from __future__ import annotations

from typing import Any

from ._layout import lay_out
from ._panels import DATASOURCE
from ._rows_quality import drift_row, pipeline_row
from ._rows_serving import headline, latency, routing, slo_cost, traffic
from ._rows_system import gpu_rows, process_row

__all__ = ["DASHBOARD_UID", "SCHEMA_VERSION", "build_dashboard"]

SCHEMA_VERSION = 41  # the classic JSON model as Grafana 12 writes it
DASHBOARD_UID = "infersight-overview"


def _query_variable(name: str, label: str, query: str, *, multi: bool, include_all: bool) -> dict[str, Any]:
    return {
        "type": "query",
        "name": name,
        "label": label,
        "datasource": dict(DATASOURCE),
        "definition": query,
        "query": {"query": query, "refId": f"{name}-query", "qryType": 1},
        "refresh": 2,  # on time-range change: new versions appear without a reload
        "sort": 1,
        "multi": multi,
        "includeAll": include_all,
        "allValue": ".*",
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]} if include_all else {},
        "hide": 0,
        "regex": "",
        "options": [],
    }


def _templating() -> dict[str, Any]:
    return {
        "list": [
            {
                "type": "datasource",
                "name": "datasource",
                "label": "Prometheus",
                "query": "prometheus",
                "current": {},
                "hide": 0,
                "refresh": 1,
                "regex": "",
                "options": [],
            },
            _query_variable(
                "instance",
                "Instance",
                "label_values(infersight_gpu_collector_enabled, instance)",  # every service exports it
                multi=True,
                include_all=True,
            ),
            _query_variable(
                "model",
                "Model",
                'label_values(gen_ai_server_request_duration_seconds_count{instance=~"$instance"}, model)',
                multi=True,
                include_all=True,
            ),
            _query_variable(
                "model_version",
                "Model version",
                'label_values(gen_ai_server_request_duration_seconds_count{instance=~"$instance", model=~"$model"}, '
                "model_version)",
                multi=True,
                include_all=True,
            ),
            _query_variable(
                "gpu",
                "GPU",
                'label_values(infersight_gpu_memory_total_bytes{instance=~"$instance"}, gpu)',
                multi=True,
                include_all=True,
            ),
        ]
    }


def _annotations() -> dict[str, Any]:
    builtin = {
        "builtIn": 1,
        "datasource": {"type": "grafana", "uid": "-- Grafana --"},
        "enable": True,
        "hide": True,
        "iconColor": "rgba(0, 211, 255, 1)",
        "name": "Annotations & Alerts",
        "type": "dashboard",
    }
    deploys = {
        "datasource": dict(DATASOURCE),
        "enable": True,
        "iconColor": "blue",
        "name": "Deploys and rollbacks",
        "expr": "sum by (outcome) (increase(infersight_deploys_total[2m])) > 0",
        "step": "1m",
        "titleFormat": "deploy: {{outcome}}",
        "tagKeys": "outcome",
        "textFormat": "",
        "useValueForTime": False,
    }
    versions = {
        "datasource": dict(DATASOURCE),
        "enable": True,
        "iconColor": "purple",
        "name": "Serving version changed",
        "expr": (
            'infersight_model_info{model=~"$model"} == 1 unless '
            '(infersight_model_info{model=~"$model"} offset 2m == 1)'
        ),
        "step": "1m",
        "titleFormat": "now serving {{model_version}}",
        "tagKeys": "model,model_version",
        "textFormat": "",
        "useValueForTime": False,
    }
    alerts = {
        "datasource": dict(DATASOURCE),
        "enable": True,
        "iconColor": "red",
        "name": "Alerts firing",
        "expr": "max by (alertname, severity) (infersight_alerts_firing) > 0",  # same on every replica
        "step": "1m",
        "titleFormat": "{{alertname}}",
        "tagKeys": "severity",
        "textFormat": "{{severity}}",
        "useValueForTime": False,
    }
    return {"list": [builtin, deploys, versions, alerts]}


def build_dashboard(*, uid: str = DASHBOARD_UID, title: str = "infersight: LLM serving") -> dict[str, Any]:
    """The dashboard as Grafana's classic JSON model (what /api/dashboards/db and file provisioning take)."""
    panels = lay_out(
        [headline(), slo_cost(), routing(), latency(), traffic(), gpu_rows(), process_row(), drift_row(), pipeline_row()]
    )
    return {
        "uid": uid,
        "title": title,
        "description": "GPU efficiency, tail latency, memory trends, drift and alerts of LLM inference (infersight).",
        "tags": ["infersight", "llm", "inference"],
        "timezone": "browser",
        "editable": True,
        "graphTooltip": 1,  # shared crosshair
        "schemaVersion": SCHEMA_VERSION,
        "version": 1,
        "refresh": "30s",
        "time": {"from": "now-1h", "to": "now"},
        "timepicker": {},
        "fiscalYearStartMonth": 0,
        "liveNow": False,
        "links": [],
        "annotations": _annotations(),
        "templating": _templating(),
        "panels": panels,
    }
