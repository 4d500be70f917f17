"""Errors raised by `infersight.dashboards`.

    DashboardError                      anything this package refuses or fails to do
    ├── ExportDirUnwritable             export target cannot be created or written
    ├── InvalidGrafanaURL               --url is not an absolute http(s) URL
    └── GrafanaPushFailed               the upload did not complete
        ├── GrafanaUnreachable          no HTTP answer (refused, DNS, timeout)
        └── GrafanaRejected             Grafana answered 4xx/5xx; `.status` holds the code

Errors from grafana-client and the OS are re-raised as these, `from` the original.
"""

from __future__ import annotations

__all__ = [
    "DashboardError",
    "ExportDirUnwritable",
    "GrafanaPushFailed",
    "GrafanaRejected",
    "GrafanaUnreachable",
    "InvalidGrafanaURL",
]


class DashboardError(Exception):
    """Base of every error this package raises."""


class ExportDirUnwritable(DashboardError):
    """The export directory cannot be created or written."""


class InvalidGrafanaURL(DashboardError):
    """The Grafana URL is not an absolute http:// or https:// URL."""


class GrafanaPushFailed(DashboardError):
    """Uploading a dashboard to Grafana did not complete."""


class GrafanaUnreachable(GrafanaPushFailed):
    """Grafana gave no HTTP answer (connection refused, unknown host, timeout)."""


class GrafanaRejected(GrafanaPushFailed):
    """Grafana answered with an error status."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"Grafana answered {status}: {message}")
        self.status = status
