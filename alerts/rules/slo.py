"""Service level objectives and their error budgets, declared in the rule file:

```yaml
slos:
  - {name: banking-latency, model_version: mixtral_banking_fp32-v1.0, objective: 0.999,
     threshold_ms: 100, window: 30d}
  - {name: availability, objective: 0.995, window: 30d}        # server errors only
  - {name: fast-latency, path: fast, objective: 0.999, threshold_ms: 100, window: 30d}
```

An SLO with `threshold_ms` is a latency SLO (a request is bad when it takes longer; a request
whose client hung up, `cancelled`, is in no latency SLO: its duration is the client's); without,
an availability SLO (a request is bad when it fails with a server error: `client_error`,
`cancelled` and the client-caused errors of `CLIENT_ERROR_TYPES` never count). `model`, `model_version` and `path`
select the requests it covers. `path` matches the `path` that SLA routing (the embedded
runtime's `routing:`) puts on requests.

A request the length breaker shed (503, outcome `shed`) misses every SLO that covers it, a
latency SLO and an availability one: it was served neither in time nor at all (yet it is no
server error, so error-rate alerts do not count it). The ledger counts it so, and so do the
exported Prometheus rules: without `path`, from the collectors' histogram (a shed request
is in it with its zero duration, so it is taken out of the good ones) and
`infersight_client_outcomes_total{outcome="shed"}`; with `path`, from the routing metrics
that carry the label (`infersight_route_request_duration_seconds{path}`, shed requests
not in it, and `infersight_route_requests_total{path, reason="shed"}`,
`infersight_route_request_errors_total{path}`), which have no model labels: there a path
SLO covers the path's requests whatever the version.

Each SLO becomes multi-window, multi-burn-rate alerts (the SRE workbook's, chapter 5):
a page when both the 1h and the 5m burn rate exceed 14.4 (2% of a 30-day budget in an
hour), a page when both the 6h and the 30m burn rate exceed 6 (5% in six hours), and a
ticket when both the 3d and the 6h burn rate exceed 1 (only for SLO windows of 3d or more).
The burn rate is the bad share of requests divided by the budget (1 - objective). These are
ordinary `Rule`s on the `slo_burn_rate` signal, evaluated by the same `Evaluator` as any
other, and exported to Prometheus as recording rules plus alert rules (`slo_recording_rules`).

The SLO ledger (`SLOLedger`): good and bad requests per SLO, counted in one-minute buckets over the
SLO's window, so the built-in evaluator reads burn rates over 5m .. 30d without Prometheus
(the collectors' sketches keep only an hour), and `/metrics` exports each SLO's error budget
remaining, attainment and burn rates.

It counts what this process observed since it started: after a restart the long windows
refill from zero (a Prometheus server running the exported rules keeps the long history).
Memory is bounded: at most window / bucket buckets per SLO (43,200 for 30d).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from infersight.monitor.outcomes import CANCELLED, REFUSED_BY_SERVICE, client_error_names, is_server_error
from infersight.monitor.records import InferenceRecord
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.utils import floatToGoString

from ..errors import UnknownSignal
from .rules import Condition, MarkedMap, Rule, RuleGroup, Source, format_duration, iter_items, parse_duration
from .signals import Sample, Signal

__all__ = ["BURN_WINDOWS", "CLIENT_ERROR_TYPES", "SLO", "BurnWindow", "SLOLedger", "SLOStatus"]


# Caused by the client, so they never spend an availability budget: the labels, the name an
# SDK user's client raises at a hang-up, and the engine's client-error class names (one
# vocabulary: monitor/outcomes.py).
CLIENT_ERROR_TYPES = client_error_names()
_REFUSED = "|".join(sorted(REFUSED_BY_SERVICE))  # shed (length breaker), overloaded (admission)
SLO_GROUP = "slo"  # the rule group the generated alerts belong to
SELECTOR_LABELS = ("model", "model_version", "path")
_KEYS = {"name", "objective", "threshold_ms", "window", *SELECTOR_LABELS}
_DURATION = "gen_ai_server_request_duration_seconds"
_ROUTE_DURATION = "infersight_route_request_duration_seconds"


@dataclass(frozen=True)
class BurnWindow:
    alert: str  # the generated alert's name
    long_s: float
    short_s: float
    factor: float  # burn rate both windows must exceed
    severity: str


BURN_WINDOWS = (
    BurnWindow("SLOFastBurn", 3600.0, 300.0, 14.4, "critical"),
    BurnWindow("SLOSlowBurn", 21600.0, 1800.0, 6.0, "critical"),
    BurnWindow("SLOBudgetTicket", 259200.0, 21600.0, 1.0, "warning"),
)


@dataclass(frozen=True)
class SLO:
    name: str
    objective: float  # the share of requests that must be good, in (0, 1)
    window_s: float  # the compliance window the budget is counted over
    threshold_s: float | None = None  # None: an availability SLO
    model: str | None = None
    model_version: str | None = None
    path: str | None = None  # SLA routing's path ("fast", "standard")
    line: int | None = None

    @property
    def kind(self) -> Literal["latency", "availability"]:
        return "availability" if self.threshold_s is None else "latency"

    @property
    def budget(self) -> float:
        return round(1.0 - self.objective, 12)  # 0.001 for 0.999, not 0.0010000000000000009

    @property
    def selector(self) -> tuple[tuple[str, str], ...]:
        return tuple((k, v) for k in SELECTOR_LABELS if (v := getattr(self, k)) is not None)

    @property
    def burn_windows(self) -> tuple[BurnWindow, ...]:
        return tuple(w for w in BURN_WINDOWS if w.long_s <= self.window_s)

    def covers(self, labels: dict[str, str]) -> bool:
        return all(labels.get(k) == v for k, v in self.selector)

    def is_bad(self, duration_s: float, error_type: str | None) -> bool:
        if error_type in REFUSED_BY_SERVICE:  # shed or overloaded: served neither in time nor at all
            return True
        if self.threshold_s is not None:
            return duration_s > self.threshold_s
        return is_server_error(error_type)


def _parse_one(src: Source, m: MarkedMap, what: str, buckets: tuple[float, ...]) -> SLO:
    src.only_keys(m, _KEYS, what)
    name = src.string(m, "name", what)
    if not name or not all(c.isalnum() or c in "-_." for c in name):
        src.fail(m.key_lines["name"], f"slo name {name!r} must be letters, digits, '-', '_' or '.'")
    what = f"slo {name!r}"
    objective = src.require(m, "objective", what)
    if isinstance(objective, bool) or not isinstance(objective, int | float) or not 0 < objective < 1:
        src.fail(
            m.key_lines["objective"],
            f"{what}: objective must be a number in (0, 1), e.g. 0.999, got {objective!r}",
        )
    raw_window = src.require(m, "window", what)
    try:
        window_s = parse_duration(str(raw_window))
    except ValueError as exc:
        src.fail(m.key_lines["window"], f"{what}: window: {exc}")
    if window_s < 3600:
        src.fail(m.key_lines["window"], f"{what}: window must be at least 1h (the fast burn's long window)")
    threshold_s = None
    if m.get("threshold_ms") is not None:
        ms = m["threshold_ms"]
        if isinstance(ms, bool) or not isinstance(ms, int | float) or not math.isfinite(ms) or ms <= 0:
            src.fail(
                m.key_lines["threshold_ms"], f"{what}: threshold_ms must be a positive number, got {ms!r}"
            )
        threshold_s = float(ms) / 1000.0
        if not any(math.isclose(threshold_s, b) for b in buckets):
            valid = ", ".join(f"{b * 1000:g}" for b in buckets)
            src.fail(
                m.key_lines["threshold_ms"],
                f"{what}: threshold_ms must be a boundary of the request-duration histogram so "
                f"Prometheus counts it exactly; one of {valid}",
            )
    selector: dict[str, str] = {}
    for key in SELECTOR_LABELS:
        if m.get(key) is not None:
            selector[key] = src.string(m, key, what)
    return SLO(name, float(objective), window_s, threshold_s, line=m.line, **selector)


def parse_slos(src: Source, root: MarkedMap, buckets: tuple[float, ...]) -> tuple[SLO, ...]:
    """The `slos:` list of a rule file (empty when absent); `buckets` are the request-duration
    histogram's boundaries in seconds, which a latency threshold must be one of."""
    if root.get("slos") is None:
        return ()
    seq = src.sequence(root["slos"], root.key_lines["slos"], "slos")
    out: list[SLO] = []
    seen: dict[str, int] = {}
    for i, line, raw in iter_items(seq):
        slo = _parse_one(src, src.mapping(raw, line, f"slos[{i}]"), f"slos[{i}]", buckets)
        if slo.name in seen:
            src.fail(line, f"duplicate slo name {slo.name!r} (first at line {seen[slo.name]})")
        seen[slo.name] = line
        out.append(slo)
    return tuple(out)


