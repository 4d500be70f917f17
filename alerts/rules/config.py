"""The rule file as a whole.

Loading it into `AlertConfig`, everything one file holds: `groups:` of rules, and
optionally `slos:` (slo.py), `receivers:`, `route:` and `inhibit_rules:` (Alertmanager's
names and meanings). Anything wrong is refused with `RuleParseError(file, line, reason)`;
a receiver whose secret or URL comes from an unset environment variable is kept, disabled.

Exporting it as a Prometheus rule file (`export_prometheus`): each structured signal
becomes the PromQL that computes it from the metrics of docs/architecture.md, so
Prometheus + Alertmanager can run the same rules as the built-in evaluator.
"""

from __future__ import annotations

import base64
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from infersight.collectors import DURATION_BUCKETS

from ..errors import InvalidMatcher, RuleParseError
from ..notify.matchers import (
    DEFAULT_PAGERDUTY_URL,
    InhibitRule,
    Matcher,
    ReceiverConfig,
    Route,
    parse_matcher,
)
from ..notify.receivers import url_problem
from .rules import (
    Condition,
    MarkedMap,
    Rule,
    RuleGroup,
    Source,
    format_duration,
    iter_items,
    load_marked,
    parse_duration,
    parse_groups,
)
from .signals import Signal
from .slo import SLO, SLO_GROUP, burn_rate_record, parse_slos, slo_recording_rules, slo_rules

__all__ = [
    "DEFAULT_RULES",
    "LATENCY_HISTOGRAMS",
    "AlertConfig",
    "PrometheusExport",
    "export_prometheus",
    "load_config",
    "parse_config",
    "parse_inhibit_rules",
    "parse_receivers",
    "parse_route",
    "signal_promql",
]


@dataclass(frozen=True)
class AlertConfig:
    file: str
    groups: tuple[RuleGroup, ...]
    receivers: Mapping[str, ReceiverConfig] = field(default_factory=dict)
    route: Route | None = None
    inhibit_rules: tuple[InhibitRule, ...] = ()
    slos: tuple[SLO, ...] = ()  # their burn-rate alerts are in `groups` (group "slo")

    @property
    def rules(self) -> tuple[Rule, ...]:
        return tuple(r for g in self.groups for r in g.rules)

    def rule(self, key_or_name: str) -> Rule:
        for r in self.rules:
            if key_or_name in (r.key, r.name):
                return r
        raise KeyError(key_or_name)


_TYPES = ("pagerduty", "webhook", "slack")
_RECEIVER_KEYS = {
    "url",
    "url_env",
    "routing_key",
    "routing_key_env",
    "secret",
    "secret_env",
    "send_resolved",
    "timeout",
    "source",
}


def _from_env(src: Source, m: MarkedMap, key: str, env: Mapping[str, str]) -> tuple[str | None, str | None]:
    """(value, why missing) for `key` given inline or as `key_env`."""
    if key in m and f"{key}_env" in m:
        src.fail(m.key_lines[key], f"give {key} or {key}_env, not both")
    if f"{key}_env" in m:
        var = src.string(m, f"{key}_env", "receiver")
        value = env.get(var)
        return (value, None) if value else (None, f"environment variable {var} is not set")
    if key in m:
        return src.string(m, key, "receiver"), None
    return None, None


def _check_whsec(src: Source, line: int, secret: str) -> None:
    if not secret.startswith("whsec_"):
        src.fail(line, "webhook secret must look like whsec_<base64> (Standard Webhooks)")
    try:
        if not base64.b64decode(secret.removeprefix("whsec_"), validate=True):
            raise ValueError("empty")
    except ValueError:
        src.fail(line, "webhook secret is not whsec_ followed by base64")


