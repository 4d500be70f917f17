"""Rules as a Prometheus rule file: each structured signal becomes the PromQL that computes
it from the metrics of docs/architecture.md, so Prometheus + Alertmanager can run the
same rules as the built-in evaluator."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import yaml

from .config import AlertConfig
from .rules import Condition, Rule, format_duration
from .signals import Signal
from .slo import burn_rate_record, slo_recording_rules

__all__ = ["LATENCY_HISTOGRAMS", "PrometheusExport", "export_prometheus", "signal_promql"]

LATENCY_HISTOGRAMS: Mapping[str, str] = {
    "request_duration": "gen_ai_server_request_duration_seconds",
    "ttft": "gen_ai_server_time_to_first_token_seconds",
    "tpot": "gen_ai_server_time_per_output_token_seconds",
    "queue_time": "gen_ai_server_request_queue_time_seconds",
}


def _agg(op: str, by: tuple[str, ...], inner: str) -> str:
    return f"{op} by ({', '.join(by)}) ({inner})" if by else f"{op}({inner})"


def _latency(s: Signal, by: tuple[str, ...]) -> str:
    assert s.metric is not None and s.window_s is not None
    rate = f"rate({LATENCY_HISTOGRAMS[s.metric]}_bucket[{format_duration(s.window_s)}])"
    return f"histogram_quantile({s.quantile:g}, sum by ({', '.join(('le', *by))}) ({rate}))"


def _error_rate(s: Signal, by: tuple[str, ...]) -> str:
    assert s.window_s is not None
    w = format_duration(s.window_s)
    errors = _agg("sum", by, f"rate(gen_ai_server_request_errors_total[{w}])")
    total = _agg("sum", by, f"rate(gen_ai_server_request_duration_seconds_count[{w}])")
    expr = f"({errors} / {total})"
    if s.min_requests:
        count = _agg("sum", by, f"increase(gen_ai_server_request_duration_seconds_count[{w}])")
        expr = f"({expr} and {count} >= {s.min_requests})"
    return expr


def _memory_slope(s: Signal, by: tuple[str, ...]) -> str:
    assert s.window_s is not None
    metric = (
        "infersight_gpu_memory_used_bytes"
        if s.resource == "gpu"
        else "infersight_process_resident_memory_bytes"
    )
    return f"({_agg('sum', by, f'deriv({metric}[{format_duration(s.window_s)}])')} * 60)"


_PROMQL: Mapping[str, Callable[[Signal, tuple[str, ...]], str]] = {
    "latency_quantile": _latency,
    "error_rate": _error_rate,
    "request_rate": lambda s, by: _agg(
        "sum", by, f"rate(gen_ai_server_request_duration_seconds_count[{format_duration(s.window_s or 0)}])"
    ),
    "queue_depth": lambda s, by: _agg("sum", by, "gen_ai_server_requests_waiting"),
    "gpu_sm_activity": lambda s, by: _agg("avg", by, "infersight_gpu_sm_activity_ratio"),
    "gpu_memory_ratio": lambda s, by: (
        f"({_agg('sum', by, 'infersight_gpu_memory_used_bytes')} / {_agg('sum', by, 'infersight_gpu_memory_total_bytes')})"
    ),
    "memory_slope": _memory_slope,
    "drift_p_value": lambda s, by: _agg("min", by, f'infersight_drift_p_value{{field="{s.field}"}}'),
    "length_drift": lambda s, by: _agg("min", by, f'infersight_length_drift_p_value{{field="{s.field}"}}'),
    "relevance": lambda s, by: _agg("avg", by, "infersight_relevance_mean"),
    "dead_letters": lambda s, by: _agg("max", by, "infersight_outbox_dead_letters"),
    "slo_burn_rate": lambda s, by: _agg("max", by, f'{burn_rate_record(s.window_s or 0)}{{slo="{s.slo}"}}'),
}


def signal_promql(signal: Signal, by: tuple[str, ...] = ()) -> str | None:
    """The PromQL computing `signal` split by `by`, or None when Prometheus cannot."""
    build = _PROMQL.get(signal.kind)
    return None if build is None else build(signal, by)


def _number(x: float) -> str:
    return str(int(x)) if x.is_integer() and abs(x) < 1e15 else repr(x)


def _condition(c: Condition, by: tuple[str, ...]) -> str | None:
    expr = signal_promql(c.signal, by)
    return None if expr is None else f"{expr} {c.op} {_number(c.threshold)}"


def rule_expr(rule: Rule) -> str | None:
    expr = _condition(rule.condition, rule.by)
    if expr is None:
        return None
    for guard in rule.while_:
        g = _condition(guard, ())
        if g is None:
            return None
        expr = f"({expr}) and on() ({g})"
    return expr


@dataclass(frozen=True)
class PrometheusExport:
    text: str  # the Prometheus rule file (YAML)
    exported: tuple[str, ...]  # rule keys written
    skipped: tuple[str, ...]  # rule keys with no PromQL form
    recorded: int = 0  # recording rules written (the SLOs' burn rates and budgets)


def export_prometheus(config: AlertConfig) -> PrometheusExport:
    groups: list[dict[str, Any]] = slo_recording_rules(config.slos)
    recorded = sum(len(g["rules"]) for g in groups)
    exported, skipped = [], []
    for group in config.groups:
        rules = []
        for rule in group.rules:
            expr = rule_expr(rule)
            if expr is None:
                skipped.append(rule.key)
                continue
            out: dict[str, Any] = {"alert": rule.name, "expr": expr}
            if rule.for_s:
                out["for"] = format_duration(rule.for_s)
            if rule.keep_firing_for_s:
                out["keep_firing_for"] = format_duration(rule.keep_firing_for_s)
            if rule.labels:
                out["labels"] = dict(rule.labels)
            if rule.annotations:
                out["annotations"] = dict(rule.annotations)
            rules.append(out)
            exported.append(rule.key)
        if rules:
            groups.append({"name": group.name, "interval": format_duration(group.interval_s), "rules": rules})
    header = f"# Generated by `infersight rules export` from {config.file}. Do not edit: edit the source.\n"
    body = yaml.safe_dump({"groups": groups}, sort_keys=False, width=1000, allow_unicode=True)
    return PrometheusExport(header + body, tuple(exported), tuple(skipped), recorded)