def _percent(x: float) -> str:
    return f"{x * 100:g}%"


def slo_rules(slos: tuple[SLO, ...], interval_s: float = 30.0) -> tuple[RuleGroup, ...]:
    """The burn-rate alerts of `slos`, as one rule group (none when there is no SLO)."""
    rules = []
    for slo in slos:
        for w in slo.burn_windows:
            long_s = Signal("slo_burn_rate", window_s=w.long_s, slo=slo.name)
            short_s = Signal("slo_burn_rate", window_s=w.short_s, slo=slo.name)
            long_w, short_w = format_duration(w.long_s), format_duration(w.short_s)
            summary = (
                f"SLO {slo.name} ({_percent(slo.objective)} over {format_duration(slo.window_s)}) burns its "
                f"error budget {{{{ $value | humanize }}}}x over {long_w} (and over {short_w}); "
                f"alert above {w.factor:g}x"
            )
            rules.append(
                Rule(
                    name=w.alert,
                    condition=Condition(long_s, ">", w.factor),
                    while_=(Condition(short_s, ">", w.factor),),
                    labels=tuple(sorted({"severity": w.severity, "slo": slo.name}.items())),
                    annotations=(("summary", summary),),
                    group=SLO_GROUP,
                    line=slo.line,
                )
            )
    return (RuleGroup(SLO_GROUP, interval_s, tuple(rules)),) if rules else ()


