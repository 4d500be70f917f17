"""PromQL fragments shared by the dashboard rows, all filtered by the dashboard's variables."""

from __future__ import annotations

__all__ = ["RATE", "gpu", "quantile", "rate", "serving"]

RATE = "$__rate_interval"


def serving(extra: str = "") -> str:
    """Label matchers for the selected model and model versions (plus any `extra` matchers)."""
    base = 'model=~"$model", model_version=~"$model_version"'
    return "{" + base + (", " + extra if extra else "") + "}"


def gpu() -> str:
    return '{gpu=~"$gpu"}'


def rate(metric: str, matchers: str, by: str = "model_version") -> str:
    """Per-second rate summed by `by` (empty `by`: one total series)."""
    grouping = f" by ({by})" if by else ""
    return f"sum{grouping} (rate({metric}{matchers}[{RATE}]))"


def quantile(q: float, histogram: str, matchers: str, by: str = "model_version") -> str:
    """The q-quantile of a Prometheus histogram over the rate window, per `by` group."""
    return f"histogram_quantile({q}, sum by (le, {by}) (rate({histogram}_bucket{matchers}[{RATE}])))"