def _receiver(src: Source, name: str, kind: str, m: MarkedMap, env: Mapping[str, str]) -> ReceiverConfig:
    what = f"receiver {name!r} ({kind})"
    src.only_keys(m, _RECEIVER_KEYS, what)
    url, url_missing = _from_env(src, m, "url", env)
    if url is None and url_missing is None:
        if kind != "pagerduty":
            src.fail(m.line, f"{what} needs url or url_env")
        url = DEFAULT_PAGERDUTY_URL
    problem = None if url is None else url_problem(url)
    if problem is not None:
        line = m.key_lines.get("url", m.key_lines.get("url_env", m.line))
        src.fail(line, f"{what}: {problem}" + (" (from url_env)" if "url_env" in m else ""))
    secret_key = {"pagerduty": "routing_key", "webhook": "secret", "slack": ""}[kind]
    secret, secret_missing = _from_env(src, m, secret_key, env) if secret_key else (None, None)
    for other in ("routing_key", "secret"):
        if other != secret_key and (other in m or f"{other}_env" in m):
            src.fail(m.key_lines.get(other, m.key_lines.get(f"{other}_env")), f"{what} takes no {other}")
    if secret_key and secret is None and secret_missing is None:
        src.fail(m.line, f"{what} needs {secret_key} or {secret_key}_env")
    if kind == "webhook" and secret is not None:
        _check_whsec(src, m.key_lines.get("secret", m.key_lines.get("secret_env", m.line)), secret)
    send_resolved = m.get("send_resolved", True)
    if not isinstance(send_resolved, bool):
        src.fail(m.key_lines["send_resolved"], "send_resolved must be true or false")
    timeout = parse_duration(str(m["timeout"])) if "timeout" in m else 10.0
    return ReceiverConfig(
        name=name,
        type=kind,  # type: ignore[arg-type]
        url=url or "",
        secret=secret,
        send_resolved=send_resolved,
        timeout_s=timeout,
        source=str(m.get("source", "infersight")),
        disabled_reason=url_missing or secret_missing,
    )


def parse_receivers(
    src: Source, root: MarkedMap, env: Mapping[str, str] | None = None
) -> dict[str, ReceiverConfig]:
    env = os.environ if env is None else env
    out: dict[str, ReceiverConfig] = {}
    if root.get("receivers") is None:
        return out
    for i, line, raw in iter_items(src.sequence(root["receivers"], root.key_lines["receivers"], "receivers")):
        m = src.mapping(raw, line, f"receivers[{i}]")
        src.only_keys(m, {"name", *_TYPES}, f"receivers[{i}]")
        name = src.string(m, "name", f"receivers[{i}]")
        if name in out:
            src.fail(m.key_lines["name"], f"duplicate receiver {name!r}")
        kinds = [k for k in _TYPES if k in m]
        if len(kinds) != 1:
            src.fail(line, f"receiver {name!r} needs exactly one of {', '.join(_TYPES)}")
        body = src.mapping(m[kinds[0]], m.key_lines[kinds[0]], f"receiver {name!r}")
        out[name] = _receiver(src, name, kinds[0], body, env)
    return out


def _matchers(src: Source, m: MarkedMap, key: str, what: str) -> tuple[Matcher, ...]:
    if m.get(key) is None:
        return ()
    out = []
    for _, line, text in iter_items(src.sequence(m[key], m.key_lines[key], f"{what}.{key}")):
        try:
            out.append(parse_matcher(str(text)))
        except InvalidMatcher as exc:
            src.fail(line, str(exc))
    return tuple(out)


def _label_list(src: Source, m: MarkedMap, key: str, what: str, default: tuple[str, ...]) -> tuple[str, ...]:
    if m.get(key) is None:
        return default
    seq = src.sequence(m[key], m.key_lines[key], f"{what}.{key}")
    for _, line, item in iter_items(seq):
        if not isinstance(item, str):
            src.fail(line, f"{what}.{key} items must be label names")
    return tuple(seq)


