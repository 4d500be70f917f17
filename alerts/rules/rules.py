"""Alerting rules: the frozen data `load_config` builds (groups of rules, each a condition
on a signal, annotations and actions), the `groups:` part of a rule file parsed into it
(bad input refused with its line), and the annotation templates the rules carry.

Rule files are read as YAML whose mappings and sequences remember the line each entry was
written on (so a bad file is refused with its file, line and reason), and Prometheus-style
durations (`90s`, `5m`, `1h30m`, `0s`, `250ms`).

Templates are the subset of Prometheus' template language rules need: `{{ $value }}`,
`{{ $labels.model }}`, and the pipes `humanize`, `humanizePercentage`, `humanizeDuration`,
`printf "%.2f"`. The same text exports unchanged to Prometheus.
"""

from __future__ import annotations

import hashlib
import json
import math
import operator
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, NoReturn

import yaml

from ..errors import RuleParseError
from .signals import DRIFT_FIELDS, LATENCY_METRICS, LENGTH_FIELDS, MEMORY_RESOURCES, SIGNAL_KINDS, Signal

__all__ = [
    "ACTION_TYPES",
    "COLLECT_KINDS",
    "OPS",
    "TEMPLATE_PIPES",
    "ActionSpec",
    "Comparison",
    "Condition",
    "MarkedList",
    "MarkedMap",
    "Rule",
    "RuleGroup",
    "Source",
    "check_template",
    "format_duration",
    "load_marked",
    "parse_duration",
    "parse_groups",
    "render",
]


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
_WHOLE = re.compile(r"(?:\d+(?:ms|s|m|h|d|w|y))+")


def parse_duration(text: str) -> float:
    """Seconds in `text`; raises ValueError naming the accepted form."""
    if not isinstance(text, str) or not _WHOLE.fullmatch(text):
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


Comparison = Literal[">", ">=", "<", "<=", "==", "!="]
OPS: Mapping[str, Callable[[float, float], bool]] = {
    ">": operator.gt,
    ">=": operator.ge,
    "<": operator.lt,
    "<=": operator.le,
    "==": operator.eq,
    "!=": operator.ne,
}
ACTION_TYPES = ("snapshot", "rollback", "hot_reload", "failover", "collect", "diagnose")
COLLECT_KINDS = ("version", "any", "failed")  # what the collect action keeps (alerts/actions/evidence.py)


@dataclass(frozen=True)
class Condition:
    signal: Signal
    op: Comparison
    threshold: float

    def holds(self, value: float) -> bool:
        return OPS[self.op](value, self.threshold)


@dataclass(frozen=True)
class ActionSpec:
    """An action attached to a rule (or run by hand). `params`: `requests` (snapshot),
    `version` (hot_reload), `backup` (failover), `n` and `kind` (collect)."""

    type: str
    params: tuple[tuple[str, str | int], ...] = ()
    cooldown_s: float = 600.0
    daily_cap: int = 3
    dry_run: bool = False

    def param(self, name: str) -> str | int | None:
        return dict(self.params).get(name)

    def to_json(self) -> dict[str, Any]:
        return {
            "type": self.type,
            "params": dict(self.params),
            "cooldown_s": self.cooldown_s,
            "daily_cap": self.daily_cap,
            "dry_run": self.dry_run,
        }

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> ActionSpec:
        return cls(
            type=str(obj["type"]),
            params=tuple(sorted(dict(obj.get("params", {})).items())),
            cooldown_s=float(obj.get("cooldown_s", 600.0)),
            daily_cap=int(obj.get("daily_cap", 3)),
            dry_run=bool(obj.get("dry_run", False)),
        )


@dataclass(frozen=True)
class Rule:
    name: str  # the alertname
    condition: Condition
    by: tuple[str, ...] = ()
    while_: tuple[Condition, ...] = ()  # guards: each must hold for some label set
    for_s: float = 0.0
    keep_firing_for_s: float = 0.0
    labels: tuple[tuple[str, str], ...] = ()
    annotations: tuple[tuple[str, str], ...] = ()
    actions: tuple[ActionSpec, ...] = ()
    group: str = "default"
    line: int | None = field(default=None, compare=False)

    @property
    def key(self) -> str:
        """Stable identity: the alertname and the rule's own labels (a warning and a
        critical rule may share a name)."""
        raw = json.dumps([self.name, sorted(self.labels)], separators=(",", ":"))
        return f"{self.name}:{hashlib.sha256(raw.encode()).hexdigest()[:12]}"

    @property
    def severity(self) -> str:
        return dict(self.labels).get("severity", "warning")


