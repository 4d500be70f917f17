"""Reading rule files: YAML whose mappings and sequences remember the line each entry was
written on (so a bad file is refused with its file, line and reason), and Prometheus-style
durations (`90s`, `5m`, `1h30m`, `0s`, `250ms`).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, NoReturn

import yaml

from ..errors import RuleParseError

__all__ = ["MarkedList", "MarkedMap", "Source", "format_duration", "load_marked", "parse_duration"]


class MarkedMap(dict[str, Any]):
    """A mapping whose `line` is where it starts and `key_lines[k]` where key `k` is."""

    line: int
    key_lines: dict[str, int]


class MarkedList(list[Any]):
    """A sequence whose `line` is where it starts and `item_lines[i]` where item `i` is."""

    line: int
    item_lines: list[int]


@dataclass(frozen=True)
class Source:
    """The file being parsed: raises `RuleParseError` at a line."""

    file: str

    def fail(self, line: int | None, reason: str) -> NoReturn:
        raise RuleParseError(self.file, line, reason)

    def mapping(self, value: Any, line: int, what: str) -> MarkedMap:
        if not isinstance(value, MarkedMap):
            self.fail(line, f"{what} must be a mapping")
        return value

    def sequence(self, value: Any, line: int, what: str) -> MarkedList:
        if not isinstance(value, MarkedList):
            self.fail(line, f"{what} must be a list")
        return value

    def only_keys(self, m: MarkedMap, allowed: set[str], what: str) -> None:
        for key in m:
            if key not in allowed:
                self.fail(
                    m.key_lines[key], f"unknown key {key!r} in {what} (allowed: {', '.join(sorted(allowed))})"
                )

    def require(self, m: MarkedMap, key: str, what: str) -> Any:
        if key not in m or m[key] is None:
            self.fail(m.line, f"{what} needs {key!r}")
        return m[key]

    def string(self, m: MarkedMap, key: str, what: str, *, default: str | None = None) -> str:
        if key not in m or m[key] is None:
            if default is None:
                self.fail(m.line, f"{what} needs {key!r}")
            return default
        value = m[key]
        if not isinstance(value, str) or not value:
            self.fail(m.key_lines[key], f"{what}.{key} must be a non-empty string")
        return value

    def labels(self, m: MarkedMap, key: str, what: str) -> dict[str, str]:
        if key not in m or m[key] is None:
            return {}
        raw = self.mapping(m[key], m.key_lines[key], f"{what}.{key}")
        out = {}
        for k, v in raw.items():
            if isinstance(v, bool) or not isinstance(v, str | int | float):
                self.fail(raw.key_lines[k], f"{what}.{key}.{k} must be a string")
            out[str(k)] = str(v)
        return out


def _mark(node: yaml.Node) -> int:
    return int(node.start_mark.line) + 1


def _convert(node: yaml.Node, src: Source, ctor: yaml.constructor.SafeConstructor) -> Any:
    if isinstance(node, yaml.MappingNode):
        out = MarkedMap()
        out.line, out.key_lines = _mark(node), {}
        for key_node, value_node in node.value:
            key = ctor.construct_object(key_node) if isinstance(key_node, yaml.ScalarNode) else None
            if not isinstance(key, str | int | float) or isinstance(key, bool):
                src.fail(_mark(key_node), "mapping keys must be plain strings")
            key = str(key)
            if key in out:
                src.fail(_mark(key_node), f"duplicate key {key!r} (first at line {out.key_lines[key]})")
            out[key] = _convert(value_node, src, ctor)
            out.key_lines[key] = _mark(key_node)
        return out
    if isinstance(node, yaml.SequenceNode):
        seq = MarkedList()
        seq.line, seq.item_lines = _mark(node), []
        for item in node.value:
            seq.append(_convert(item, src, ctor))
            seq.item_lines.append(_mark(item))
        return seq
    return ctor.construct_object(node)


def load_marked(text: str, file: str) -> Any:
    """Parse one YAML document into MarkedMap / MarkedList / scalars; syntax errors carry the line."""
    src = Source(file)
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = int(mark.line) + 1 if mark is not None else None
        src.fail(line, f"invalid YAML: {exc.problem or exc}")
    except yaml.YAMLError as exc:
        src.fail(None, f"invalid YAML: {exc}")
    if node is None:
        src.fail(1, "the file is empty")
    ctor = yaml.constructor.SafeConstructor()
    try:
        return _convert(node, src, ctor)
    except yaml.constructor.ConstructorError as exc:
        line = int(exc.problem_mark.line) + 1 if exc.problem_mark is not None else None
        src.fail(line, f"invalid YAML value: {exc.problem}")


def iter_items(seq: MarkedList) -> Iterator[tuple[int, int, Any]]:
    """(index, line, item) over a marked list."""
    for i, item in enumerate(seq):
        yield i, seq.item_lines[i], item


_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0, "y": 31536000.0}
_PART = re.compile(r"(\d+)(ms|s|m|h|d|w|y)")
_WHOLE = re.compile(r"^(?:\d+(?:ms|s|m|h|d|w|y))+$")


def parse_duration(text: str) -> float:
    """Seconds in `text`; raises ValueError naming the accepted form."""
    if not isinstance(text, str) or not _WHOLE.match(text):
        raise ValueError(f"not a duration: {text!r} (use e.g. 30s, 5m, 1h30m)")
    return sum(int(n) * _UNITS[u] for n, u in _PART.findall(text))


def format_duration(seconds: float) -> str:
    """The shortest Prometheus duration for `seconds` (rounded to milliseconds)."""
    ms = round(seconds * 1000)
    if ms == 0:
        return "0s"
    out = []
    for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1000), ("ms", 1)):
        n, ms = divmod(ms, size)
        if n:
            out.append(f"{n}{unit}")
    return "".join(out)
