"""The infersight Grafana dashboard: variables, annotations and the rows, as one JSON object;
and which metric names a PromQL expression (or a Grafana `label_values` query) reads, to
check that the dashboard refers only to exported metrics.

`metric_names` is not a full PromQL parser. Strings, label matchers, range/offset durations
and grouping label lists are removed first; what remains is function names (followed by
`(`), keywords, numbers and metric names.
"""

from __future__ import annotations

import re
from typing import Any

from ._panels import DATASOURCE, lay_out
from ._rows import headline, latency, routing, satisfaction, slo_cost, traffic
from ._system_rows import drift_row, gpu_rows, pipeline_row, process_row

__all__ = ["DASHBOARD_UID", "SCHEMA_VERSION", "build_dashboard", "metric_names"]


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
        [
            headline(),
            slo_cost(),
            satisfaction(),
            routing(),
            latency(),
            traffic(),
            gpu_rows(),
            process_row(),
            drift_row(),
            pipeline_row(),
        ]
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


_STRING = re.compile(r'"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])*\'|`[^`]*`')
_MATCHERS = re.compile(r"\{[^{}]*\}")
_RANGE = re.compile(r"\[[^\[\]]*\]")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
_IDENT = re.compile(r"(?<![\w$.:])([A-Za-z_:][A-Za-z0-9_:]*)(\s*\()?")
_LABEL_VALUES = re.compile(r"\s*label_values\s*\((.*)\)\s*", re.S)
_KEYWORDS = frozenset(
    {
        "and",
        "or",
        "unless",
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
        "offset",
        "bool",
        "inf",
        "nan",
        "Inf",
        "NaN",
        "atan2",
    }
)


def _strip(expr: str) -> str:
    expr = _STRING.sub('""', expr)
    expr = _MATCHERS.sub(" ", expr)
    expr = _RANGE.sub(" ", expr)
    expr = _GROUPING.sub(" ", expr)
    return re.sub(r"\boffset\s+-?[0-9a-z]+", " ", expr)


def metric_names(expr: str) -> frozenset[str]:
    """Metric names in `expr`, a PromQL expression or `label_values([metric,] label)`."""
    lv = _LABEL_VALUES.fullmatch(expr)
    if lv is not None:
        args = _strip(lv.group(1))
        if "," not in args:  # label_values(label): no metric
            return frozenset()
        expr = args.rsplit(",", 1)[0]
    names = set()
    for match in _IDENT.finditer(_strip(expr)):
        name, call = match.group(1), match.group(2)
        if call or name in _KEYWORDS:
            continue
        names.add(name)
    return frozenset(names)