@dataclass(frozen=True)
class RuleGroup:
    name: str
    interval_s: float
    rules: tuple[Rule, ...]


_ACTION = re.compile(r"\{\{\s*(.*?)\s*\}\}")
_HEAD = re.compile(r"\$(value|labels\.([a-zA-Z_][a-zA-Z0-9_]*))")
_PRINTF = re.compile(r'printf\s+"(%[-+ 0#]?\d*(?:\.\d+)?[dfegs])"')
TEMPLATE_PIPES = ("humanize", "humanizePercentage", "humanizeDuration", 'printf "<fmt>"')


def _humanize(v: float) -> str:
    if v == 0 or not math.isfinite(v):
        return f"{v:g}"
    for size, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(v) >= size:
            return f"{v / size:.4g}{suffix}"
    for size, suffix in ((1e-9, "n"), (1e-6, "µ"), (1e-3, "m")):
        if abs(v) < size * 1000:
            return f"{v / size:.4g}{suffix}"
    return f"{v:.4g}"


def _humanize_duration(v: float) -> str:
    if v < 1:
        return f"{v * 1000:.4g}ms"
    parts, rest = [], int(v)
    for size, unit in ((86400, "d"), (3600, "h"), (60, "m")):
        if rest >= size:
            parts.append(f"{rest // size}{unit}")
            rest %= size
    parts.append(f"{rest + (v - int(v)):.4g}s" if not parts else f"{rest}s")
    return " ".join(parts)


def _pipe(value: float, pipe: str) -> str:
    if pipe == "humanize":
        return _humanize(value)
    if pipe == "humanizePercentage":
        return f"{value * 100:.4g}%"
    if pipe == "humanizeDuration":
        return _humanize_duration(value)
    m = _PRINTF.fullmatch(pipe)
    if m is None:
        raise ValueError(f"unknown template function {pipe!r} (known: {', '.join(TEMPLATE_PIPES)})")
    return m.group(1) % value


def _action(expr: str, labels: Mapping[str, str], value: float) -> str:
    head, *pipes = [p.strip() for p in expr.split("|")]
    m = _HEAD.fullmatch(head)
    if m is None:
        raise ValueError(f"unknown template expression {head!r} (use $value or $labels.NAME)")
    if m.group(2) is not None:
        if pipes:
            raise ValueError("pipes apply to $value only")
        return labels.get(m.group(2), "")
    if not pipes:
        return f"{value:g}"
    if len(pipes) > 1:
        raise ValueError("one pipe per expression")
    return _pipe(value, pipes[0])


def render(template: str, labels: Mapping[str, str], value: float) -> str:
    """The template with its `{{ ... }}` actions replaced; raises ValueError on an unknown one."""
    return _ACTION.sub(lambda m: _action(m.group(1), labels, value), template)


def check_template(template: str) -> None:
    """Raise ValueError when `template` uses anything `render` would refuse."""
    if template.count("{{") != template.count("}}"):
        raise ValueError("unbalanced {{ }}")
    render(template, {}, 1.0)


_RULE_KEYS = {
    "alert",
    "signal",
    "op",
    "threshold",
    "by",
    "while",
    "for",
    "keep_firing_for",
    "labels",
    "annotations",
    "actions",
}
_ACTION_KEYS = {"type", "requests", "version", "backup", "n", "kind", "cooldown", "daily_cap", "dry_run"}
_ACTION_PARAMS = {
    "snapshot": {"requests"},
    "hot_reload": {"version"},
    "failover": {"backup"},
    "rollback": set(),
    "collect": {"n", "kind"},
    "diagnose": set(),
}
_ALL_PARAMS = set().union(*_ACTION_PARAMS.values())


def _duration(src: Source, m: MarkedMap, key: str, what: str, default: float) -> float:
    if key not in m or m[key] is None:
        return default
    try:
        return parse_duration(str(m[key]))
    except ValueError as exc:
        src.fail(m.key_lines[key], f"{what}.{key}: {exc}")


def _number(src: Source, m: MarkedMap, key: str, what: str) -> float:
    value = src.require(m, key, what)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        src.fail(m.key_lines[key], f"{what}.{key} must be a finite number, got {value!r}")
    return float(value)


