"""Grafana dashboards as code, and the built-in web page's assets.

build_dashboard()               the dashboard as Grafana's JSON model
export_dashboards(dir)          write it plus a file-provisioning YAML
push_dashboard(url, token)      upload it through grafana-client
web_assets_dir()                index.html, app.js, style.css for the service to mount at /
metric_names(expr)              metric names a PromQL expression reads (used to check panels)

Every error derives from `DashboardError`; the subclasses and the file names stay in `_export`.
"""

from __future__ import annotations

from infersight.monitor.extras import require_extra as _require_extra

_require_extra("infersight.dashboards", "grafana")  # one line when the extra is missing

from ._dashboard import build_dashboard, metric_names
from ._export import (
    DashboardError,
    ExportResult,
    PushResult,
    export_dashboards,
    push_dashboard,
    web_assets_dir,
)

__all__ = [
    "DashboardError",
    "ExportResult",
    "PushResult",
    "build_dashboard",
    "export_dashboards",
    "metric_names",
    "push_dashboard",
    "web_assets_dir",
]
