"""Annotation templates, in the subset of Prometheus' template language that rules need:
`{{ $value }}`, `{{ $labels.model }}`, and the pipes `humanize`, `humanizePercentage`,
`humanizeDuration`, `printf "%.2f"`. The same text exports unchanged to Prometheus."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping

__all__ = ["TEMPLATE_PIPES", "check_template", "render"]

_ACTION = re.compile(r"\{\{\s*(.*?)\s*\}\}")
_HEAD = re.compile(r"^\$(value|labels\.([a-zA-Z_][a-zA-Z0-9_]*))$")
_PRINTF = re.compile(r'^printf\s+"(%[-+ 0#]?\d*(?:\.\d+)?[dfegs])"$')
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
    m = _PRINTF.match(pipe)
    if m is None:
        raise ValueError(f"unknown template function {pipe!r} (known: {', '.join(TEMPLATE_PIPES)})")
    return m.group(1) % value


def _action(expr: str, labels: Mapping[str, str], value: float) -> str:
    head, *pipes = [p.strip() for p in expr.split("|")]
    m = _HEAD.match(head)
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