def _signal(src: Source, raw: Any, line: int, what: str) -> Signal:
    m = src.mapping(raw, line, what)
    kind = src.string(m, "kind", what)
    if kind not in SIGNAL_KINDS:
        src.fail(m.key_lines["kind"], f"unknown signal kind {kind!r}; valid kinds: {', '.join(SIGNAL_KINDS)}")
    spec = SIGNAL_KINDS[kind]
    src.only_keys(m, {"kind", *spec.params}, f"{what} ({kind})")
    for need in spec.required:
        src.require(m, need, f"{what} ({kind})")
    values: dict[str, Any] = {"kind": kind}
    if "metric" in m:
        if m["metric"] not in LATENCY_METRICS:
            src.fail(m.key_lines["metric"], f"metric must be one of {', '.join(LATENCY_METRICS)}")
        values["metric"] = m["metric"]
    if "quantile" in m:
        q = _number(src, m, "quantile", what)
        if not 0 < q < 1:
            src.fail(m.key_lines["quantile"], f"quantile must be in (0, 1), got {q}")
        values["quantile"] = q
    if "window" in m:
        values["window_s"] = _duration(src, m, "window", what, 0.0)
        if values["window_s"] <= 0:
            src.fail(m.key_lines["window"], "window must be positive")
    if "field" in m:
        fields = LENGTH_FIELDS if kind == "length_drift" else DRIFT_FIELDS
        if m["field"] not in fields:
            src.fail(m.key_lines["field"], f"field must be one of {', '.join(fields)}")
        values["field"] = m["field"]
    if "resource" in m:
        if m["resource"] not in MEMORY_RESOURCES:
            src.fail(m.key_lines["resource"], f"resource must be one of {', '.join(MEMORY_RESOURCES)}")
        values["resource"] = m["resource"]
    if "baseline" in m:
        values["baseline_s"] = _duration(src, m, "baseline", what, 0.0)
        if values["baseline_s"] <= 0:
            src.fail(m.key_lines["baseline"], "baseline must be positive")
    if "slo" in m:
        values["slo"] = src.string(m, "slo", what)
    if "min_requests" in m:
        n = m["min_requests"]
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            src.fail(m.key_lines["min_requests"], "min_requests must be a positive integer")
        values["min_requests"] = n
    return Signal(**values)


def _condition(src: Source, m: MarkedMap, what: str) -> Condition:
    signal = _signal(src, src.require(m, "signal", what), m.key_lines.get("signal", m.line), f"{what}.signal")
    op = src.string(m, "op", what)
    if op not in OPS:
        src.fail(m.key_lines["op"], f"op must be one of {' '.join(OPS)}, got {op!r}")
    return Condition(signal, op, _number(src, m, "threshold", what))  # type: ignore[arg-type]


def _actions(src: Source, m: MarkedMap, what: str) -> tuple[ActionSpec, ...]:
    if m.get("actions") is None:
        return ()
    out = []
    for i, line, raw in iter_items(src.sequence(m["actions"], m.key_lines["actions"], f"{what}.actions")):
        a = src.mapping(raw, line, f"{what}.actions[{i}]")
        src.only_keys(a, _ACTION_KEYS, f"{what}.actions[{i}]")
        kind = src.string(a, "type", f"{what}.actions[{i}]")
        if kind not in ACTION_TYPES:
            src.fail(
                a.key_lines["type"], f"unknown action {kind!r}; valid actions: {', '.join(ACTION_TYPES)}"
            )
        params: list[tuple[str, str | int]] = []
        for key in sorted(_ALL_PARAMS):
            if key in a and key not in _ACTION_PARAMS[kind]:
                src.fail(a.key_lines[key], f"action {kind} takes no {key!r}")
        for key in _ACTION_PARAMS[kind]:
            if key == "requests":
                n = a.get(key, 50)
                if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= 10_000:
                    src.fail(a.key_lines.get(key, a.line), "requests must be an integer in 1..10000")
                params.append((key, n))
            elif key == "n":
                n = a.get(key, 200)
                if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= 100_000:
                    src.fail(a.key_lines.get(key, a.line), "n must be an integer in 1..100000")
                params.append((key, n))
            elif key == "kind":
                collect_kind = src.string(a, key, f"{what}.actions[{i}] (collect)", default="version")
                if collect_kind not in COLLECT_KINDS:
                    src.fail(
                        a.key_lines.get(key, a.line),
                        f"unknown collect kind {collect_kind!r}; valid kinds: {', '.join(COLLECT_KINDS)}",
                    )
                params.append((key, collect_kind))
            elif key in a or kind == "hot_reload":  # failover's backup may come from the runner
                params.append((key, src.string(a, key, f"{what}.actions[{i}] ({kind})")))
        cap = a.get("daily_cap", 3)
        if isinstance(cap, bool) or not isinstance(cap, int) or cap < 1:
            src.fail(a.key_lines.get("daily_cap", a.line), "daily_cap must be a positive integer")
        dry = a.get("dry_run", False)
        if not isinstance(dry, bool):
            src.fail(a.key_lines["dry_run"], "dry_run must be true or false")
        cooldown = _duration(src, a, "cooldown", f"{what}.actions[{i}]", 600.0)
        out.append(ActionSpec(kind, tuple(sorted(params)), cooldown, cap, dry))
    return tuple(out)


