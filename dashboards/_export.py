"""Write the dashboard JSON and a Grafana file-provisioning YAML into a directory."""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from ._dashboard import DASHBOARD_UID, build_dashboard
from .errors import ExportDirUnwritable

__all__ = ["DASHBOARD_FILE", "PROVISIONING_FILE", "ExportResult", "export_dashboards", "provisioning_config"]

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
