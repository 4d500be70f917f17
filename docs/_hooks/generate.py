"""MkDocs hook: the reference pages that must not drift, generated at build time.

`configuration.md` from the config dataclasses (monitor/service/config_schema.py), `cli.md`
from the argparse parsers of `infersight`, and `http-api.md` from the OpenAPI document of a
built app. Each is rendered by a function here (tests/test_docs.py reads them too) and added
to the site in `on_files`; none of the three is a file in docs/.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

GENERATED = ("configuration.md", "cli.md", "http-api.md")
# what the routes left out of the OpenAPI document take, where their handler says nothing
_UNLISTED = {"/v1/traces": "OTLP/HTTP trace exports, protobuf or JSON: see [OpenTelemetry](opentelemetry.md)"}


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render_configuration() -> str:
    from infersight.monitor.service.config_schema import ENV_ONLY, ENVIRONMENT, sections

    out = [
        "# Configuration",
        "",
        "`infersight serve --config infersight.yaml` reads one YAML file. Every key is optional "
        "except those marked *required* inside a section you give; relative paths are resolved "
        "against the file's directory. Check a file without starting anything with "
        "`infersight config check infersight.yaml` (it names the bad key and its line), and give "
        "your editor the schema from `infersight config schema`.",
        "",
        "This page is generated from the configuration dataclasses "
        "(`monitor/service/config_sections.py`) each time the site is built.",
        "",
    ]
    for section in sections():
        title = f"`{section.name}:`" if section.name else "Top level"
        out += [f"## {title}", ""]
        if section.description:
            out += [section.description, ""]
        if not section.keys:
            continue
        out += ["| Key | Type | Default | Description |", "|---|---|---|---|"]
        for key in section.keys:
            kind = key.type + (" or null" if key.nullable else "")
            default = "*required*" if key.default == "required" else f"`{_cell(key.default)}`"
            description = key.description
            if key.key in ENV_ONLY:
                description = f"not in the file: set `{ENV_ONLY[key.key]}` ({description})"
            out.append(f"| `{key.key}` | {kind} | {default} | {_cell(description)} |")
        out.append("")
    out += [
        "## Environment variables",
        "",
        "Secrets never need to be in the file; these override it. Receivers' secrets are named "
        "by `*_env` keys of the rule file (see [Alerts and actions](alerts.md)).",
        "",
        "| Variable | Effect |",
        "|---|---|",
    ]
    out += [f"| `{name}` | {_cell(effect)} |" for name, effect in ENVIRONMENT.items()]
    return "\n".join(out) + "\n"


def _commands(parser: argparse.ArgumentParser, name: str) -> list[tuple[str, argparse.ArgumentParser]]:
    out = [(name, parser)]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub_name, sub in action.choices.items():
                out += _commands(sub, f"{name} {sub_name}")
    return out


def render_cli() -> str:
    import os

    from infersight.monitor.cli import build_parser

    out = [
        "# Command line",
        "",
        "Every command of `infersight`, with its `--help` text. Generated from the argparse "
        "parsers each time the site is built. Bad input is one line on stderr and exit status 2; "
        "`infersight config check` exits 1 for a bad file.",
        "",
    ]
    columns = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "100"  # argparse wraps at the terminal's width: the page's is fixed
    try:
        for name, parser in _commands(build_parser(), "infersight"):
            parser.prog = name
            out += [f"## `{name}`", "", "```text", parser.format_help().rstrip(), "```", ""]
    finally:
        if columns is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = columns
    return "\n".join(out)


def _built_app() -> Any:
    from infersight.monitor.service import create_app
    from infersight.monitor.service.config import DriftConfig, ServiceConfig

    with tempfile.TemporaryDirectory() as tmp:
        return create_app(ServiceConfig(data_dir=Path(tmp), drift=DriftConfig(enabled=False)))


def openapi_document() -> dict[str, Any]:
    return dict(_built_app().openapi())


def _routes(routes: Any) -> list[Any]:
    """Every route, through included routers (FastAPI keeps them as wrappers)."""
    out = []
    for route in routes:
        inner = getattr(route, "original_router", None)
        out += _routes(inner.routes) if inner is not None else [route]
    return out


def unlisted_routes() -> list[tuple[str, str, str]]:
    """(method, path, summary) of the app's own routes left out of the OpenAPI document."""
    out = []
    for route in _routes(_built_app().routes):
        if getattr(route, "include_in_schema", True) or not hasattr(route, "endpoint"):
            continue
        if route.path in ("/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc"):
            continue
        doc = (route.endpoint.__doc__ or "").strip().splitlines()
        for method in sorted(route.methods - {"HEAD"}):
            out.append((method, route.path, doc[0] if doc else ""))
    return out


