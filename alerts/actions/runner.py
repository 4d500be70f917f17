"""Running actions: once per alert episode (a unique run key), within a cooldown and a
daily cap, optionally as a dry run. Runs queued by the evaluator (in the transaction that
made the alert fire) and runs asked for by hand, by Alertmanager or by the post-deploy
analysis all go through the same `alert_action_runs` row, leased like the outbox, so two
workers never run the same row. With several replicas on one database (`replica` and
`targets` given), a model action is fanned out to the replicas whose runtime serves the
alerted version: this replica's part runs on the row asked for, each other replica's on
a row of its own that only it claims, and the row asked for becomes "dispatched" when
this replica is not a target. A failed rollback, reload or failover is verified to have
left the serving version as it was, and raises the `RemediationFailed` alert; so does one
that was refused (daily cap, no backup version designated, no engine under control, no
replica to run it on), since the fault it was meant to fix is still there. A refusal by
the cooldown does not: the run that started the cooldown either succeeded or has already
paged.

`ModelControl`: what actions need of the serving engine, and the adapter for the engine's
`Runtime` (duck-typed: alerts/ does not import the engine). A rollback with a `canary`
parameter is a canary's (alerts/release/canary.py): it ends that canary (`CanaryAbort`).
"""

from __future__ import annotations

import datetime as dt
import json
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from infersight.monitor.store.tables import action_runs, alerts
from sqlalchemy import Connection, Engine, and_, func, insert, or_, select, update
from sqlalchemy.exc import IntegrityError

from ..errors import ActionFailed, ActionRefused
from ..lifecycle import fingerprint, push_alert
from ..rules.rules import ActionSpec
from .evidence import SnapshotSource, open_collection, take_snapshot

__all__ = [
    "FAILURE_ALERT",
    "ActionOutcome",
    "ActionRunner",
    "CanaryAbort",
    "Diagnoser",
    "ModelControl",
    "ReplicaTargets",
    "RuntimeControl",
]


@runtime_checkable
class ModelControl(Protocol):
    """Each method either completes or raises `ActionFailed`, and on failure the engine
    keeps serving the version it served before (the actions verify this)."""

    def serving_version(self) -> str | None: ...

    def deploy(self, version: str) -> None: ...

    def rollback(self) -> None: ...

    def failover(self, version: str) -> None: ...


@runtime_checkable
class CanaryAbort(Protocol):
    """A `ModelControl` whose engine runs canaries: a canary's rollback ends the canary (its
    share of traffic back to the stable version), not the serving version."""

    def abort_canary(self, version: str, message: str) -> bool:
        """End the canary of `version` -> False when no canary of it was running."""
        ...
class Diagnoser(Protocol):
    """The slowdown checklist for an alert (the service wires it: alerts/ does not import it).
    Returns the diagnosis as JSON, with a one-line `summary`."""

    def diagnose(self, alertname: str | None, labels: Mapping[str, str], now: dt.datetime) -> Mapping[str, Any]: ...


class ReplicaTargets(Protocol):
    """Which replicas a model action acts on, where several share one database."""

    def replicas_for(self, labels: Mapping[str, str]) -> list[str]:
        """From the alert's labels: the replica named by `replica`, or the one whose GPU
        is `uuid`, or the live replicas serving `model_version` that served its requests
        lately (all those serving it when none did); with none of these labels, every
        live replica with a runtime."""
        ...