# -- Prometheus -------------------------------------------------------------------------------


def burn_rate_record(window_s: float) -> str:
    """The recorded series holding every SLO's burn rate over `window_s` (label `slo`)."""
    return f"infersight_slo:burn_rate:{format_duration(window_s)}"


def error_ratio_promql(slo: SLO, window_s: float) -> str:
    """The bad share of `slo`'s requests over `window_s` (NaN without traffic); a shed
    request is bad, as in the ledger (`SLO.is_bad`)."""
    w = format_duration(window_s)

    def rate(series: str, *extra: str, selector: tuple[tuple[str, str], ...] = slo.selector) -> str:
        matchers = ",".join([f'{k}="{v}"' for k, v in selector] + list(extra))
        return f"sum(rate({series}{{{matchers}}}[{w}]))" if matchers else f"sum(rate({series}[{w}]))"

    le = f'le="{floatToGoString(slo.threshold_s)}"' if slo.threshold_s is not None else ""
    if slo.path is not None:  # the routing metrics: a shed request is in none of the histogram's
        path = (("path", slo.path),)
        shed = rate("infersight_route_requests_total", f'reason=~"{_REFUSED}"', selector=path)
        total = f"({rate(_ROUTE_DURATION + '_count', selector=path)} + ({shed} or vector(0)))"
        if slo.threshold_s is not None:
            return f"(1 - {rate(_ROUTE_DURATION + '_bucket', le, selector=path)} / {total})"
        errors = rate("infersight_route_request_errors_total", selector=path)
        return f"((({errors} or vector(0)) + ({shed} or vector(0))) / {total})"
    # the collectors' series: a shed request is in the histogram (duration 0) and is no error
    shed = rate("infersight_client_outcomes_total", f'outcome=~"{_REFUSED}"')
    total = rate(_DURATION + "_count")
    if slo.threshold_s is not None:
        return f"(1 - ({rate(_DURATION + '_bucket', le)} - ({shed} or vector(0))) / {total})"
    server_errors = 'error_type!~"' + "|".join(CLIENT_ERROR_TYPES) + '"'
    errors = rate("gen_ai_server_request_errors_total", server_errors)
    return f"((({errors} or vector(0)) + ({shed} or vector(0))) / {total})"