def parse_route(
    src: Source, m: Any, line: int, receivers: Mapping[str, ReceiverConfig], parent: Route | None = None
) -> Route:
    what = "route"
    r = src.mapping(m, line, what)
    src.only_keys(
        r,
        {
            "receiver",
            "matchers",
            "group_by",
            "group_wait",
            "group_interval",
            "repeat_interval",
            "continue",
            "routes",
        },
        what,
    )
    if parent is None or "receiver" in r:
        receiver = src.string(r, "receiver", what)
        if receiver not in receivers:
            src.fail(
                r.key_lines["receiver"],
                f"unknown receiver {receiver!r} (defined: {', '.join(receivers) or 'none'})",
            )
    else:
        receiver = parent.receiver

    def dur(key: str, inherited: float) -> float:
        if key not in r:
            return inherited
        try:
            return parse_duration(str(r[key]))
        except ValueError as exc:
            src.fail(r.key_lines[key], f"{key}: {exc}")

    base = parent or Route(receiver)
    route = Route(
        receiver=receiver,
        matchers=_matchers(src, r, "matchers", what),
        group_by=_label_list(src, r, "group_by", what, base.group_by),
        group_wait_s=dur("group_wait", base.group_wait_s),
        group_interval_s=dur("group_interval", base.group_interval_s),
        repeat_interval_s=dur("repeat_interval", base.repeat_interval_s),
        continue_=bool(r.get("continue", False)),
    )
    if route.group_interval_s <= 0:
        src.fail(r.key_lines.get("group_interval", r.line), "group_interval must be positive")
    children = []
    if r.get("routes") is not None:
        for _, cline, child in iter_items(src.sequence(r["routes"], r.key_lines["routes"], "routes")):
            children.append(parse_route(src, child, cline, receivers, route))
    return Route(**{**route.__dict__, "routes": tuple(children)})


def parse_inhibit_rules(src: Source, root: MarkedMap) -> tuple[InhibitRule, ...]:
    if root.get("inhibit_rules") is None:
        return ()
    out = []
    seq = src.sequence(root["inhibit_rules"], root.key_lines["inhibit_rules"], "inhibit_rules")
    for i, line, raw in iter_items(seq):
        m = src.mapping(raw, line, f"inhibit_rules[{i}]")
        what = f"inhibit_rules[{i}]"
        src.only_keys(m, {"source_matchers", "target_matchers", "equal"}, what)
        source, target = (
            _matchers(src, m, "source_matchers", what),
            _matchers(src, m, "target_matchers", what),
        )
        if not source or not target:
            src.fail(line, f"{what} needs source_matchers and target_matchers")
        out.append(InhibitRule(source, target, _label_list(src, m, "equal", what, ())))
    return tuple(out)


DEFAULT_RULES = "default_rules.yaml"


def parse_config(text: str, file: str = "<rules>", *, env: Mapping[str, str] | None = None) -> AlertConfig:
    src = Source(file)
    root = src.mapping(load_marked(text, file), 1, "the rule file")
    src.only_keys(root, {"groups", "receivers", "route", "inhibit_rules", "slos"}, "the rule file")
    groups = parse_groups(src, root)
    slos = parse_slos(src, root, DURATION_BUCKETS)
    if any(g.name == SLO_GROUP for g in groups) and slos:
        src.fail(root.key_lines["groups"], f"group name {SLO_GROUP!r} is reserved for the alerts of `slos:`")
    names = {s.name for s in slos}
    for rule in (r for g in groups for r in g.rules):
        for c in (rule.condition, *rule.while_):
            if c.signal.kind == "slo_burn_rate" and c.signal.slo not in names:
                src.fail(rule.line, f"rule {rule.name!r}: slo {c.signal.slo!r} is not declared under slos:")
    groups += slo_rules(slos)
    receivers = parse_receivers(src, root, env)
    route = None
    if root.get("route") is not None:
        route = parse_route(src, root["route"], root.key_lines["route"], receivers)
    elif receivers:
        src.fail(root.key_lines["receivers"], "receivers are defined but no route sends alerts to them")
    return AlertConfig(file, groups, receivers, route, parse_inhibit_rules(src, root), slos)


def load_config(path: str | Path | None = None, *, env: Mapping[str, str] | None = None) -> AlertConfig:
    """The rule file at `path`, or the default rule set shipped with infersight."""
    if path is None:
        text = resources.files("infersight.alerts").joinpath(DEFAULT_RULES).read_text(encoding="utf-8")
        return parse_config(text, DEFAULT_RULES, env=env)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise RuleParseError(str(path), None, f"cannot read: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise RuleParseError(str(path), None, "not UTF-8 text") from exc
    return parse_config(text, str(path), env=env)


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
