"""Getting the dashboard out: written as JSON plus a Grafana file-provisioning YAML into a
directory, or uploaded to a running Grafana through grafana-client (POST /api/dashboards/db);
and where the built-in web page's static assets live, for the service to mount.

The errors this package raises:

    DashboardError                      anything this package refuses or fails to do
    ├── ExportDirUnwritable             export target cannot be created or written
    ├── InvalidGrafanaURL               --url is not an absolute http(s) URL
    └── GrafanaPushFailed               the upload did not complete
        ├── GrafanaUnreachable          no HTTP answer (refused, DNS, timeout)
        └── GrafanaRejected             Grafana answered 4xx/5xx; `.status` holds the code

Errors from grafana-client and the OS are re-raised as these, `from` the original.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml
from infersight.monitor.redaction import redact_text

from ._dashboard import DASHBOARD_UID, build_dashboard

__all__ = [
    "DASHBOARD_FILE",
    "PROVISIONING_FILE",
    "DashboardError",
    "ExportDirUnwritable",
    "ExportResult",
    "GrafanaPushFailed",
    "GrafanaRejected",
    "GrafanaUnreachable",
    "InvalidGrafanaURL",
    "PushResult",
    "export_dashboards",
    "provisioning_config",
    "push_dashboard",
    "web_assets_dir",
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


DASHBOARD_FILE = f"{DASHBOARD_UID}.json"
PROVISIONING_FILE = "infersight-dashboards.yaml"


@dataclass(frozen=True)
class ExportResult:
    dashboard: Path  # the dashboard JSON
    provisioning: Path  # the provider YAML, for Grafana's provisioning/dashboards/ directory
    dashboards_path: str  # the directory Grafana is told to read dashboards from


def provisioning_config(dashboards_path: str, *, folder: str = "infersight") -> dict[str, Any]:
    """A Grafana dashboard provider (apiVersion 1) that loads every JSON file in `dashboards_path`."""
    return {
        "apiVersion": 1,
        "providers": [
            {
                "name": "infersight",
                "orgId": 1,
                "folder": folder,
                "type": "file",
                "disableDeletion": False,
                "allowUiUpdates": False,
                "updateIntervalSeconds": 30,
                "options": {"path": dashboards_path, "foldersFromFilesStructure": False},
            }
        ],
    }


def _write_atomically(path: Path, text: str) -> None:
    """Write `text` to `path` via a temporary and a rename, mode 0644: Grafana usually runs
    as its own user and must read the files (mkstemp's 0600 would hide them from it)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o644)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def export_dashboards(
    directory: str | os.PathLike[str], *, dashboards_path: str | None = None, folder: str = "infersight"
) -> ExportResult:
    """Write `infersight-overview.json` and `infersight-dashboards.yaml` into `directory`.

    `dashboards_path` is where Grafana will find the JSON (default: this directory, absolute);
    set it when Grafana runs elsewhere, e.g. in a container with the directory mounted.
    """
    out = Path(directory).expanduser()
    try:
        out.mkdir(parents=True, exist_ok=True)
        if not os.access(out, os.W_OK | os.X_OK):
            raise PermissionError(f"no write permission on {out}")
        dashboard = out / DASHBOARD_FILE
        provisioning = out / PROVISIONING_FILE
        target = dashboards_path or str(out.resolve())
        _write_atomically(dashboard, json.dumps(build_dashboard(), indent=2, sort_keys=True) + "\n")
        config = provisioning_config(target, folder=folder)
        _write_atomically(provisioning, yaml.safe_dump(config, sort_keys=False))
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise ExportDirUnwritable(f"cannot write to {out}: {reason}") from exc
    return ExportResult(dashboard=dashboard, provisioning=provisioning, dashboards_path=target)


@dataclass(frozen=True)
class PushResult:
    uid: str
    url: str  # Grafana's path of the dashboard, e.g. /d/infersight-overview/infersight-llm-serving
    version: int
    folder_uid: str | None


def _check_url(url: str) -> None:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InvalidGrafanaURL(f"not an http(s) URL with a host: {url!r}")
    try:
        _ = parts.port
    except ValueError as exc:
        raise InvalidGrafanaURL(f"bad port in {url!r}") from exc


def _connect(url: str, token: str, timeout_s: float) -> Any:
    from grafana_client import GrafanaApi

    return GrafanaApi.from_url(url, credential=token, timeout=timeout_s)


def _folder_uid(api: Any, folder: str) -> str:
    """The uid of the folder whose title or uid is `folder`; created when there is none."""
    for item in api.folder.get_all_folders():
        if folder in (item.get("uid"), item.get("title")):
            return str(item["uid"])
    return str(api.folder.create_folder(folder)["uid"])


def push_dashboard(
    url: str,
    token: str,
    *,
    folder: str | None = None,
    message: str = "infersight dashboards push",
    timeout_s: float = 10.0,
    connect: Callable[[str, str, float], Any] = _connect,
) -> PushResult:
    """Create or overwrite the infersight dashboard in Grafana at `url` with a bearer `token`.

    `folder` is a folder title or uid (created when missing); None puts it in General.
    """
    _check_url(url)
    if not token:
        raise InvalidGrafanaURL("an API token is required (a Grafana service-account token)")
    from grafana_client.client import GrafanaClientError, GrafanaException, GrafanaServerError

    api = connect(url, token, timeout_s)
    try:
        folder_uid = _folder_uid(api, folder) if folder else None
        body: dict[str, Any] = {"dashboard": build_dashboard(), "overwrite": True, "message": message}
        if folder_uid is not None:
            body["folderUid"] = folder_uid
        answer = api.dashboard.update_dashboard(body)
    except (GrafanaClientError, GrafanaServerError) as exc:
        raise GrafanaRejected(int(exc.status_code), _reason(exc.response, exc.message)) from exc
    except GrafanaException as exc:  # timeouts and transport errors that grafana-client wraps
        raise GrafanaUnreachable(redact_text(f"no answer from Grafana at {url}: {exc.message}")) from exc
    except OSError as exc:  # connection refused, unknown host (niquests' errors are OSErrors)
        raise GrafanaUnreachable(redact_text(f"cannot reach Grafana at {url}: {_root_cause(exc)}")) from exc
    except ValueError as exc:  # a 2xx answer whose body is not JSON: not Grafana's API
        raise GrafanaPushFailed(redact_text(f"{url} did not answer like Grafana's HTTP API: {exc}")) from exc
    if not isinstance(answer, dict) or "uid" not in answer:
        raise GrafanaPushFailed(f"unexpected answer from Grafana: {str(answer)[:200]}")
    return PushResult(
        uid=str(answer["uid"]),
        url=str(answer.get("url", "")),
        version=int(answer.get("version", 0)),
        folder_uid=folder_uid,
    )


def _root_cause(exc: BaseException) -> str:
    """The innermost OS-level reason ("Connection refused") instead of a transport's wrapped chain."""
    reason = str(exc)
    seen: BaseException | None = exc
    for _ in range(10):
        if seen is None:
            break
        if isinstance(seen, OSError) and seen.strerror:
            reason = seen.strerror
        seen = seen.__cause__ or seen.__context__
    return reason[:200]


def _reason(response: object, fallback: str) -> str:
    if isinstance(response, dict) and response.get("message"):
        return str(response["message"])
    return str(response or fallback)[:200]


def web_assets_dir() -> Path:
    """The directory holding index.html, app.js and style.css (served as-is, no build step).

    The page uses only relative URLs (`app.js`, `api/v1/overview`), so it works wherever
    the directory is mounted, as long as index.html is served at the mount's root.
    """
    return Path(__file__).resolve().parent / "web"
