"""The distribution installs every package folder, as infersight.<folder>, and nothing generic."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOP = ("engine", "collectors", "monitor", "alerts", "dashboards")


def _declared() -> set[str]:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return set(pyproject["tool"]["setuptools"]["packages"])


def test_every_package_folder_is_installed() -> None:
    found = set()
    for top in TOP:
        for init in (ROOT / top).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT).parts
            found.add(".".join(("infersight", *rel)))
    missing = sorted(found - _declared())
    assert not missing, f"package folders missing from pyproject [tool.setuptools] packages: {missing}"


def test_declared_packages_live_under_the_infersight_namespace() -> None:
    stray = sorted(p for p in _declared() if not p.startswith("infersight."))
    assert not stray, f"generic top-level packages would land in site-packages: {stray}"


def test_console_script_runs_help() -> None:
    from infersight.monitor.cli import build_parser

    help_text = build_parser().format_help()
    for command in ("models", "drift", "rules", "dashboards", "serve", "demo"):
        assert command in help_text
