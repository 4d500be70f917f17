"""The docs: the site builds with no broken link, and the generated reference pages say what
the code does (every config key with a description, every command, every route)."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

pytest.importorskip("mkdocs")
pytest.importorskip("material")
pytest.importorskip("fastapi")

ROOT = Path(__file__).resolve().parents[1]


def _hook() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_generate", ROOT / "docs" / "_hooks" / "generate.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_site_builds_strict_with_the_generated_pages(tmp_path: Path) -> None:
    site = tmp_path / "site"
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    for page in ("configuration", "cli", "http-api", "benchmarks", "architecture"):
        assert (site / page / "index.html").is_file(), page


def test_configuration_page_lists_every_key_of_the_dataclasses_and_no_other() -> None:
    from infersight.monitor.service.config_schema import ENVIRONMENT, config_keys

    page = _hook().render_configuration()
    rows = re.findall(
        r"^\| `([a-z0-9_.]+)` \| ([^|]+) \| (?:`[^`]*`|\*required\*) \| (.*) \|$", page, flags=re.MULTILINE
    )
    on_page = {key for key, _, _ in rows}
    in_code = {k.key for k in config_keys()}
    assert len(in_code) >= 100
    assert on_page == in_code, (sorted(in_code - on_page), sorted(on_page - in_code))
    assert all(description.strip() for _, _, description in rows), "a key without a description"
    for name in ENVIRONMENT:
        assert f"| `{name}` |" in page


def test_every_config_field_has_a_description_in_the_code() -> None:
    from infersight.monitor.service.config_schema import config_keys

    missing = [k.key for k in config_keys() if not k.description]
    assert not missing, f"add a `#` comment line above each of: {missing}"


def test_every_environment_variable_the_code_reads_is_documented() -> None:
    from infersight.monitor.service.config_schema import ENVIRONMENT

    read: set[str] = set()
    for folder in ("engine", "collectors", "monitor", "alerts", "dashboards"):
        for path in (ROOT / folder).rglob("*.py"):
            read |= set(re.findall(r"[\"'](INFERSIGHT_[A-Z0-9_]+)[\"']", path.read_text(encoding="utf-8")))
    assert read <= set(ENVIRONMENT), sorted(read - set(ENVIRONMENT))


def test_cli_page_has_every_command_and_http_page_every_route() -> None:
    hook = _hook()
    cli = hook.render_cli()
    for command in ("serve", "demo", "models", "drift", "dataset", "config check", "config schema"):
        assert f"## `infersight {command}`" in cli, command
    document = hook.openapi_document()
    page = hook.render_http_api()
    for path, item in document["paths"].items():
        for method in item:
            assert f"## `{method.upper()} {path}`" in page, (method, path)


def test_readme_is_a_screen_or_two_without_issue_numbers() -> None:
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 250
    assert not re.search(r"\bissues? \d+\b|(?<![\w&])#\d+\b", text, flags=re.IGNORECASE)
    for quickstart in ("make demo", "make test", "--upstream", "/v1/traces", "@track", "--registry"):
        assert quickstart in text, quickstart


def test_readme_links_point_at_files_that_exist() -> None:
    text = (ROOT / "README.md").read_text()
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    local = [link for link in links if "://" not in link]
    assert len(local) >= 10
    missing = [link for link in local if not (ROOT / link).exists()]
    assert not missing, missing
