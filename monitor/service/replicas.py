"""Several replicas of the service on one database acting as one system.

Every replica, leader or not, publishes every `schedule.publish_s`:
- a heartbeat row in `replicas`: the version its runtime serves and its queue depths;
- the intervals of its sliding windows that changed since the last publish, as rows of
  `replica_slots` (`collectors.SlotExporter`: DDSketch bins, request and error counts).

The leader's alert engine reads `merged` (`collectors.MergedStats`): its own windows plus
the other replicas' intervals, so traffic served by a follower reaches the rules. The
intervals of a replica that died stay in the store and keep counting until they leave
the window, as the requests they describe happened.

`replicas_for(version)` names the replicas a model action acts on (the action runner
fans the action out to them, alerts/actions/runner.py): the live replicas serving the
version that served its requests within the rules' longest window, or every live one
serving it when none did (an alert from Alertmanager, from the post-deploy analysis).
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import math
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from infersight.collectors import InferenceStats, MergedStats, RemoteStats, SlotExporter, SlotRecord
from infersight.monitor.store.tables import replica_slots, replicas
from sqlalchemy import Connection, Engine, Table, delete, insert, select
from sqlalchemy.dialects import postgresql, sqlite

__all__ = ["Replicas", "new_replica_id"]

log = logging.getLogger(__name__)
_GONE_S = 86_400.0  # heartbeats older than this are deleted by the leader


def new_replica_id() -> str:
    """Host, pid and a random part: unique even when a pid is reused after a restart."""
    return f"{socket.gethostname()[:80]}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def _upsert(conn: Connection, table: Table, rows: Sequence[dict[str, Any]], keys: Sequence[str]) -> None:
    if not rows:
        return
    name = conn.engine.dialect.name
    if name in ("postgresql", "sqlite"):
        dialect_insert = postgresql.insert if name == "postgresql" else sqlite.insert
        stmt = dialect_insert(table)
        update = {c.name: stmt.excluded[c.name] for c in table.columns if c.name not in keys}
        conn.execute(stmt.on_conflict_do_update(index_elements=list(keys), set_=update), list(rows))
        return
    for row in rows:  # any other database: delete then insert, in the caller's transaction
        conn.execute(delete(table).where(*(table.c[k] == row[k] for k in keys)))
        conn.execute(insert(table).values(**row))


class Replicas:
    def __init__(
        self,
        db: Engine,
        stats: InferenceStats,
        *,
        serving_version: Callable[[], str | None] = lambda: None,
        replica_id: str | None = None,
        publish_s: float = 1.0,
        horizon_s: float = 300.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.db = db
        self.stats = stats
        self.serving_version = serving_version
        self.id = replica_id or new_replica_id()
        self.publish_s = publish_s
        self.horizon_s = min(
            horizon_s, stats.window_s
        )  # "served the version lately": the rules' longest window
        self.live_s = max(10.0, 5.0 * publish_s)  # a heartbeat older than this: the replica is gone
        self.clock = clock
        self.exporter = SlotExporter(stats, epoch_clock=clock)
        self.merged = MergedStats(stats, self.remote, epoch_clock=clock)
        self.started_at = self._at(clock())
        self._cache: tuple[float, RemoteStats] | None = None
        self._lock = threading.Lock()

    @staticmethod
    def _at(t: float) -> dt.datetime:
        return dt.datetime.fromtimestamp(t, dt.UTC)

    def _slot(self, t: float) -> int:
        return math.floor(t / self.stats.interval_s)

    # -- publishing (every replica) ----------------------------------------------------
    def publish(self) -> int:
        """Heartbeat and the intervals that changed; returns how many intervals were written."""
        now = self.clock()
        records = self.exporter.changed()
        waiting = [
            [m, v, n] for m, v in self.stats.labels() if (n := self.stats.waiting(model=m, model_version=v))
        ]
        heartbeat = {
            "id": self.id, "host": socket.gethostname()[:256], "pid": os.getpid(), "started_at": self.started_at,
            "heartbeat_at": self._at(now), "serving_version": self.serving_version(), "waiting": json.dumps(waiting),
        }  # fmt: skip
        rows = [
            {"replica": self.id, "model": r.model, "model_version": r.model_version, "slot": r.slot,
             "interval_s": r.interval_s, "total": r.total, "errors": r.errors, "sketches": r.sketches_json(),
             "updated_at": self._at(now)}
            for r in records
        ]  # fmt: skip
        oldest = self._slot(now - self.stats.window_s) - 1
        with self.db.begin() as conn:
            _upsert(conn, replicas, [heartbeat], ["id"])
            _upsert(conn, replica_slots, rows, ["replica", "model", "model_version", "slot"])
            conn.execute(
                delete(replica_slots).where(replica_slots.c.replica == self.id, replica_slots.c.slot < oldest)
            )
        return len(rows)

    def withdraw(self) -> None:
        """A replica stopping cleanly: no longer a target of actions (its intervals stay)."""
        with self.db.begin() as conn:
            conn.execute(delete(replicas).where(replicas.c.id == self.id))

    def prune(self) -> None:
        """The leader's housekeeping: intervals out of every window, replicas gone for a day."""
        now = self.clock()
        with self.db.begin() as conn:
            conn.execute(
                delete(replica_slots).where(replica_slots.c.slot < self._slot(now - self.stats.window_s) - 1)
            )
            conn.execute(delete(replicas).where(replicas.c.heartbeat_at < self._at(now - _GONE_S)))

    # -- reading (the leader's rules) ----------------------------------------------------
    def remote(self) -> RemoteStats:
        """The other replicas' intervals within the rules' longest window (`horizon_s`; the
        merged view covers no more) and their live queue depths, read at most once per
        half publish interval."""
        now = self.clock()
        with self._lock:
            if self._cache is not None and now - self._cache[0] < self.publish_s / 2:
                return self._cache[1]
        first = self._slot(now - self.horizon_s) - 1
        with self.db.connect() as conn:
            slot_rows = conn.execute(
                select(replica_slots).where(replica_slots.c.replica != self.id, replica_slots.c.slot >= first)
            ).all()
            live = conn.execute(
                select(replicas.c.waiting).where(
                    replicas.c.id != self.id, replicas.c.heartbeat_at >= self._at(now - self.live_s)
                )
            ).all()
        slots = [
            SlotRecord(r.model, r.model_version, r.slot, r.interval_s, r.total, r.errors, json.loads(r.sketches),
                       replica=r.replica)
            for r in slot_rows
            if r.interval_s == self.stats.interval_s  # a replica configured otherwise cannot be merged
        ]  # fmt: skip
        waiting: dict[tuple[str, str], int] = {}
        for (raw,) in live:
            for model, version, n in json.loads(raw):
                waiting[(model, version)] = waiting.get((model, version), 0) + int(n)
        result = RemoteStats(tuple(slots), waiting)
        with self._lock:
            self._cache = (now, result)
        return result

    # -- action targets (alerts.actions.ReplicaTargets) -----------------------------------
    def replicas_for(self, model_version: str | None) -> list[str]:
        now = self.clock()
        with self.db.connect() as conn:
            live = conn.execute(
                select(replicas.c.id, replicas.c.serving_version).where(
                    replicas.c.id != self.id, replicas.c.heartbeat_at >= self._at(now - self.live_s)
                )
            ).all()
            serving = {
                r.id
                for r in live
                if r.serving_version is not None and model_version in (None, r.serving_version)
            }
            active: set[str] = set()
            if model_version is not None and serving:
                active = set(
                    conn.execute(
                        select(replica_slots.c.replica).distinct().where(
                            replica_slots.c.model_version == model_version,
                            replica_slots.c.slot >= self._slot(now - self.horizon_s),
                            replica_slots.c.total > 0,
                            replica_slots.c.replica.in_(sorted(serving)),
                        )
                    ).scalars()
                )  # fmt: skip
        mine = self.serving_version()
        if mine is not None and model_version in (None, mine):
            serving.add(self.id)
            if (
                model_version is not None
                and self.stats.count(self.horizon_s, model_version=model_version) > 0
            ):
                active.add(self.id)
        return sorted(active or serving)
