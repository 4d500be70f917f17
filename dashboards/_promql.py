"""Which metric names a PromQL expression (or a Grafana `label_values` query) reads.

Not a full PromQL parser: enough to check that a dashboard refers only to exported metrics.
Strings, label matchers, range/offset durations and grouping label lists are removed first;
what remains is function names (followed by `(`), keywords, numbers and metric names.
"""

from __future__ import annotations

import re

__all__ = ["metric_names"]

_STRING = re.compile(r'"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])*\'|`[^`]*`')
_MATCHERS = re.compile(r"\{[^{}]*\}")
_RANGE = re.compile(r"\[[^\[\]]*\]")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
_IDENT = re.compile(r"(?<![\w$.:])([A-Za-z_:][A-Za-z0-9_:]*)(\s*\()?")
_LABEL_VALUES = re.compile(r"^\s*label_values\s*\((.*)\)\s*$", re.S)
_KEYWORDS = frozenset(
    {
        "and",
        "or",
        "unless",
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
        "offset",
        "bool",
        "inf",
        "nan",
        "Inf",
        "NaN",
        "atan2",
    }
)


def _strip(expr: str) -> str:
    expr = _STRING.sub('""', expr)
    expr = _MATCHERS.sub(" ", expr)
    expr = _RANGE.sub(" ", expr)
    expr = _GROUPING.sub(" ", expr)
    return re.sub(r"\boffset\s+-?[0-9a-z]+", " ", expr)


def metric_names(expr: str) -> frozenset[str]:
    """Metric names in `expr`, a PromQL expression or `label_values([metric,] label)`."""
    lv = _LABEL_VALUES.match(expr)
    if lv is not None:
        args = _strip(lv.group(1))
        if "," not in args:  # label_values(label): no metric
            return frozenset()
        expr = args.rsplit(",", 1)[0]
    names = set()
    for match in _IDENT.finditer(_strip(expr)):
        name, call = match.group(1), match.group(2)
        if call or name in _KEYWORDS:
            continue
        names.add(name)
    return frozenset(names)
