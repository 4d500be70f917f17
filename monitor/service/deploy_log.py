"""Keeping the store's `deploys` and `model_versions` tables in step with the runtime.

The runtime tells its subscribers when the serving version changed or a deploy was
refused (on its loop thread, so the subscriber only appends to a deque); `flush()`
writes what arrived, from the scheduler or right after an API deploy. Deploys made by
anyone (the API, the alert engine's rollback action, the post-deploy analysis) are
recorded alike.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

from infersight.engine.events import CanaryChanged, DeployFailed, EngineEvent, VersionDeployed
from infersight.monitor.store.tables import deploys, model_versions
from prometheus_client import CollectorRegistry, Counter, Gauge
from sqlalchemy import Engine, insert, select, update

__all__ = ["DEPLOY_OUTCOMES", "DeployLog"]

DEPLOY_OUTCOMES = ("deployed", "rolled_back", "refused")

log = logging.getLogger(__name__)


def _at(ts: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(ts, dt.UTC)


class DeployLog:
    def __init__(
        self, db: Engine, runtime: Any, registry: CollectorRegistry, *, model: str, replica: str | None = None
    ) -> None:
        self.db = db
        self.runtime = runtime
        self.model = model
        self.replica = replica  # recorded with each row: one release on N replicas is N rows, one deploy
        self._events: deque[VersionDeployed | DeployFailed | CanaryChanged] = deque(maxlen=10_000)
        self._lock = threading.Lock()
        self.listeners: list[Callable[[VersionDeployed | DeployFailed | CanaryChanged], None]] = []
        self.deploys_total = Counter(
            "infersight_deploys", "Version changes of the embedded runtime", ["outcome"], registry=registry
        )
        for outcome in DEPLOY_OUTCOMES:  # at 0 from the first scrape: a first rollback is an increase
            self.deploys_total.labels(outcome)
        self.model_info = Gauge(
            "infersight_model_info",
            "1 for the serving version",
            ["model", "model_version"],
            registry=registry,
        )
        self._serving: str | None = None
        self._unsubscribe = runtime.subscribe(self._on_event)

    def _on_event(self, event: EngineEvent) -> None:
        if isinstance(event, VersionDeployed | DeployFailed | CanaryChanged):
            self._events.append(event)

    def close(self) -> None:
        self._unsubscribe()
        self.flush()

    def flush(self) -> int:
        with self._lock:
            rows: list[dict[str, Any]] = []
            events: list[VersionDeployed | DeployFailed | CanaryChanged] = []
            while self._events:
                event = self._events.popleft()
                events.append(event)
                if isinstance(event, VersionDeployed):
                    rows.append({"at": _at(event.at), "from_version": event.from_version,
                                 "to_version": event.to_version, "reason": event.reason,
                                 "outcome": "rolled_back" if event.reason == "rollback" else "deployed",
                                 "detail": None, "replica": self.replica})  # fmt: skip
                elif isinstance(event, CanaryChanged):  # rolled back: from the canary to the stable
                    back = event.action == "rolled_back"
                    rows.append({"at": _at(event.at), "reason": "canary", "outcome": event.action,
                                 "from_version": event.version if back else event.stable_version,
                                 "to_version": event.stable_version if back else event.version,
                                 "detail": event.detail[:4000] or None, "replica": self.replica})  # fmt: skip
                else:
                    rows.append({"at": _at(event.at), "from_version": event.serving_version,
                                 "to_version": event.version, "reason": "deploy", "outcome": "refused",
                                 "detail": event.reason[:4000], "replica": self.replica})  # fmt: skip
            if rows:
                with self.db.begin() as conn:
                    conn.execute(insert(deploys), rows)
                for row in rows:
                    # a canary's start and each step deploy it to more users; its rollback rolls back
                    outcome = {"started": "deployed", "reweighted": "deployed", "resumed": "deployed"}.get(
                        row["outcome"], row["outcome"]
                    )
                    self.deploys_total.labels(outcome).inc()
            self._set_serving(self.runtime.serving_version)
            self.sync_versions()
        for event in events:
            for listener in self.listeners:
                try:
                    listener(event)
                except Exception:  # a listener never blocks the deploy log
                    log.exception("deploy listener failed")
        return len(rows)

    def annotate(
        self, *, from_version: str, to_version: str, reason: str, since: dt.datetime, detail: str
    ) -> bool:
        """Say why on the latest recorded change `from_version` -> `to_version` made for
        `reason` at or after `since` (flushed first: the runtime's event may still be
        queued). False when no such change is recorded."""
        self.flush()
        d = deploys.c
        with self.db.begin() as conn:
            row_id = conn.execute(
                select(d.id)
                .where(d.from_version == from_version, d.to_version == to_version, d.reason == reason,
                       d.outcome != "refused", d.at >= since)
                .order_by(d.id.desc())
                .limit(1)
            ).scalar()  # fmt: skip
            if row_id is None:
                return False
            conn.execute(update(deploys).where(d.id == row_id).values(detail=detail[:4000]))
        return True

    def _set_serving(self, version: str | None) -> None:
        if version == self._serving:
            return
        if self._serving is not None:
            self.model_info.remove(self.model, self._serving)
        if version is not None:
            self.model_info.labels(self.model, version).set(1)
        self._serving = version

    def sync_versions(self) -> None:
        """Insert the registry's versions the store does not know yet."""
        versions = self.runtime.registry.versions()
        with self.db.begin() as conn:
            known = set(conn.execute(select(model_versions.c.name)).scalars())
            new = [
                {"name": v.name, "arch": v.arch, "dataset": v.dataset, "quant": v.quant, "major": v.major,
                 "minor": v.minor, "created_at": _at(v.created_at), "sha256": v.sha256, "parent": v.parent,
                 "path": str(v.path), "registered_at": dt.datetime.now(dt.UTC)}
                for v in versions if v.name not in known
            ]  # fmt: skip
            if new:
                conn.execute(insert(model_versions), new)
