"""The building blocks of the dashboard: builders for Grafana panel JSON (classic dashboard
model), the layout that places panels on Grafana's 24-column grid and numbers them (rows of
sections, left to right), and the PromQL fragments the rows share, all filtered by the
dashboard's variables.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "DATASOURCE",
    "GRID_COLUMNS",
    "RATE",
    "Section",
    "Target",
    "gpu",
    "heatmap",
    "lay_out",
    "machine",
    "quantile",
    "rate",
    "row",
    "serving",
    "stat",
    "state_timeline",
    "timeseries",
    "value_text",
    "zero_if_empty",
]


DATASOURCE: dict[str, str] = {"type": "prometheus", "uid": "${datasource}"}

Json = dict[str, Any]


@dataclass(frozen=True)
class Target:
    """One PromQL query of a panel; `legend` uses Grafana's `{{label}}` templating."""

    expr: str
    legend: str = ""
    fmt: str = "time_series"  # "heatmap" for bucket series drawn as a heatmap
    instant: bool = False  # the value now (a stat of what is true now), not a range over the panel's time

    def to_json(self, ref_id: str) -> Json:
        return {
            "datasource": dict(DATASOURCE),
            "editorMode": "code",
            "expr": self.expr,
            "format": self.fmt,
            "legendFormat": self.legend or "__auto",
            "instant": self.instant,
            "range": not self.instant,
            "refId": ref_id,
        }


def _targets(targets: Sequence[Target]) -> list[Json]:
    return [t.to_json(chr(ord("A") + i)) for i, t in enumerate(targets)]


def _base(
    kind: str, title: str, description: str, targets: Sequence[Target], width: int, height: int
) -> Json:
    return {
        "type": kind,
        "title": title,
        "description": description,
        "datasource": dict(DATASOURCE),
        "targets": _targets(targets),
        "gridPos": {"h": height, "w": width, "x": 0, "y": 0},
    }


def _thresholds(steps: Sequence[tuple[float | None, str]]) -> Json:
    return {"mode": "absolute", "steps": [{"color": color, "value": value} for value, color in steps]}


def timeseries(
    title: str,
    targets: Sequence[Target],
    *,
    unit: str,
    description: str = "",
    width: int = 12,
    height: int = 8,
    min_value: float | None = None,
    max_value: float | None = None,
    log_scale: bool = False,
    threshold: float | None = None,
    stack: bool = False,
) -> Json:
    """A line chart. `threshold` draws a dashed red line at that value (an SLA, alpha)."""
    custom: Json = {
        "drawStyle": "line",
        "lineWidth": 2,
        "fillOpacity": 10,
        "showPoints": "never",
        "spanNulls": False,
        "axisSoftMin": min_value,
        "scaleDistribution": {"type": "log", "log": 10} if log_scale else {"type": "linear"},
        "stacking": {"mode": "normal" if stack else "none", "group": "A"},
        "thresholdsStyle": {"mode": "dashed" if threshold is not None else "off"},
    }
    defaults: Json = {"unit": unit, "custom": custom, "color": {"mode": "palette-classic"}}
    steps: list[tuple[float | None, str]] = [(None, "green")]
    if threshold is not None:
        steps.append((threshold, "red"))
    defaults["thresholds"] = _thresholds(steps)
    if min_value is not None:
        defaults["min"] = min_value
    if max_value is not None:
        defaults["max"] = max_value
    panel = _base("timeseries", title, description, targets, width, height)
    panel["fieldConfig"] = {"defaults": defaults, "overrides": []}
    panel["options"] = {
        "legend": {
            "displayMode": "table",
            "placement": "bottom",
            "showLegend": True,
            "calcs": ["lastNotNull", "max"],
        },
        "tooltip": {"mode": "multi", "sort": "desc"},
    }
    return panel


def stat(
    title: str,
    targets: Sequence[Target],
    *,
    unit: str,
    description: str = "",
    width: int = 4,
    height: int = 4,
    text_mode: str = "value",
    steps: Sequence[tuple[float | None, str]] = ((None, "green"),),
    mappings: Sequence[Json] = (),
) -> Json:
    """A single big number (or, with text_mode="name", the series name: e.g. the serving version)."""
    panel = _base("stat", title, description, targets, width, height)
    panel["fieldConfig"] = {
        "defaults": {"unit": unit, "thresholds": _thresholds(steps), "mappings": list(mappings)},
        "overrides": [],
    }
    panel["options"] = {
        "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
        "colorMode": "background" if len(steps) > 1 else "value",
        "graphMode": "none",
        "textMode": text_mode,
        "justifyMode": "auto",
        "orientation": "auto",
    }
    return panel


