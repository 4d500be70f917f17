"""Several replicas of the service on one database acting as one system.

Every replica, leader or not, publishes every `schedule.publish_s`:
- a heartbeat row in `replicas`: the version its runtime serves, its queue depths and its
  latest GPU and process readings (the leader's GPU and memory rules read them:
  `remote_resources()`, samples labelled with the replica);
- the intervals of its sliding windows that changed since the last publish, as rows of
  `replica_slots` (`collectors.SlotExporter`: DDSketch bins, request and error counts).

The leader's alert engine reads `merged` (`collectors.MergedStats`): its own windows plus
the other replicas' intervals, so traffic served by a follower reaches the rules. The
intervals of a replica that died stay in the store and keep counting until they leave
the window, as the requests they describe happened.

`replicas_for(labels)` names the replicas a model action acts on (the action runner
fans the action out to them, alerts/actions/runner.py): the one named by a `replica`
label, the one whose GPU is `uuid`, or the live replicas serving `model_version` that
served its requests within the rules' longest window (every live one serving it when
none did: an alert from Alertmanager, from the post-deploy analysis).
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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from infersight.alerts.rules.signals import RemoteResources
from infersight.collectors import InferenceStats, MergedStats, RemoteStats, SlotExporter, SlotRecord
from infersight.monitor.store.tables import deploys, replica_slots, replicas
from sqlalchemy import Connection, Engine, Table, delete, insert, or_, select, update
from sqlalchemy.dialects import postgresql, sqlite

from .jobs import new_replica_id

__all__ = ["GPUReading", "ProcessReading", "Replicas"]

log = logging.getLogger(__name__)
_GONE_S = 86_400.0  # heartbeats older than this are deleted by the leader


@dataclass(frozen=True)
class GPUReading:
    """What another replica published of one GPU (the fields the GPU rules read)."""

    uuid: str
    sm_activity: float | None
    memory_used_bytes: int | None
    memory_total_bytes: int | None


@dataclass(frozen=True)
class ProcessReading:
    pid: int
    rss_bytes: int


def _resources(gpu: Any, process: Any) -> str:
    gpus = gpu.latest() if gpu is not None and getattr(gpu, "enabled", True) else {}
    p = process.latest() if process is not None else None
    return json.dumps({
        "gpus": [{"index": i, "uuid": g.uuid, "sm_activity": g.sm_activity, "memory_used_bytes": g.memory_used_bytes,
                  "memory_total_bytes": g.memory_total_bytes} for i, g in sorted(gpus.items())],
        "process": None if p is None else {"pid": p.pid, "rss_bytes": p.rss_bytes},
    })  # fmt: skip


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
        leader: Callable[[], bool] = lambda: False,  # the scheduler's LeaderLock.is_leader
        gpu: Any = None,  # GPUCollector: .latest()
        process: Any = None,  # ProcessCollector: .latest()
        replica_id: str | None = None,
        publish_s: float = 1.0,
        horizon_s: float = 300.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.db = db
        self.stats = stats
        self.serving_version = serving_version
        self.leader = leader
        self.gpu = gpu
        self.process = process
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
            "resources": _resources(self.gpu, self.process), "leader": bool(self.leader()),
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
        """The leader's housekeeping: intervals out of every window, replicas gone for a day,
        and actions fanned out to a replica that went away before it ran them (refused:
        that runtime is gone; the alert, if its cause remains, is still firing)."""
        from infersight.monitor.store.tables import action_runs

        now = self.clock()
        live = [r for r, _ in self._live(replicas.c.id)] + [self.id]
        gone = {"refused": "replica_gone", "reason": "the replica stopped before it ran this action"}
        with self.db.begin() as conn:
            conn.execute(
                update(action_runs)
                .where(
                    action_runs.c.state == "pending",
                    action_runs.c.replica.is_not(None),
                    action_runs.c.replica.not_in(live),
                    or_(action_runs.c.lease_until.is_(None), action_runs.c.lease_until < self._at(now)),
                )
                .values(state="refused", finished_at=self._at(now), detail=json.dumps(gone))
            )
            conn.execute(
                delete(replica_slots).where(replica_slots.c.slot < self._slot(now - self.stats.window_s) - 1)
            )
            conn.execute(delete(replicas).where(replicas.c.heartbeat_at < self._at(now - _GONE_S)))

    # -- reading (the API, the CLI) -----------------------------------------------------
    def listing(self) -> list[dict[str, Any]]:
        """Every replica with a heartbeat on the shared database, newest first: its name,
        host and pid, the version it serves, whether it led at its last heartbeat (a replica
        whose heartbeat is older than `live_s` is reported gone, and leads nothing)."""
        now = self.clock()
        with self.db.connect() as conn:
            rows = conn.execute(select(replicas).order_by(replicas.c.heartbeat_at.desc())).all()
        out = []
        for r in rows:
            age = max(0.0, now - r.heartbeat_at.timestamp())
            live = age <= self.live_s
            out.append({
                "name": r.id, "host": r.host, "pid": r.pid, "serving_version": r.serving_version,
                "leader": bool(r.leader) and live, "live": live, "this": r.id == self.id,
                "started_at": r.started_at.astimezone(dt.UTC).isoformat().replace("+00:00", "Z"),
                "heartbeat_at": r.heartbeat_at.astimezone(dt.UTC).isoformat().replace("+00:00", "Z"),
                "age_s": round(age, 3),
            })  # fmt: skip
        return out

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

    def remote_resources(self) -> list[RemoteResources]:
        """The other live replicas' latest GPU and process readings."""
        out = []
        for replica, raw in self._live(replicas.c.resources):
            data = json.loads(raw)
            gpus = {
                int(g["index"]): GPUReading(
                    g["uuid"], g["sm_activity"], g["memory_used_bytes"], g["memory_total_bytes"]
                )
                for g in data.get("gpus", [])
            }
            p = data.get("process")
            out.append(
                RemoteResources(
                    replica, gpus, None if p is None else ProcessReading(p["pid"], p["rss_bytes"])
                )
            )
        return out

    def _live(self, column: Any) -> list[tuple[str, Any]]:
        with self.db.connect() as conn:
            rows = conn.execute(
                select(replicas.c.id, column).where(
                    replicas.c.id != self.id, replicas.c.heartbeat_at >= self._at(self.clock() - self.live_s)
                )
            ).all()
        return [(r[0], r[1]) for r in rows]

    def open_canaries(self) -> list[tuple[str, str]]:
        """(replica, canary version) of every other live replica whose runtime runs a canary
        now, read from its rows in `deploys` (the last canary row of each is a start, a step
        or a resume): one canary at a time across the replicas of a database."""
        live = [r for r, _ in self._live(replicas.c.serving_version)]
        if not live:
            return []
        c = deploys.c
        with self.db.connect() as conn:
            rows = conn.execute(
                select(c.replica, c.to_version, c.outcome)
                .where(c.replica.in_(live), c.reason.in_(["canary", "canary-promote"]))
                .order_by(c.at, c.id)
            ).all()
        last = {r[0]: (r[1], r[2]) for r in rows}
        return sorted(
            (r, v) for r, (v, outcome) in last.items() if outcome in ("started", "reweighted", "resumed")
        )

    # -- action targets (alerts.actions.ReplicaTargets) -----------------------------------
    def replicas_for(self, labels: Mapping[str, str]) -> list[str]:
        mine = self.serving_version()
        if labels.get("replica"):
            named = labels["replica"]
            if named == self.id:
                return [named] if mine is not None else []
            return [r for r, v in self._live(replicas.c.serving_version) if r == named and v is not None]
        if labels.get("uuid"):
            uuid_ = labels["uuid"]
            found = [
                r for r, raw in self._live(replicas.c.resources)
                if any(g.get("uuid") == uuid_ for g in json.loads(raw).get("gpus", []))
            ]  # fmt: skip
            gpus = self.gpu.latest() if self.gpu is not None and getattr(self.gpu, "enabled", True) else {}
            if mine is not None and any(g.uuid == uuid_ for g in gpus.values()):
                found.append(self.id)
            serving = {r for r, v in self._live(replicas.c.serving_version) if v is not None} | (
                {self.id} if mine is not None else set()
            )
            return sorted(r for r in found if r in serving)
        return self._serving(labels.get("model_version") or None)

    def _serving(self, model_version: str | None) -> list[str]:
        now = self.clock()
        serving = {
            r
            for r, v in self._live(replicas.c.serving_version)
            if v is not None and model_version in (None, v)
        }
        active: set[str] = set()
        if model_version is not None and serving:
            with self.db.connect() as conn:
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