class RuntimeControl:
    """`ModelControl` over `infersight.engine.Runtime`: engine errors (DeployRefused and
    its subclasses, RuntimeNotRunning, VersionNotFound) become `ActionFailed`."""

    def __init__(self, runtime: Any) -> None:
        self.runtime = runtime

    def serving_version(self) -> str | None:
        version = self.runtime.serving_version
        return None if version is None else str(version)

    def _call(self, action: str, fn: Any, *args: str) -> None:
        try:
            fn(*args)
        except Exception as exc:  # the engine's typed errors, re-raised as ours
            raise ActionFailed(
                action, f"{type(exc).__name__}: {exc}", serving_version=self.runtime.serving_version
            ) from exc

    def deploy(self, version: str) -> None:
        self._call("hot_reload", self.runtime.deploy, version)

    def rollback(self) -> None:
        self._call("rollback", self.runtime.rollback)

    def failover(self, version: str) -> None:
        self._call("failover", self.runtime.failover, version)

    def abort_canary(self, version: str, message: str) -> bool:
        canary = getattr(self.runtime, "canary", None)
        status = None if canary is None else canary.status
        if (
            canary is None or status is None or status.version != version
        ):  # ended already (an operator, a rule)
            return False
        self._call("rollback", canary.abort, message)
        return True


FAILURE_ALERT = "RemediationFailed"
_SNAPSHOT_TRIGGER = {"rule": "alert", "alertmanager": "alert", "analysis": "post_deploy", "manual": "manual"}
_COUNTED = ("succeeded", "failed")  # dry runs and refusals do not use up the cap
_REMEDIATIONS = (
    "rollback",
    "hot_reload",
    "failover",
)  # a snapshot or collect fixes nothing: no page when it cannot run
_RECORDING = ("snapshot", "collect", "diagnose")  # actions that keep evidence and leave the serving version alone
_UNPAGED_REFUSALS = ("cooldown",)
# reads the store and changes nothing: each alert episode gets its own, however many fire
_UNLIMITED = ("diagnose",)
MODEL_ACTIONS = _REMEDIATIONS  # act on a runtime: fanned out to the replicas


@dataclass(frozen=True)
class ActionOutcome:
    run_id: int
    run_key: str
    action: str
    state: str  # pending, succeeded, failed, refused, dry_run, dispatched (to other replicas)
    trigger: str
    before_version: str | None
    after_version: str | None
    detail: Mapping[str, Any] = field(default_factory=dict)
    duplicate: bool = False  # this call did not run it: the key had run, or is running, elsewhere

    def to_json(self) -> dict[str, Any]:
        return {**self.__dict__, "detail": dict(self.detail)}


def _outcome(row: Any, *, duplicate: bool = False) -> ActionOutcome:
    return ActionOutcome(
        row.id,
        row.run_key,
        row.action,
        row.state,
        row.trigger,
        row.before_version,
        row.after_version,
        json.loads(row.detail),
        duplicate,
    )


