"""The configuration described from the code: every key of `infersight.yaml`, a JSON Schema
of it, and a file check that names the bad key with its line.

The keys, types and defaults come from the dataclasses of `config_sections.py`; each key's
one-line description is the comment on its line or the first line of the `#` comment block
directly above it, so a new field documents itself where it is declared. The configuration page of
the docs site (docs/_hooks/generate.py) and `infersight config schema` are rendered from
`config_keys()`; `check_file` runs the service's own `load_config` and maps the dotted key
it rejects to the line of the YAML node that holds it, raising the typed error of its kind
(errors.py: `ConfigFileInvalid` and below).
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import re
import textwrap
import types
import typing
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from . import config as _config
from .errors import (
    ConfigFileInvalid,
    ConfigInvalid,
    ConfigKeyMissing,
    ConfigKeyUnknown,
    ConfigNotYAML,
    ConfigTypeWrong,
    ConfigUnreadable,
    ConfigValueBad,
)

__all__ = [
    "ENVIRONMENT",
    "ENV_ONLY",
    "ConfigKey",
    "Section",
    "check_file",
    "config_keys",
    "json_schema",
    "sections",
]

# The environment variables infersight reads, with what each does. A test fails when the
# code reads an INFERSIGHT_* variable that is not listed here.
ENVIRONMENT: Mapping[str, str] = {
    _config.ENV_TOKEN: "the bearer token of the HTTP API (never in the file); on loopback, "
    "without it, one is generated in DATA_DIR/api-token",
    _config.ENV_DATABASE_URL: "overrides `database_url` (a sqlite:/// or postgresql:// URL)",
    _config.ENV_UPSTREAM_API_KEY: "overrides `upstream.api_key`",
    _config.ENV_SHADOW_UPSTREAM_API_KEY: "overrides `shadow_upstream.api_key`",
    _config.ENV_KV_KEY: "overrides `engine.prefix_cache_redis_key`, the secret the shared KV tier's "
    "blocks are sealed with (at least 32 bytes)",
    _config.ENV_UPSTREAM_RELEASE: "overrides `upstream.release`, the release this pod's answers are "
    "recorded as (e.g. the pod's rollouts-pod-template-hash label)",
    "INFERSIGHT_CACHE_DIR": "where the engine caches built libraries and converted weights "
    "(default $XDG_CACHE_HOME/infersight, or ~/.cache/infersight)",
    "INFERSIGHT_ENGINE_MARCH": "a gcc -march (`native`: this CPU) to build the engine's native "
    "library for at load, instead of the packaged builds",
    "INFERSIGHT_EMBED_BACKEND": "forces the drift embedder's backend when it is `auto` "
    "(onnxruntime, openvino, sentence-transformers)",
    "INFERSIGHT_DEBUG": "set to 1: the CLI prints the traceback of an internal error",
}

# Sections whose value is a nested dataclass, in the order of the file.
_TOP: type = _config.ServiceConfig


@dataclass(frozen=True)
class ConfigKey:
    """One key of the file: `key` is its dotted path (`engine.max_queue`)."""

    key: str
    type: str  # as written in the file's terms: integer, number, string, path, boolean, list...
    default: str  # "required", or the default as YAML would spell it
    description: str
    nullable: bool


@dataclass(frozen=True)
class Section:
    name: str  # "" for the top level
    description: str
    keys: tuple[ConfigKey, ...]


# Keys of the dataclasses that the file may not hold: they come from the environment only.
ENV_ONLY: Mapping[str, str] = {"token": _config.ENV_TOKEN}


def _yaml_words(text: str) -> str:
    """A comment written for Python, said in the file's terms (None is YAML's null)."""
    return re.sub(r"\bNone\b", "null", text)


def _comments(cls: type) -> dict[str, str]:
    """field name -> its description: the comment on the field's line, else the first line
    of the comment block directly above it."""
    source = textwrap.dedent(inspect.getsource(cls))
    lines = source.splitlines()
    out: dict[str, str] = {}
    body = ast.parse(source).body[0]
    assert isinstance(body, ast.ClassDef)
    for node in body.body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        row = node.lineno - 1
        inline = _inline_comment(lines[row])
        if inline:
            out[node.target.id] = _yaml_words(inline)
            continue
        block: list[str] = []
        above = row - 1
        while above >= 0 and lines[above].strip().startswith("#"):
            block.insert(0, lines[above].strip().lstrip("#").strip())
            above -= 1
        if block:
            out[node.target.id] = _yaml_words(block[0])
    return out


def _inline_comment(line: str) -> str:
    """The `# ...` ending a line of code (a `#` inside a string literal does not count)."""
    in_string: str | None = None
    for i, ch in enumerate(line):
        if in_string:
            if ch == in_string and line[i - 1] != "\\":
                in_string = None
        elif ch in "\"'":
            in_string = ch
        elif ch == "#":
            return line[i + 1 :].strip().removesuffix("fmt: skip").strip()
    return ""


def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls, vars(inspect.getmodule(cls)))


def _unwrap(hint: Any) -> tuple[Any, bool]:
    """(the type without None, whether None is allowed)."""
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (typing.Union, types.UnionType) and type(None) in args:
        rest = [a for a in args if a is not type(None)]
        return rest[0], True
    return hint, False


def _nested(cls: type) -> dict[str, type]:
    """The fields of `cls` whose value is a section of its own (a dataclass)."""
    out = {}
    for name, hint in _hints(cls).items():
        inner, _ = _unwrap(hint)
        if dataclasses.is_dataclass(inner) and isinstance(inner, type):
            out[name] = inner
    return out


def _type_name(hint: Any, key: str) -> str:
    inner, _ = _unwrap(hint)
    if key.rsplit(".", 1)[-1] in _config._PATH_FIELDS or inner is Path:
        return "path"
    if typing.get_origin(inner) is tuple:
        return "list of strings"
    return {bool: "boolean", int: "integer", float: "number", str: "string"}.get(inner, str(inner))


def _default(f: dataclasses.Field[Any]) -> str:
    if f.default is not dataclasses.MISSING:
        value = f.default
        if value is None:
            return "null"
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, tuple):
            return "[]" if not value else "[" + ", ".join(map(str, value)) + "]"
        return str(value)
    return "required"


def _walk(cls: type, prefix: str) -> Iterator[Section]:
    comments = _comments(cls)
    hints = _hints(cls)
    nested = _nested(cls)
    keys = []
    for f in dataclasses.fields(cls):
        if f.name in nested:
            continue
        key = prefix + f.name
        keys.append(ConfigKey(
            key=key, type=_type_name(hints[f.name], key), default=_default(f),
            description=comments.get(f.name, ""), nullable=_unwrap(hints[f.name])[1],
        ))  # fmt: skip
    doc = inspect.getdoc(cls) or ""
    doc = "" if doc.startswith(f"{cls.__name__}(") else " ".join(doc.split())  # dataclass' own
    yield Section(prefix.rstrip("."), doc, tuple(keys))
    for name, sub in nested.items():
        yield from _walk(sub, f"{prefix}{name}.")


def sections() -> tuple[Section, ...]:
    """Every section of the file, the top level first, each with its keys in code order."""
    return tuple(_walk(_TOP, ""))


def config_keys() -> tuple[ConfigKey, ...]:
    return tuple(key for section in sections() for key in section.keys)


_JSON_TYPES = {"boolean": "boolean", "integer": "integer", "number": "number", "string": "string",
               "path": "string"}  # fmt: skip


def _schema_of(cls: type, prefix: str) -> dict[str, Any]:
    comments = _comments(cls)
    hints = _hints(cls)
    nested = _nested(cls)
    props: dict[str, Any] = {}
    required = []
    for f in dataclasses.fields(cls):
        _, nullable = _unwrap(hints[f.name])
        if f.name in nested:
            prop = _schema_of(nested[f.name], f"{prefix}{f.name}.")
        else:
            kind = _type_name(hints[f.name], prefix + f.name)
            prop = {"type": "array", "items": {"type": "string"}} if kind.startswith("list") else {
                "type": _JSON_TYPES[kind]}  # fmt: skip
            if f.default is not dataclasses.MISSING and f.default is not None:
                default = f.default
                prop["default"] = list(default) if isinstance(default, tuple) else (
                    str(default) if isinstance(default, Path) else default)  # fmt: skip
        if comments.get(f.name):
            prop["description"] = comments[f.name]
        if nullable:
            description = prop.pop("description", None)
            prop = {"anyOf": [prop, {"type": "null"}]}
            if description:
                prop["description"] = description
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            required.append(f.name)
        props[f.name] = prop
    out: dict[str, Any] = {"type": "object", "properties": props, "additionalProperties": False}
    if required:
        out["required"] = required
    doc = inspect.getdoc(cls) or ""
    if doc and not doc.startswith(f"{cls.__name__}("):
        out["description"] = " ".join(doc.split())
    return out


def json_schema() -> dict[str, Any]:
    """A JSON Schema (draft 2020-12) of infersight.yaml, for editors."""
    schema = _schema_of(_TOP, "")
    for key in ENV_ONLY:  # refused in the file: they come from the environment
        del schema["properties"][key]
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "infersight.yaml",
        "description": "The configuration file of `infersight serve`.",
        **schema,
    }


def _lines(text: str) -> dict[str, int]:
    """dotted key -> 1-based line of that key in the YAML text (mappings only)."""
    out: dict[str, int] = {}

    def visit(node: yaml.Node, prefix: str) -> None:
        if not isinstance(node, yaml.MappingNode):
            return
        for key, value in node.value:
            name = f"{prefix}{key.value}"
            out.setdefault(name, key.start_mark.line + 1)
            visit(value, name + ".")

    root = yaml.compose(text)
    if root is not None:
        visit(root, "")
    return out


_TYPE_REASONS = re.compile(r"^must (be (an integer|a number|a string|true or false|a mapping|a path|"
                           r"a list of strings)|not be null)$")  # fmt: skip


def check_file(path: str | Path, env: Mapping[str, str] | None = None) -> None:
    """Returns when `load_config` accepts the file; else raises the `ConfigFileInvalid` of
    its first problem (unknown key, missing key, wrong type, bad value, not YAML,
    unreadable), with the line of the key in the file."""
    source = str(path)
    try:
        _config.load_config(path, env=env or {})
        return
    except ConfigInvalid as exc:
        field, reason = exc.field, exc.reason
        cause: BaseException = exc
    if (field == "config" and reason.startswith("cannot read")) or reason == "not UTF-8 text":
        raise ConfigUnreadable("config", reason, source=source, line=None) from cause
    if field.startswith("line ") or reason.startswith("not valid YAML"):
        line = int(field.split()[1]) if field.startswith("line ") else None
        raise ConfigNotYAML("config", reason, source=source, line=line) from cause
    key_in_reason = re.match(r"^([a-z_]+(?:\.[a-z_]+)+): (.*)$", reason)
    if key_in_reason:  # a section's own check names the key inside its reason (retention)
        field, reason = key_in_reason.groups()
    missing = re.match(r"^incomplete: .*missing .*argument: '(\w+)'", reason)
    if missing:
        field, reason = f"{field}.{missing.group(1)}", "is required"
    lines = _lines(Path(path).read_text(encoding="utf-8"))
    line = lines.get(field)
    parent = field
    while line is None and "." in parent:  # a missing key: the line of its section
        parent = parent.rsplit(".", 1)[0]
        line = lines.get(parent)
    kind: type[ConfigFileInvalid]
    if reason.startswith("unknown key"):
        kind = ConfigKeyUnknown
    elif missing or reason == "is required":
        kind = ConfigKeyMissing
    elif _TYPE_REASONS.match(reason):
        kind = ConfigTypeWrong
    else:
        kind = ConfigValueBad
    raise kind(field, reason, source=source, line=line) from cause
