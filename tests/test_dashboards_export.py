"""`infersight dashboards export DIR`: dashboard JSON plus a Grafana file-provisioning YAML."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from infersight.dashboards import build_dashboard, export_dashboards
from infersight.dashboards._export import DASHBOARD_FILE, PROVISIONING_FILE, ExportDirUnwritable
from infersight.monitor.cli import main


def test_export_writes_dashboard_json_and_provisioning_yaml(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "grafana" / "dashboards"  # created, parents too
    assert main(["dashboards", "export", str(out)]) == 0
    assert json.loads((out / DASHBOARD_FILE).read_text()) == build_dashboard()
    config = yaml.safe_load((out / PROVISIONING_FILE).read_text())
    assert config["apiVersion"] == 1
    (provider,) = config["providers"]
    assert provider["type"] == "file" and provider["name"] and provider["folder"] == "infersight"
    assert provider["options"]["path"] == str(out.resolve())
    assert Path(provider["options"]["path"], DASHBOARD_FILE).is_file()  # Grafana would find the JSON there
    printed = capsys.readouterr().out
    assert str(out / DASHBOARD_FILE) in printed and str(out / PROVISIONING_FILE) in printed


def test_export_points_provisioning_at_a_path_inside_grafanas_container(tmp_path: Path) -> None:
    result = export_dashboards(tmp_path, dashboards_path="/var/lib/grafana/dashboards", folder="LLM")
    provider = yaml.safe_load(result.provisioning.read_text())["providers"][0]
    assert provider["options"]["path"] == "/var/lib/grafana/dashboards" and provider["folder"] == "LLM"


def test_exported_files_are_readable_by_grafanas_own_user(tmp_path: Path) -> None:
    import stat

    result = export_dashboards(tmp_path)
    for path in (result.dashboard, result.provisioning):
        assert stat.S_IMODE(path.stat().st_mode) == 0o644, path


def test_export_overwrites_previous_files_and_leaves_no_temporaries(tmp_path: Path) -> None:
    (tmp_path / DASHBOARD_FILE).write_text("stale")
    export_dashboards(tmp_path)
    export_dashboards(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([DASHBOARD_FILE, PROVISIONING_FILE])
    assert json.loads((tmp_path / DASHBOARD_FILE).read_text())["uid"] == build_dashboard()["uid"]


def test_export_into_a_file_path_is_a_one_line_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")
    assert main(["dashboards", "export", str(blocker / "sub")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("infersight dashboards: error: cannot write to")
    with pytest.raises(ExportDirUnwritable):
        export_dashboards(blocker)


def test_export_onto_a_read_only_filesystem_is_a_one_line_error(capsys: pytest.CaptureFixture[str]) -> None:
    # /proc refuses new entries even to root, which ignores directory permission bits
    assert main(["dashboards", "export", "/proc/self/infersight-dashboards"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot write to /proc/self/infersight-dashboards" in err
