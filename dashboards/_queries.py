"""PromQL fragments shared by the dashboard rows, all filtered by the dashboard's variables."""

from __future__ import annotations

__all__ = ["RATE", "gpu", "machine", "quantile", "rate", "serving", "zero_if_empty"]

RATE = "$__rate_interval"


def serving(extra: str = "") -> str:
    """Label matchers for the selected instances, model and model versions (plus any `extra`)."""
    base = 'instance=~"$instance", model=~"$model", model_version=~"$model_version"'
    return "{" + base + (", " + extra if extra else "") + "}"


def gpu() -> str:
    return '{instance=~"$instance", gpu=~"$gpu"}'


def machine() -> str:
    """The selected instances (the process and machine metrics of each replica)."""
    return '{instance=~"$instance"}'


def zero_if_empty(label: str) -> str:
    """To append to a query: `or` one 0 series labelled `label="none"` when the query has no
    series at all, so a counter nothing has incremented yet shows 0, not "No data"."""
    return f' or on() label_replace(vector(0), "{label}", "none", "", "")'


def rate(metric: str, matchers: str, by: str = "model_version") -> str:
    """Per-second rate summed by `by` (empty `by`: one total series)."""
    grouping = f" by ({by})" if by else ""
    return f"sum{grouping} (rate({metric}{matchers}[{RATE}]))"


def quantile(q: float, histogram: str, matchers: str, by: str = "model_version") -> str:
    """The q-quantile of a Prometheus histogram over the rate window, per `by` group."""
    return f"histogram_quantile({q}, sum by (le, {by}) (rate({histogram}_bucket{matchers}[{RATE}])))"
