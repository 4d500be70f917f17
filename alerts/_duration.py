"""Prometheus-style durations: `90s`, `5m`, `1h30m`, `0s`, `250ms`."""

from __future__ import annotations

import re

__all__ = ["format_duration", "parse_duration"]

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
