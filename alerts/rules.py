"""Alerting rules as data: what `load_config` builds from a rule file (frozen, hashable)."""

from __future__ import annotations

import hashlib
import json
import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from .signals import Signal

__all__ = [
    "ACTION_TYPES",
    "COLLECT_KINDS",
    "OPS",
    "ActionSpec",
    "Comparison",
    "Condition",
    "Rule",
    "RuleGroup",
]

Comparison = Literal[">", ">=", "<", "<=", "==", "!="]
OPS: Mapping[str, Callable[[float, float], bool]] = {
    ">": operator.gt,
    ">=": operator.ge,
    "<": operator.lt,
    "<=": operator.le,
    "==": operator.eq,
    "!=": operator.ne,
}
ACTION_TYPES = ("snapshot", "rollback", "hot_reload", "failover", "collect")
COLLECT_KINDS = ("version", "any", "failed")  # what the collect action keeps (alerts/actions/collect.py)


@dataclass(frozen=True)
class Condition:
    signal: Signal
    op: Comparison
    threshold: float

    def holds(self, value: float) -> bool:
        return OPS[self.op](value, self.threshold)


@dataclass(frozen=True)
class ActionSpec:
    """An action attached to a rule (or run by hand). `params`: `requests` (snapshot),
    `version` (hot_reload), `backup` (failover), `n` and `kind` (collect)."""

    type: str
    params: tuple[tuple[str, str | int], ...] = ()
    cooldown_s: float = 600.0
    daily_cap: int = 3
    dry_run: bool = False

    def param(self, name: str) -> str | int | None:
        return dict(self.params).get(name)

    def to_json(self) -> dict[str, Any]:
        return {
            "type": self.type,
            "params": dict(self.params),
            "cooldown_s": self.cooldown_s,
            "daily_cap": self.daily_cap,
            "dry_run": self.dry_run,
        }

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> ActionSpec:
        return cls(
            type=str(obj["type"]),
            params=tuple(sorted(dict(obj.get("params", {})).items())),
            cooldown_s=float(obj.get("cooldown_s", 600.0)),
            daily_cap=int(obj.get("daily_cap", 3)),
            dry_run=bool(obj.get("dry_run", False)),
        )


@dataclass(frozen=True)
class Rule:
    name: str  # the alertname
    condition: Condition
    by: tuple[str, ...] = ()
    while_: tuple[Condition, ...] = ()  # guards: each must hold for some label set
    for_s: float = 0.0
    keep_firing_for_s: float = 0.0
    labels: tuple[tuple[str, str], ...] = ()
    annotations: tuple[tuple[str, str], ...] = ()
    actions: tuple[ActionSpec, ...] = ()
    group: str = "default"
    line: int | None = field(default=None, compare=False)

    @property
    def key(self) -> str:
        """Stable identity: the alertname and the rule's own labels (a warning and a
        critical rule may share a name)."""
        raw = json.dumps([self.name, sorted(self.labels)], separators=(",", ":"))
        return f"{self.name}:{hashlib.sha256(raw.encode()).hexdigest()[:12]}"

    @property
    def severity(self) -> str:
        return dict(self.labels).get("severity", "warning")


@dataclass(frozen=True)
class RuleGroup:
    name: str
    interval_s: float
    rules: tuple[Rule, ...]