def slo_recording_rules(slos: tuple[SLO, ...]) -> list[dict[str, Any]]:
    """Prometheus recording rule groups: each SLO's burn rate over every window its alerts
    read, and its attainment and error budget remaining over its own window."""
    if not slos:
        return []
    rules: list[dict[str, Any]] = []
    for slo in slos:
        labels = {"slo": slo.name}  # copied into each rule: no YAML anchors in the export
        windows = sorted({s for w in slo.burn_windows for s in (w.long_s, w.short_s)})
        for window in windows:
            rules.append({
                "record": burn_rate_record(window),
                "expr": f"{error_ratio_promql(slo, window)} / {slo.budget!r}",
                "labels": dict(labels),
            })  # fmt: skip
        ratio = error_ratio_promql(slo, slo.window_s)
        rules.append(
            {"record": "infersight_slo:attainment:ratio", "expr": f"1 - {ratio}", "labels": dict(labels)}
        )
        rules.append({
            "record": "infersight_slo:error_budget_remaining:ratio",
            "expr": f"1 - {ratio} / {slo.budget!r}",
            "labels": dict(labels),
        })  # fmt: skip
    return [{"name": "infersight_slo_recording", "interval": "30s", "rules": rules}]


@dataclass(frozen=True)
class SLOStatus:
    """One SLO now, over its own window. `attainment` is None before any request."""

    name: str
    kind: str
    objective: float
    window_s: float
    total: int
    bad: int
    attainment: float | None
    budget_remaining: float  # 1 - bad share / budget: 1 untouched, 0 spent, negative overspent
    burn_rates: tuple[tuple[str, float | None], ...]  # (window, burn rate) of its alert windows

    def to_json(self) -> dict[str, object]:
        return {
            "name": self.name,
            "kind": self.kind,
            "objective": self.objective,
            "window": format_duration(self.window_s),
            "total": self.total,
            "bad": self.bad,
            "attainment": self.attainment,
            "error_budget_remaining": self.budget_remaining,
            "burn_rates": dict(self.burn_rates),
        }


