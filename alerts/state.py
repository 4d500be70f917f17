"""The life of one alert, as Prometheus runs it: inactive → pending → firing → resolved.

`step` is a pure function of the previous state, this evaluation's outcome and the
rule's `for` / `keep_firing_for`; the evaluator persists what it returns.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

__all__ = ["ActiveAlert", "AlertState", "Transition", "episode_id", "fingerprint", "step"]

AlertState = Literal["inactive", "pending", "firing", "resolved"]


def fingerprint(labels: Mapping[str, str]) -> str:
    """A stable id for a label set (alertname included)."""
    raw = json.dumps(sorted(labels.items()), separators=(",", ":"))
    return hashlib.sha256(raw.encode()).hexdigest()[:16]


def episode_id(fp: str, active_at: dt.datetime) -> str:
    """One episode: from going pending (or firing) until resolved. Actions run once per episode."""
    return hashlib.sha256(f"{fp}@{active_at.isoformat()}".encode()).hexdigest()[:20]


@dataclass(frozen=True)
class ActiveAlert:
    fingerprint: str
    rule_key: str | None
    alertname: str
    labels: tuple[tuple[str, str], ...]
    annotations: tuple[tuple[str, str], ...]
    state: AlertState
    value: float | None
    episode: str
    active_at: dt.datetime
    fired_at: dt.datetime | None = None
    keep_firing_since: dt.datetime | None = None
    resolved_at: dt.datetime | None = None
    ends_at: dt.datetime | None = None

    def label_dict(self) -> dict[str, str]:
        return dict(self.labels)

    def annotation_dict(self) -> dict[str, str]:
        return dict(self.annotations)


@dataclass(frozen=True)
class Transition:
    fingerprint: str
    alertname: str
    episode: str
    from_state: AlertState
    to_state: AlertState
    value: float | None
    labels: tuple[tuple[str, str], ...]


def _seconds(a: dt.datetime, b: dt.datetime) -> float:
    return (a - b).total_seconds()


def step(
    prev: ActiveAlert | None,
    *,
    holds: bool,
    value: float | None,
    now: dt.datetime,
    for_s: float,
    keep_firing_for_s: float,
    new: ActiveAlert | None = None,
) -> tuple[ActiveAlert | None, list[tuple[AlertState, AlertState]]]:
    """The alert after one evaluation and the transitions taken. `new` is the pending alert
    to start when the condition holds and `prev` is absent or resolved (labels, annotations
    already rendered). A returned None means the alert is inactive and not kept."""
    moves: list[tuple[AlertState, AlertState]] = []
    cur = prev
    if holds:
        if cur is None or cur.state == "resolved":
            assert new is not None
            cur = dataclasses.replace(
                new, state="pending", active_at=now, episode=episode_id(new.fingerprint, now)
            )
            moves.append(("inactive", "pending"))
        elif new is not None:
            cur = dataclasses.replace(cur, annotations=new.annotations)
        cur = dataclasses.replace(cur, value=value, keep_firing_since=None)
        if cur.state == "pending" and _seconds(now, cur.active_at) >= for_s:
            cur = dataclasses.replace(cur, state="firing", fired_at=now)
            moves.append(("pending", "firing"))
        return cur, moves
    if cur is None or cur.state == "resolved":
        return cur, moves
    if cur.state == "pending":
        return None, [("pending", "inactive")]
    if keep_firing_for_s > 0:
        since = cur.keep_firing_since or now
        if _seconds(now, since) < keep_firing_for_s:
            return dataclasses.replace(cur, keep_firing_since=since), moves
    return dataclasses.replace(cur, state="resolved", resolved_at=now, keep_firing_since=None), [
        ("firing", "resolved")
    ]
