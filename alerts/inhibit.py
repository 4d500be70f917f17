"""Inhibition as in Alertmanager: a firing source alert mutes target alerts that share
the values of the `equal` labels (a missing label equals a missing label)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from .matchers import InhibitRule, matches_all

__all__ = ["inhibited"]


def inhibited(
    labels: Mapping[str, str],
    firing: Sequence[Mapping[str, str]],
    rules: Sequence[InhibitRule],
) -> bool:
    """Whether an alert with `labels` is muted by one of the `firing` alerts' label sets."""
    for rule in rules:
        if not matches_all(rule.target_matchers, labels):
            continue
        for source in firing:
            if source is labels or dict(source) == dict(labels):
                continue
            if not matches_all(rule.source_matchers, source):
                continue
            if all(source.get(name, "") == labels.get(name, "") for name in rule.equal):
                return True
    return False