def _schema_name(schema: dict[str, Any]) -> str:
    if "$ref" in schema:
        return schema["$ref"].rsplit("/", 1)[-1]
    if "anyOf" in schema:
        return " or ".join(_schema_name(s) for s in schema["anyOf"])
    if schema.get("type") == "array":
        return f"array of {_schema_name(schema.get('items', {}))}"
    return str(schema.get("type", "any"))


def render_http_api() -> str:
    doc = openapi_document()
    out = [
        "# HTTP API",
        "",
        " ".join(doc["info"].get("description", "").split()),
        "",
        "Generated from the service's own OpenAPI document (`GET /openapi.json` of a running "
        "service, which also serves it at `/docs`) each time the site is built.",
        "",
    ]
    for path, item in doc["paths"].items():
        for method, op in item.items():
            if method not in {"get", "post", "put", "delete", "patch"}:
                continue
            out += [f"## `{method.upper()} {path}`", ""]
            summary = op.get("summary", "")
            description = op.get("description", "")
            if description:
                out += [description.strip(), ""]
            elif summary:
                out += [summary, ""]
            params = op.get("parameters", [])
            if params:
                out += ["| Parameter | In | Type | Required | Description |", "|---|---|---|---|---|"]
                for p in params:
                    out.append(
                        f"| `{p['name']}` | {p['in']} | {_cell(_schema_name(p.get('schema', {})))} | "
                        f"{'yes' if p.get('required') else 'no'} | {_cell(p.get('description', ''))} |"
                    )
                out.append("")
            body = op.get("requestBody", {}).get("content", {})
            for media, content in body.items():
                out += [f"Body: `{media}` {_schema_name(content.get('schema', {}))}", ""]
            codes = ", ".join(
                f"`{code}` {r.get('description', '')}" for code, r in op.get("responses", {}).items()
            )
            if codes:
                out += [f"Answers: {codes}", ""]
    unlisted = unlisted_routes()
    if unlisted:
        out += ["## Outside the OpenAPI document", "",
                "Served by the same app, but not described by `/openapi.json`:", ""]  # fmt: skip
        out += [f"- `{method} {path}`" + (f": {summary}" if summary else f" ({_UNLISTED.get(path, '')})")
                for method, path, summary in unlisted]  # fmt: skip
        out.append("")
    schemas = doc.get("components", {}).get("schemas", {})
    if schemas:
        out += ["## Schemas", ""]
        for name, schema in schemas.items():
            out += [f"### {name}", ""]
            if schema.get("description"):
                out += [" ".join(schema["description"].split()), ""]
            props = schema.get("properties", {})
            if props:
                required = set(schema.get("required", []))
                out += ["| Field | Type | Required |", "|---|---|---|"]
                for field, sub in props.items():
                    out.append(
                        f"| `{field}` | {_cell(_schema_name(sub))} | {'yes' if field in required else 'no'} |"
                    )
                out.append("")
    return "\n".join(out) + "\n"


_RENDER = {"configuration.md": render_configuration, "cli.md": render_cli, "http-api.md": render_http_api}


def on_files(files: Any, config: Any) -> Any:
    from mkdocs.structure.files import File

    for name, render in _RENDER.items():
        files.append(File.generated(config, name, content=render()))
    return files