def heatmap(
    title: str, target: Target, *, unit: str, description: str = "", width: int = 12, height: int = 8
) -> Json:
    """A heatmap of pre-bucketed Prometheus histogram series (`format: heatmap`, no re-bucketing)."""
    panel = _base("heatmap", title, description, [target], width, height)
    panel["fieldConfig"] = {
        "defaults": {"unit": unit, "custom": {"hideFrom": {"legend": False}}},
        "overrides": [],
    }
    panel["options"] = {
        "calculate": False,
        "cellGap": 1,
        "color": {"mode": "scheme", "scheme": "Oranges", "steps": 64, "exponent": 0.5, "fill": "dark-orange"},
        "yAxis": {"axisPlacement": "left", "unit": unit},
        "rowsFrame": {"layout": "auto"},
        "tooltip": {"mode": "single", "yHistogram": True, "showColorScale": True},
        "legend": {"show": True},
        "filterValues": {"le": 1e-9},
    }
    return panel


def state_timeline(
    title: str,
    targets: Sequence[Target],
    *,
    description: str = "",
    width: int = 12,
    height: int = 6,
    mappings: Sequence[Json] = (),
) -> Json:
    """Discrete states over time (e.g. drift detected 0/1), coloured through value mappings."""
    panel = _base("state-timeline", title, description, targets, width, height)
    panel["fieldConfig"] = {
        "defaults": {
            "unit": "none",
            "mappings": list(mappings),
            "custom": {"fillOpacity": 80, "lineWidth": 0},
        },
        "overrides": [],
    }
    panel["options"] = {"showValue": "never", "mergeValues": True, "rowHeight": 0.8, "alignValue": "left"}
    return panel


def row(title: str) -> Json:
    """A row header; rows are never collapsed so every panel sits at the top level of `panels`."""
    return {
        "type": "row",
        "title": title,
        "collapsed": False,
        "panels": [],
        "gridPos": {"h": 1, "w": 24, "x": 0, "y": 0},
    }


def value_text(mapping: dict[str, tuple[str, str]]) -> Json:
    """A value mapping {"0": ("off", "red")} shown as text with a colour."""
    return {
        "type": "value",
        "options": {
            value: {"text": text, "color": color, "index": i}
            for i, (value, (text, color)) in enumerate(mapping.items())
        },
    }


GRID_COLUMNS = 24


@dataclass(frozen=True)
class Section:
    """A titled row and the panels under it, in reading order (each carries its own w and h)."""

    title: str
    panels: Sequence[dict[str, Any]]


def lay_out(sections: Sequence[Section]) -> list[dict[str, Any]]:
    """Return new panel dicts with unique ids from 1 and non-overlapping gridPos.

    Panels wrap to the next line when the 24 columns are full; a line is as tall as
    its tallest panel. Each section starts with a row header on its own line.
    """
    out: list[dict[str, Any]] = []
    y = 0
    next_id = 1
    for section in sections:
        header = row(section.title)
        header["id"] = next_id
        header["gridPos"] = {"h": 1, "w": GRID_COLUMNS, "x": 0, "y": y}
        out.append(header)
        next_id += 1
        y += 1
        x = 0
        line_height = 0
        for template in section.panels:
            panel = dict(template)
            w = int(template["gridPos"]["w"])
            h = int(template["gridPos"]["h"])
            if not 0 < w <= GRID_COLUMNS:
                raise ValueError(f"panel {template.get('title')!r}: width {w} outside 1..{GRID_COLUMNS}")
            if x + w > GRID_COLUMNS:
                y += line_height
                x, line_height = 0, 0
            panel["gridPos"] = {"h": h, "w": w, "x": x, "y": y}
            panel["id"] = next_id
            next_id += 1
            out.append(panel)
            x += w
            line_height = max(line_height, h)
        y += line_height
    return out


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
