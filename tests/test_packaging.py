"""The distribution installs every package folder, as infersight.<folder>, and nothing generic;
its extras are the ones monitor/extras.py names when a part is used without its extra."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from infersight.monitor.extras import EXTRAS, MissingExtra, extra_for_module, modules_of, require_extra

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


def test_every_folder_of_package_data_is_declared_so_setuptools_does_not_warn() -> None:
    # a data folder inside a package (dashboards/web, monitor/data/banking77) is a namespace
    # package to Python: undeclared, setuptools ships it with a "Package would be ignored" warning
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    globs = pyproject["tool"]["setuptools"]["package-data"]["*"]
    folders = set()
    for top in TOP:
        for path in (ROOT / top).rglob("*"):
            if path.is_file() and "__pycache__" not in path.parts and any(path.match(g) for g in globs):
                folders.add(".".join(("infersight", *path.parent.relative_to(ROOT).parts)))
    undeclared = sorted(folders - _declared())
    assert not undeclared, f"folders with package data missing from [tool.setuptools] packages: {undeclared}"


def test_declared_packages_live_under_the_infersight_namespace() -> None:
    stray = sorted(p for p in _declared() if not p.startswith("infersight."))
    assert not stray, f"generic top-level packages would land in site-packages: {stray}"


def test_console_script_runs_help() -> None:
    from infersight.monitor.cli import build_parser

    help_text = build_parser().format_help()
    for command in ("models", "drift", "rules", "dashboards", "serve", "demo"):
        assert command in help_text


# ---- the extras: pyproject.toml and monitor/extras.py say the same ---------------------------------


def _requirement_name(requirement: str) -> str:
    return re.split(r"[\s\[<>=!~;]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def _modules_of_distribution() -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for module, dists in metadata.packages_distributions().items():
        for dist in dists:
            out.setdefault(dist.lower().replace("_", "-"), set()).add(module)
    return out


def test_a_reader_that_closes_the_pipe_ends_the_cli_quietly() -> None:
    # `infersight rules export - | head -1`, `infersight models canary --status | head -3`
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the first line
    done = subprocess.run([sys.executable, "-m", "infersight.monitor.cli", "rules", "export", "-"],
                          stdout=write, stderr=subprocess.PIPE, timeout=120, check=False)  # fmt: skip
    os.close(write)
    assert done.stderr.decode() == "" and done.returncode == 141  # 128 + SIGPIPE, as a shell reports it


def test_every_extra_names_the_modules_its_distributions_install() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    installs = _modules_of_distribution()
    base = {m for r in project["dependencies"] for m in installs[_requirement_name(r)]}
    declared = project["optional-dependencies"]
    for extra, modules in EXTRAS.items():
        given: set[str] = set()
        for requirement in declared[extra]:
            if requirement.startswith("infersight["):  # an extra including others: their own entries
                continue
            provided = installs[_requirement_name(requirement)]
            assert provided & (set(modules) | base), f"[{extra}] {requirement}: none of {provided} listed"
            given |= provided
        assert set(modules) <= given, f"[{extra}] lists modules no requirement of it installs"
    for extra in ("service", "all"):  # the extras made of others: [service] includes three
        (inner,) = (r for r in declared[extra] if r.startswith("infersight["))
        parts = inner[len("infersight[") : -1].split(",")
        if extra == "service":
            own = set(EXTRAS["service"])
            assert set(modules_of("service")) == own.union(*(modules_of(p) for p in parts))
        else:
            assert set(parts) == set(EXTRAS), "[all] must include every other extra"


def test_base_install_needs_no_optional_module() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    base = {_requirement_name(r) for r in project["dependencies"]}
    assert base == {"prometheus-client", "nvidia-ml-py", "psutil", "ddsketch", "numpy", "httpx", "orjson"}


def test_missing_extra_is_one_line_naming_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    require_extra("infersight.x", "redis")  # installed here: nothing to say
    monkeypatch.setitem(EXTRAS, "redis", ("redis", "a_module_nobody_installs"))
    with pytest.raises(MissingExtra) as caught:
        require_extra("infersight.x", "redis")
    assert str(caught.value) == "infersight.x needs the redis extra: pip install 'infersight[redis]'"
    assert caught.value.name == "a_module_nobody_installs"
    assert extra_for_module("torch.nn") == "engine"
    assert extra_for_module("yaml") == "grafana"
    assert extra_for_module("prometheus_client") is None


def test_architecture_code_map_names_only_what_is_in_the_repository() -> None:
    text = (ROOT / "docs" / "architecture.md").read_text()
    assert "../" not in text, "docs/architecture.md points outside the repository"
    code_map = text.split("## Code map", 1)[1].split("\n## ", 1)[0]
    folders = re.findall(r"^\s*([a-z_]+/)\s", code_map, flags=re.MULTILINE)
    assert len(folders) >= 10
    nested = {"sdk/", "drift/", "store/", "dataset/", "service/", "cli/", "data/"}
    stages = {"rules/", "notify/", "actions/", "release/"}  # alerts/ is laid out in stage folders
    for folder in folders:
        parent = "monitor/" if folder in nested else "alerts/" if folder in stages else ""
        parent = "monitor/service/" if folder in {"routers/", "demo/"} else parent
        assert (ROOT / (parent + folder)).is_dir(), folder
    for path in re.findall(r"`((?:monitor|alerts|engine|collectors|dashboards)/[\w/]+\.py)`", text):
        assert (ROOT / path).is_file(), f"docs/architecture.md names {path}, which does not exist"
    assert "(docs/architecture.md)" in (ROOT / "README.md").read_text()
