"""Keeping the store's `deploys` and `model_versions` tables in step with the runtime.

The runtime tells its subscribers when the serving version changed or a deploy was
refused (on its loop thread, so the subscriber only appends to a deque); `flush()`
writes what arrived, from the scheduler or right after an API deploy. Deploys made by
anyone (the API, the alert engine's rollback action, the post-deploy analysis) are
recorded alike.
"""

from __future__ import annotations

import datetime as dt
import threading
from collections import deque
from typing import Any

from infersight.engine.events import DeployFailed, EngineEvent, VersionDeployed
from infersight.monitor.store.tables import deploys, model_versions
from sqlalchemy import Engine, insert, select

__all__ = ["DeployLog"]


def _at(ts: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(ts, dt.UTC)


class DeployLog:
    def __init__(self, db: Engine, runtime: Any) -> None:
        self.db = db
        self.runtime = runtime
        self._events: deque[VersionDeployed | DeployFailed] = deque(maxlen=10_000)
        self._lock = threading.Lock()
        self._unsubscribe = runtime.subscribe(self._on_event)

    def _on_event(self, event: EngineEvent) -> None:
        if isinstance(event, VersionDeployed | DeployFailed):
            self._events.append(event)

    def close(self) -> None:
        self._unsubscribe()
        self.flush()

    def flush(self) -> int:
        with self._lock:
            rows: list[dict[str, Any]] = []
            while self._events:
                event = self._events.popleft()
                if isinstance(event, VersionDeployed):
                    rows.append({"at": _at(event.at), "from_version": event.from_version,
                                 "to_version": event.to_version, "reason": event.reason,
                                 "outcome": "rolled_back" if event.reason == "rollback" else "deployed",
                                 "detail": None})  # fmt: skip
                else:
                    rows.append({"at": _at(event.at), "from_version": event.serving_version,
                                 "to_version": event.version, "reason": "deploy", "outcome": "refused",
                                 "detail": event.reason[:4000]})  # fmt: skip
            if rows:
                with self.db.begin() as conn:
                    conn.execute(insert(deploys), rows)
            self.sync_versions()
            return len(rows)

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