def _rule(src: Source, m: MarkedMap, group: str, what: str) -> Rule:
    src.only_keys(m, _RULE_KEYS, what)
    name = src.string(m, "alert", what)
    if not name.replace("_", "a").isalnum() or name[0].isdigit():
        src.fail(
            m.key_lines["alert"],
            f"alert name {name!r} must be letters, digits and _ (a Prometheus label value)",
        )
    what = f"rule {name!r}"
    condition = _condition(src, m, what)
    by: tuple[str, ...] = ()
    if m.get("by") is not None:
        seq = src.sequence(m["by"], m.key_lines["by"], f"{what}.by")
        allowed = condition.signal.spec.labels
        for _, line, label in iter_items(seq):
            if label not in allowed:
                src.fail(
                    line,
                    f"{condition.signal.kind} cannot be split by {label!r} (it has: {', '.join(allowed) or 'no labels'})",
                )
        by = tuple(seq)
    guards = []
    if m.get("while") is not None:
        for i, line, raw in iter_items(src.sequence(m["while"], m.key_lines["while"], f"{what}.while")):
            guards.append(_condition(src, src.mapping(raw, line, f"{what}.while[{i}]"), f"{what}.while[{i}]"))
    labels = src.labels(m, "labels", what)
    if "alertname" in labels:
        src.fail(m.key_lines["labels"], "labels may not set alertname (it is the rule's alert name)")
    annotations = src.labels(m, "annotations", what)
    for key, text in annotations.items():
        try:
            check_template(text)
        except ValueError as exc:
            src.fail(m["annotations"].key_lines[key], f"annotation {key!r}: {exc}")
    return Rule(
        name=name,
        condition=condition,
        by=by,
        while_=tuple(guards),
        for_s=_duration(src, m, "for", what, 0.0),
        keep_firing_for_s=_duration(src, m, "keep_firing_for", what, 0.0),
        labels=tuple(sorted(labels.items())),
        annotations=tuple(sorted(annotations.items())),
        actions=_actions(src, m, what),
        group=group,
        line=m.line,
    )


def parse_groups(src: Source, root: MarkedMap) -> tuple[RuleGroup, ...]:
    seq = src.sequence(src.require(root, "groups", "the rule file"), root.key_lines["groups"], "groups")
    groups: list[RuleGroup] = []
    seen_groups: set[str] = set()
    seen_rules: dict[str, int] = {}
    for i, line, raw in iter_items(seq):
        g = src.mapping(raw, line, f"groups[{i}]")
        src.only_keys(g, {"name", "interval", "rules"}, f"groups[{i}]")
        name = src.string(g, "name", f"groups[{i}]")
        if name in seen_groups:
            src.fail(g.key_lines["name"], f"duplicate group name {name!r}")
        seen_groups.add(name)
        interval = _duration(src, g, "interval", f"group {name!r}", 15.0)
        if interval <= 0:
            src.fail(g.key_lines["interval"], "interval must be positive")
        rules = []
        rule_seq = src.sequence(src.require(g, "rules", f"group {name!r}"), g.key_lines["rules"], "rules")
        for j, rline, rraw in iter_items(rule_seq):
            rule = _rule(src, src.mapping(rraw, rline, f"rule {j}"), name, f"group {name!r} rule {j}")
            if rule.key in seen_rules:
                src.fail(
                    rline,
                    f"duplicate rule {rule.name!r} with the same labels (first at line {seen_rules[rule.key]})",
                )
            seen_rules[rule.key] = rline
            rules.append(rule)
        groups.append(RuleGroup(name, interval, tuple(rules)))
    return tuple(groups)
