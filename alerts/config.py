"""`AlertConfig`: everything one rule file holds."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from .matchers import InhibitRule, ReceiverConfig, Route
from .rules import Rule, RuleGroup
from .slo import SLO

__all__ = ["AlertConfig"]

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