class SLOLedger:
    """`observe(record)` for every observed call; a `SignalSource` for `slo_burn_rate`;
    a Prometheus collector (register it in the service's registry)."""

    def __init__(
        self, slos: Sequence[SLO], *, bucket_s: float = 60.0, clock: Callable[[], float] = time.time
    ) -> None:
        self.slos = {s.name: s for s in slos}
        self.bucket_s = bucket_s
        self.clock = clock
        self._lock = threading.Lock()
        # per SLO: bucket index -> [total, bad]
        self._buckets: dict[str, dict[int, list[int]]] = {s.name: {} for s in slos}

    def observe(self, record: InferenceRecord) -> None:
        labels = {"model": record.model, "model_version": record.model_version}
        path = getattr(record, "path", None)  # set by a routing layer; none does yet
        if path is not None:
            labels["path"] = path
        index = int(self.clock() // self.bucket_s)
        with self._lock:
            for slo in self.slos.values():
                if not slo.covers(labels) or (slo.threshold_s is not None and record.error_type == CANCELLED):
                    continue
                buckets = self._buckets[slo.name]
                counts = buckets.get(index)
                if counts is None:
                    counts = buckets[index] = [0, 0]
                    oldest = index - math.ceil(slo.window_s / self.bucket_s)
                    for old in [i for i in buckets if i <= oldest]:
                        del buckets[old]
                counts[0] += 1
                counts[1] += slo.is_bad(record.duration_s, record.error_type)

    def counts(self, name: str, window_s: float) -> tuple[int, int]:
        """(total, bad) of SLO `name` over the last `window_s` (whole buckets, the current one
        included)."""
        first = int(self.clock() // self.bucket_s) - max(1, math.ceil(window_s / self.bucket_s)) + 1
        with self._lock:
            total = bad = 0
            for i, (t, b) in self._buckets[name].items():
                if i >= first:
                    total += t
                    bad += b
        return total, bad

    def burn_rate(self, name: str, window_s: float) -> float | None:
        total, bad = self.counts(name, window_s)
        return None if total == 0 else (bad / total) / self.slos[name].budget

    def status(self, name: str) -> SLOStatus:
        slo = self.slos[name]
        total, bad = self.counts(name, slo.window_s)
        share = bad / total if total else 0.0
        windows = sorted({s for w in slo.burn_windows for s in (w.long_s, w.short_s)})
        return SLOStatus(
            name=name,
            kind=slo.kind,
            objective=slo.objective,
            window_s=slo.window_s,
            total=total,
            bad=bad,
            attainment=1.0 - share if total else None,
            budget_remaining=1.0 - share / slo.budget,
            burn_rates=tuple((format_duration(w), self.burn_rate(name, w)) for w in windows),
        )

    def statuses(self) -> list[SLOStatus]:
        return [self.status(name) for name in self.slos]

    # -- SignalSource -----------------------------------------------------------------------
    def read(self, signal: Signal, by: Sequence[str]) -> Sequence[Sample]:
        if signal.kind != "slo_burn_rate":
            raise UnknownSignal(f"SLOLedger serves slo_burn_rate only, not {signal.kind!r}")
        names = [signal.slo] if signal.slo is not None else list(self.slos)
        out = []
        for name in names:
            if name not in self.slos:
                continue
            rate = self.burn_rate(name, signal.window_s or 0.0)
            if rate is not None:
                out.append(Sample.of(rate, **({"slo": name} if "slo" in by else {})))
        return out

    # -- prometheus_client Collector --------------------------------------------------------
    def collect(self) -> Iterator[Metric]:
        budget = GaugeMetricFamily(
            "infersight_slo_error_budget_remaining_ratio",
            "Share of the SLO's error budget left over its window (1 untouched, 0 spent, <0 overspent)",
            labels=["slo"],
        )
        attainment = GaugeMetricFamily(
            "infersight_slo_attainment_ratio", "Share of the SLO's requests that were good over its window",
            labels=["slo"],
        )  # fmt: skip
        objective = GaugeMetricFamily("infersight_slo_objective_ratio", "The SLO's objective", labels=["slo"])
        burn = GaugeMetricFamily(
            "infersight_slo_burn_rate", "Bad share of requests over the window / error budget",
            labels=["slo", "window"],
        )  # fmt: skip
        for s in self.statuses():
            budget.add_metric([s.name], s.budget_remaining)
            objective.add_metric([s.name], s.objective)
            if s.attainment is not None:
                attainment.add_metric([s.name], s.attainment)
            for window, rate in s.burn_rates:
                if rate is not None:
                    burn.add_metric([s.name, window], rate)
        yield from (budget, attainment, objective, burn)
