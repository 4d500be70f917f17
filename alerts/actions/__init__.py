"""Actions attached to rules and callable by hand: snapshot, rollback, hot_reload,
failover, collect."""

from __future__ import annotations

from .collect import CollectionOpened, open_collection
from .control import ModelControl, ReplicaTargets, RuntimeControl
from .runner import FAILURE_ALERT, ActionOutcome, ActionRunner
from .snapshot import SnapshotResult, SnapshotSource, render_html, take_snapshot

__all__ = [
    "FAILURE_ALERT",
    "ActionOutcome",
    "ActionRunner",
    "CollectionOpened",
    "ModelControl",
    "ReplicaTargets",
    "RuntimeControl",
    "SnapshotResult",
    "SnapshotSource",
    "open_collection",
    "render_html",
    "take_snapshot",
]
