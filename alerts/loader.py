"""Loading a rule file: `groups:` of rules, and optionally `slos:` (alerts/slo.py),
`receivers:`, `route:` and `inhibit_rules:`. Anything wrong is refused with `RuleParseError(file, line, reason)`."""

from __future__ import annotations

from collections.abc import Mapping
from importlib import resources
from pathlib import Path

from infersight.collectors import DURATION_BUCKETS

from ._load_notify import parse_inhibit_rules, parse_receivers, parse_route
from ._load_rules import parse_groups
from ._yaml import Source, load_marked
from .config import AlertConfig
from .errors import RuleParseError
from .slo import SLO_GROUP, parse_slos, slo_rules

__all__ = ["DEFAULT_RULES", "load_config", "parse_config"]

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