class ActionRunner:
    def __init__(
        self,
        engine: Engine,
        *,
        data_dir: str | Path,
        control: ModelControl | None = None,
        snapshots: SnapshotSource | None = None,
        backup_version: str | None = None,
        clock: Callable[[], float] = time.time,
        lease_s: float = 600.0,
        failure_alert_for_s: float = 3600.0,
        owner: str | None = None,
        replica: str | None = None,
        targets: ReplicaTargets | None = None,
        diagnoser: Diagnoser | None = None,
    ) -> None:
        self.engine = engine
        self.data_dir = Path(data_dir)
        self.control = control
        self.snapshots = snapshots
        self.backup_version = backup_version
        self.clock = clock
        self.lease_s = lease_s
        self.failure_alert_for_s = failure_alert_for_s
        self.owner = owner or f"actions-{uuid.uuid4().hex[:12]}"
        self.replica = replica  # this process's replica id: rows for other replicas are theirs
        self.targets = targets  # None: model actions act on this process's runtime
        self.diagnoser = diagnoser  # None: the diagnose action is refused

    def _now(self) -> dt.datetime:
        return dt.datetime.fromtimestamp(self.clock(), dt.UTC)

    # -- entry points -----------------------------------------------------------------
    def run(
        self,
        spec: ActionSpec,
        *,
        trigger: str = "manual",
        key: str | None = None,
        alertname: str | None = None,
        labels: Mapping[str, str] | None = None,
    ) -> ActionOutcome:
        """Run `spec` now. `key` makes it idempotent (default: a fresh key, i.e. always
        runs); a key seen before returns that run's outcome with `duplicate=True`."""
        run_key = f"{spec.type}:{key or 'manual-' + uuid.uuid4().hex}"
        row_id, created = self._submit(spec, run_key, trigger, alertname, labels or {})
        if created:  # inserted under this runner's lease: another thread's run_pending cannot take it
            return self._execute(self._row(row_id))
        claimed = self._claim(and_(action_runs.c.id == row_id))
        if not claimed:
            return _outcome(self._row(row_id), duplicate=True)
        return self._execute(claimed[0])  # a run left pending (its runner crashed): this call ran it

    def run_pending(self, limit: int = 10, *, own_only: bool = False) -> list[ActionOutcome]:
        """Run the actions the evaluator queued (oldest first); `own_only`: only the runs
        fanned out to this replica (a follower's job), not the ones still to dispatch."""
        extra = action_runs.c.replica == self.replica if own_only else None
        return [self._execute(row) for row in self._claim(extra, limit=limit)]

    # -- rows -------------------------------------------------------------------------
    def _row(self, row_id: int) -> Any:
        with self.engine.connect() as conn:
            return conn.execute(select(action_runs).where(action_runs.c.id == row_id)).one()

    def _submit(
        self, spec: ActionSpec, run_key: str, trigger: str, alertname: str | None, labels: Mapping[str, str]
    ) -> tuple[int, bool]:
        try:
            return self._insert(spec, run_key, trigger, alertname, labels), True
        except IntegrityError:  # the key exists (maybe inserted concurrently by an HA peer's request)
            with self.engine.connect() as conn:
                found = conn.execute(select(action_runs.c.id).where(action_runs.c.run_key == run_key)).one()
            return int(found.id), False

    def _insert(
        self, spec: ActionSpec, run_key: str, trigger: str, alertname: str | None, labels: Mapping[str, str]
    ) -> int:
        now = self._now()
        with self.engine.begin() as conn:
            result = conn.execute(
                insert(action_runs).values(
                    run_key=run_key,
                    action=spec.type,
                    spec=json.dumps(spec.to_json()),
                    trigger=trigger,
                    alertname=alertname,
                    labels=json.dumps(dict(labels), sort_keys=True),
                    state="pending",
                    created_at=now,
                    detail="{}",
                    lease_owner=self.owner,  # the caller runs it next
                    lease_until=now + dt.timedelta(seconds=self.lease_s),
                )
            )
            pk = result.inserted_primary_key
            assert pk is not None
            return int(pk[0])

    def _claim(self, extra: Any, limit: int = 1) -> list[Any]:
        now = self._now()
        free = and_(
            action_runs.c.state == "pending",
            or_(action_runs.c.lease_until.is_(None), action_runs.c.lease_until < now),
            or_(action_runs.c.replica.is_(None), action_runs.c.replica == self.replica),
        )
        cond = free if extra is None else and_(free, extra)
        due = (
            select(action_runs.c.id)
            .where(cond)
            .order_by(action_runs.c.id)
            .limit(limit)
            .with_for_update(skip_locked=True)
        )
        stmt = (
            update(action_runs)
            .where(action_runs.c.id.in_(due.scalar_subquery()), cond)
            .values(lease_owner=self.owner, lease_until=now + dt.timedelta(seconds=self.lease_s))
            .returning(*action_runs.c)
        )
        with self.engine.begin() as conn:
            return sorted(conn.execute(stmt).all(), key=lambda r: r.id)

    # -- execution --------------------------------------------------------------------
    def _policy(
        self, conn: Connection, spec: ActionSpec, row_id: int, now: dt.datetime, replica: str | None = None
    ) -> None:
        """Cooldown and daily cap, per replica (each replica's runtime is rolled back once)."""
        if spec.type in _UNLIMITED:
            return
        recent = select(func.max(action_runs.c.started_at), func.count()).where(
            action_runs.c.action == spec.type,
            action_runs.c.replica.is_not_distinct_from(replica),
            action_runs.c.state.in_(_COUNTED),
            action_runs.c.id != row_id,
            action_runs.c.started_at >= now - dt.timedelta(days=1),
        )
        last, count = conn.execute(recent).one()
        if last is not None and (now - last).total_seconds() < spec.cooldown_s:
            wait = spec.cooldown_s - (now - last).total_seconds()
            raise ActionRefused(spec.type, "cooldown", f"last run {last.isoformat()}, {wait:.0f}s left")
        if count >= spec.daily_cap:
            raise ActionRefused(spec.type, "daily_cap", f"{count} runs in the last 24h, cap {spec.daily_cap}")

    def _execute(self, row: Any) -> ActionOutcome:
        spec = ActionSpec.from_json(json.loads(row.spec))
        now = self._now()
        before = self.control.serving_version() if self.control is not None else None
        detail: dict[str, Any] = dict(json.loads(row.detail))
        state, after = "succeeded", before
        failure: ActionFailed | ActionRefused | None = None
        replica = row.replica
        try:
            if self.targets is not None and replica is None and spec.type in MODEL_ACTIONS:
                dispatched, detail["replicas"] = self._fan_out(row, spec, now)
                if dispatched is not None:
                    return dispatched
                replica = self.replica  # this replica is one of the targets: its part runs on this row
            target = self._target(spec, before)  # bad parameters are reported before any cooldown
            with self.engine.connect() as conn:
                self._policy(conn, spec, row.id, now, replica)
            if spec.dry_run:
                state, detail["would"] = "dry_run", self._describe(spec, before, target)
            else:
                detail.update(self._act(spec, row, before, target, now))
                after = self.control.serving_version() if self.control is not None else None
                if spec.type not in _RECORDING and target is not None and after != target:
                    raise ActionFailed(
                        spec.type, f"serving {after} after the switch to {target}", serving_version=after
                    )
        except ActionRefused as exc:
            state, detail["refused"], detail["reason"] = "refused", exc.reason, str(exc)
            failure = exc if spec.type in _REMEDIATIONS and exc.reason not in _UNPAGED_REFUSALS else None
        except ActionFailed as exc:
            after = self.control.serving_version() if self.control is not None else None
            state, failure = "failed", exc
            detail.update(error=exc.reason, serving_version_kept=after == before)
        with self.engine.begin() as conn:
            conn.execute(
                update(action_runs)
                .where(action_runs.c.id == row.id)
                .values(
                    state=state,
                    started_at=now,
                    finished_at=self._now(),
                    before_version=before,
                    after_version=after,
                    detail=json.dumps(detail, default=str),
                    lease_owner=None,
                    lease_until=None,
                )
            )
            if failure is not None:
                self._raise_failure_alert(conn, spec, row, before, after, failure)
            final = conn.execute(select(action_runs).where(action_runs.c.id == row.id)).one()
        return _outcome(final)

    def _fan_out(
        self, row: Any, spec: ActionSpec, now: dt.datetime
    ) -> tuple[ActionOutcome | None, list[str]]:
        """A pending row for each other target replica. When this replica is a target too,
        its part runs on `row` itself (returns None); otherwise `row` becomes "dispatched"."""
        assert self.targets is not None
        labels = json.loads(row.labels)
        replicas = self.targets.replicas_for(labels)
        if not replicas:
            what = {k: labels[k] for k in ("replica", "uuid", "model_version") if labels.get(k)} or "a model"
            none_here = "; none here (proxy mode: roll back the upstream)" if self.control is None else ""
            raise ActionRefused(
                spec.type, "no_replica", f"no live replica with a runtime matches {what}{none_here}"
            )
        here = self.replica in replicas
        detail = {**json.loads(row.detail), "replicas": replicas}
        with self.engine.begin() as conn:
            for replica in replicas:
                key = f"{row.run_key}@{replica}"[:200]
                if (
                    replica == self.replica
                    or conn.execute(select(action_runs.c.id).where(action_runs.c.run_key == key)).first()
                ):
                    continue
                conn.execute(
                    insert(action_runs).values(
                        run_key=key, action=row.action, spec=row.spec, trigger=row.trigger,
                        alertname=row.alertname, labels=row.labels, state="pending", created_at=now,
                        detail=row.detail, replica=replica,
                    )
                )  # fmt: skip
            if here:
                conn.execute(
                    update(action_runs).where(action_runs.c.id == row.id).values(replica=self.replica)
                )
                return None, replicas
            conn.execute(
                update(action_runs)
                .where(action_runs.c.id == row.id)
                .values(state="dispatched", started_at=now, finished_at=self._now(),
                        detail=json.dumps(detail, default=str), lease_owner=None, lease_until=None)
            )  # fmt: skip
            parent = conn.execute(select(action_runs).where(action_runs.c.id == row.id)).one()
        return _outcome(parent), replicas

    def _target(self, spec: ActionSpec, before: str | None) -> str | None:
        """The version a model action switches to (None: rollback's, decided by the engine)."""
        if spec.type in _RECORDING:
            return None
        if self.control is None:
            raise ActionRefused(
                spec.type,
                "unavailable",
                "no engine is under control here (proxy mode: roll back the upstream)",
            )
        if spec.type == "hot_reload":
            version = spec.param("version")
            if not version:
                raise ActionRefused(spec.type, "bad_parameters", "hot_reload needs a version")
            return str(version)
        if spec.type == "failover":
            backup = spec.param("backup") or self.backup_version
            if not backup:
                raise ActionRefused(spec.type, "bad_parameters", "no backup version designated")
            return str(backup)
        return None

    def _describe(self, spec: ActionSpec, before: str | None, target: str | None) -> str:
        if spec.type == "snapshot":
            return f"snapshot of the last {spec.param('requests') or 50} requests"
        if spec.type == "diagnose":
            return "run the slowdown checklist and add it to the alert"
        if spec.type == "collect":
            return (
                f"keep the next {spec.param('n') or 200} requests of kind {spec.param('kind') or 'version'}"
            )
        if spec.type == "rollback":
            return f"roll back from {before} to the previous good version"
        return f"{spec.type} from {before} to {target}"

    def _act(
        self, spec: ActionSpec, row: Any, before: str | None, target: str | None, now: dt.datetime
    ) -> dict[str, Any]:
        if spec.type == "snapshot":
            snap = take_snapshot(
                self.engine,
                data_dir=self.data_dir,
                requests_n=int(spec.param("requests") or 50),
                trigger=_SNAPSHOT_TRIGGER.get(row.trigger, "manual"),
                reason=row.alertname or row.trigger,
                now=now,
                # the alerted version's requests (the serving one when the alert names none)
                model_version=json.loads(row.labels or "{}").get("model_version") or before,
                source=self.snapshots,
                diagnosis=self._diagnosis_of(row),
            )
            return {
                "snapshot_id": snap.snapshot_id,
                "path": str(snap.html_path),
                "requests": snap.request_count,
            }
        if spec.type == "collect":
            return self._collect(spec, row, before, now)
        if spec.type == "diagnose":
            return self._diagnose(spec, row, now)
        assert self.control is not None
        if target is not None and target == before:
            return {"noop": f"already serving {target}"}
        if spec.type == "rollback" and spec.param("canary") is not None:
            return self._abort_canary(spec)
        if spec.type == "rollback":
            self.control.rollback()
        elif spec.type == "hot_reload":
            assert target is not None
            self.control.deploy(target)
        else:
            assert target is not None
            self.control.failover(target)
        return {"from": before, "to": self.control.serving_version()}

    def _abort_canary(self, spec: ActionSpec) -> dict[str, Any]:
        """A canary's rollback (params `canary`: its version, `reason`: the deploy history's
        message): the canary ends, the stable version serves on."""
        control, version = self.control, str(spec.param("canary"))
        if not isinstance(control, CanaryAbort):
            raise ActionRefused(spec.type, "unavailable", "the engine under control runs no canaries")
        if not control.abort_canary(version, str(spec.param("reason") or "")):
            return {"noop": f"no canary of {version} running", "canary": version}
        return {"canary": version, "aborted": True, "serving": control.serving_version()}
    def _diagnose(self, spec: ActionSpec, row: Any, now: dt.datetime) -> dict[str, Any]:
        """Runs the checklist; its summary line joins the alert's annotations."""
        if self.diagnoser is None:
            raise ActionRefused(spec.type, "unavailable", "no diagnosis is wired here")
        labels = json.loads(row.labels or "{}")
        diagnosis = dict(self.diagnoser.diagnose(row.alertname, labels, now))
        fp = fingerprint({**labels, "alertname": row.alertname} if row.alertname else labels)
        with self.engine.begin() as conn:
            current = conn.execute(select(alerts.c.annotations).where(alerts.c.fingerprint == fp)).first()
            if current is not None:
                annotations = {**json.loads(current.annotations), "diagnosis": str(diagnosis.get("summary", ""))}
                conn.execute(update(alerts).where(alerts.c.fingerprint == fp)
                             .values(annotations=json.dumps(annotations, sort_keys=True)))  # fmt: skip
        return {"fingerprint": fp, "diagnosis": diagnosis}

    def _diagnosis_of(self, row: Any) -> Mapping[str, Any] | None:
        """The diagnosis its alert episode's diagnose run made, if one ran before this."""
        episode = json.loads(row.detail or "{}").get("episode")
        if not episode:
            return None
        with self.engine.connect() as conn:
            found = conn.execute(select(action_runs.c.detail).where(
                action_runs.c.run_key == f"diagnose:{episode}", action_runs.c.state == "succeeded")).first()  # fmt: skip
        return None if found is None else json.loads(found.detail).get("diagnosis")

    def _collect(self, spec: ActionSpec, row: Any, before: str | None, now: dt.datetime) -> dict[str, Any]:
        kind = str(spec.param("kind") or "version")
        # the alerted version (the serving one when the alert names none)
        version = json.loads(row.labels or "{}").get("model_version") or before
        if kind == "version" and not version:
            raise ActionRefused(spec.type, "bad_parameters", "kind version: the alert names no model_version")
        opened = open_collection(
            self.engine,
            collection_id=f"run-{row.id}",  # one collection per run, however often it is retried
            kind=kind,
            n=int(spec.param("n") or 200),
            model_version=version,
            reason=row.alertname or row.trigger,
            now=now,
        )
        return {"collection_id": opened.collection_id, "kind": opened.kind,
                "model_version": opened.model_version, "n": opened.n}  # fmt: skip

    def _raise_failure_alert(
        self,
        conn: Connection,
        spec: ActionSpec,
        row: Any,
        before: str | None,
        after: str | None,
        exc: ActionFailed | ActionRefused,
    ) -> None:
        now = self._now()
        kept = "kept serving" if after == before else "NOW serving"
        refused = isinstance(exc, ActionRefused)
        what = str(exc) if refused else f"{spec.type} failed ({exc.reason})"
        push_alert(
            conn,
            FAILURE_ALERT,
            {
                "severity": "critical",
                "action": spec.type,
                "outcome": "refused" if refused else "failed",
                "trigger": row.trigger,
                "source_alert": row.alertname or "",
                "model_version": before or "",
            },
            {
                "summary": f"{what}; {kept} {after}",
                "runbook_url": "https://runbooks.example.org/infersight#remediation-failed",
            },
            now=now,
            ends_at=now + dt.timedelta(seconds=self.failure_alert_for_s),
        )
