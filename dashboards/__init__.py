"""Grafana dashboards as code, and the built-in web page's assets.

build_dashboard()               the dashboard as Grafana's JSON model
export_dashboards(dir)          write it plus a file-provisioning YAML
push_dashboard(url, token)      upload it through grafana-client
web_assets_dir()                index.html, app.js, style.css for the service to mount at /
metric_names(expr)              metric names a PromQL expression reads (used to check panels)
"""

from __future__ import annotations

from infersight.monitor.extras import require_extra as _require_extra

_require_extra("infersight.dashboards", "grafana")  # one line when the extra is missing

from ._dashboard import DASHBOARD_UID, SCHEMA_VERSION, build_dashboard, metric_names
from ._export import (
    DASHBOARD_FILE,
    PROVISIONING_FILE,
    DashboardError,
    ExportDirUnwritable,
    ExportResult,
    GrafanaPushFailed,
    GrafanaRejected,
    GrafanaUnreachable,
    InvalidGrafanaURL,
    PushResult,
    export_dashboards,
    provisioning_config,
    push_dashboard,
    web_assets_dir,
)

__all__ = [
    "DASHBOARD_FILE",
    "DASHBOARD_UID",
    "PROVISIONING_FILE",
    "SCHEMA_VERSION",
    "DashboardError",
    "ExportDirUnwritable",
    "ExportResult",
    "GrafanaPushFailed",
    "GrafanaRejected",
    "GrafanaUnreachable",
    "InvalidGrafanaURL",
    "PushResult",
    "build_dashboard",
    "export_dashboards",
    "metric_names",
    "provisioning_config",
    "push_dashboard",
    "web_assets_dir",
]
