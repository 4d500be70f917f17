"""Notification routing, receivers and inhibition, with Alertmanager's names and meanings,
and `AlertConfig`, everything one rule file holds."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Literal

from .matchers import Matcher, matches_all
from .rules import Rule, RuleGroup
from .slo import SLO

__all__ = [
    "DEFAULT_PAGERDUTY_URL",
    "AlertConfig",
    "InhibitRule",
    "ReceiverConfig",
    "ReceiverType",
    "Route",
]

ReceiverType = Literal["pagerduty", "webhook", "slack"]
DEFAULT_PAGERDUTY_URL = "https://events.pagerduty.com/v2/enqueue"


@dataclass(frozen=True)
class ReceiverConfig:
    """Where notifications go. `secret` is the PagerDuty routing key or the webhook's
    `whsec_...` signing secret. A receiver whose secret or URL comes from an unset
    environment variable is kept but `disabled_reason` says why nothing is sent."""

    name: str
    type: ReceiverType
    url: str
    secret: str | None = None
    send_resolved: bool = True
    timeout_s: float = 10.0
    source: str = "infersight"  # PagerDuty payload.source
    disabled_reason: str | None = None

    @property
    def enabled(self) -> bool:
        return self.disabled_reason is None


@dataclass(frozen=True)
class Route:
    receiver: str
    matchers: tuple[Matcher, ...] = ()
    group_by: tuple[str, ...] = ("alertname",)
    group_wait_s: float = 30.0
    group_interval_s: float = 300.0
    repeat_interval_s: float = 14400.0
    continue_: bool = False
    routes: tuple[Route, ...] = ()

    def match(self, labels: Mapping[str, str], path: str = "0") -> Iterator[tuple[str, Route]]:
        """The routes an alert with `labels` goes to, depth first, as (path, route):
        the deepest matching child, else this route (Alertmanager's tree walk)."""
        if not matches_all(self.matchers, labels):
            return
        found = False
        for i, child in enumerate(self.routes):
            hits = list(child.match(labels, f"{path}.{i}"))
            if hits:
                found = True
                yield from hits
                if not child.continue_:
                    break
        if not found:
            yield path, self


@dataclass(frozen=True)
class InhibitRule:
    """Alerts matching `target_matchers` are muted while an alert matching
    `source_matchers` fires with the same values of the `equal` labels."""

    source_matchers: tuple[Matcher, ...]
    target_matchers: tuple[Matcher, ...]
    equal: tuple[str, ...] = ()


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
