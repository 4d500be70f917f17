"""Automatic analysis after a deploy: for a window after each deploy, compare the new
version with the previous one (error rate, p99 latency, mean relevance, output drift) at
intervals. After `max_failed_checks` failed checks, roll back by itself (through the
action runner, so it is recorded, capped and verified) and page with the evidence
(the `PostDeployRegression` alert, whose `failed_checks` label names the checks and whose
annotations give their figures).

Only server errors count: outcomes the client caused (`client_error`, `cancelled`, see
`infersight.monitor.records`) are counted apart and never fail a check.

With pairs (`PairedEvidence`: the runtime answers a share of requests with both versions,
engine/runtime_shadow.py), relevance and output drift are checked on the same requests
(alerts/release/paired_checks.py: per-pair relevance difference, similarity of the two answers,
output-length ratio, finish-reason agreement) instead of before against after, which any
change in what clients ask at deploy time would confound; a failed paired check names its
pairs ("relevance fell in 17 of 20 pairs, mean -0.41"). When pairs are off (proxy mode
without a second upstream) every verdict says so. The p99 check compares requests of the
same shape only (output-length, prompt-length and max_tokens buckets and the stream flag,
in strata both sides have: `_like_p99`), and the error-rate check the two versions' rates
within strata of what the requests asked (max_tokens bucket, stream flag: `_like_errors`),
Mantel-Haenszel weighted, so a client changing `max_tokens` or streaming at the moment of a
deploy cannot create a difference.

At the window's end an analysis on pairs is held while a check the pair policy wants decided
(`PairPolicy.decide`: divergence) has neither regressed nor cleared, up to `max_pairs` pairs
or `max_hold_s` past the window (the evidence says so), as a canary step is held.

Replicas on one database share the analyses: a deploy of the version an analysis already
watches (the same release rolled out to another replica) joins it instead of superseding
it, and a due check is claimed with a lease, so one replica runs each check over the
`requests` of every replica."""

from __future__ import annotations

import datetime as dt
import json
import math
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, Protocol

from infersight.monitor.outcomes import CANCELLED, CLIENT_ERROR, is_server_error
from infersight.monitor.store.tables import deploy_analyses, requests, started_in
from sqlalchemy import Engine, and_, insert, or_, select, text, update

from ..actions.runner import ActionOutcome, ActionRunner
from ..lifecycle import push_alert
from ..rules.rules import ActionSpec
from ..rules.signals import quantile
from .paired_checks import PairedCheck, PairedEvidence
from .strata import like_rates, request_shape, shape

__all__ = [
    "REGRESSION_ALERT",
    "AnalysisPolicy",
    "CheckResult",
    "DeployAnalyzer",
    "FailedCheck",
    "StoreVersionMetrics",
    "VersionMetrics",
    "VersionStats",
]

REGRESSION_ALERT = "PostDeployRegression"
# an analysis' final state by its rollback's outcome (pending: running elsewhere, ask again)
_AFTER_ROLLBACK = {"succeeded": "rolled_back", "failed": "rollback_failed", "refused": "rollback_refused",
                   "dispatched": "rollback_queued"}  # fmt: skip  # handed to the replicas serving it


@dataclass(frozen=True)
class VersionStats:
    requests: int
    error_rate: float | None  # server errors / requests
    p99_s: float | None  # of the requests that succeeded
    relevance: float | None
    client_errors: int = 0  # refused for the client's fault: not errors
    cancelled: int = 0  # the client hung up: not errors
    # (shape, successful requests, their p99) per stratum of like requests (strata.py's
    # output- and prompt-length buckets): the latency check compares within these
    p99_by_shape: tuple[tuple[str, int, float], ...] = ()
    # (shape, requests, server errors) per stratum of what the requests asked (strata.py's
    # request_shape: max_tokens bucket, stream flag): the error-rate check compares within these
    errors_by_shape: tuple[tuple[str, int, int], ...] = ()


class VersionMetrics(Protocol):
    def stats(self, version: str, since: dt.datetime, until: dt.datetime) -> VersionStats: ...

    def output_drift_p_value(self, new: str, old: str, since: dt.datetime) -> float | None: ...


class StoreVersionMetrics:
    """Per-version figures from the shared `requests` table; output drift from an optional
    callable the service wires to the drift module (None: that check is skipped)."""

    def __init__(
        self, engine: Engine, *, output_drift: Callable[[str, str, dt.datetime], float | None] | None = None
    ) -> None:
        self.engine = engine
        self.output_drift = output_drift

    def stats(self, version: str, since: dt.datetime, until: dt.datetime) -> VersionStats:
        c = requests.c
        q = select(
            c.duration_s, c.error_type, c.relevance, c.prompt_tokens, c.output_tokens, c.max_tokens, c.stream
        ).where(requests.c.model_version == version, *started_in(since, until))
        with self.engine.connect() as conn:
            rows = conn.execute(q).all()
        if not rows:
            return VersionStats(0, None, None, None)
        ok = [r.duration_s for r in rows if r.error_type is None]
        rel = [r.relevance for r in rows if r.relevance is not None]
        by_shape: dict[str, list[float]] = {}
        errors: dict[str, list[int]] = {}
        for r in rows:
            m, st = request_shape(r.max_tokens, r.stream)
            cell = errors.setdefault(f"max{m}/stream{st}", [0, 0])
            cell[0] += 1
            cell[1] += is_server_error(r.error_type)
            if r.error_type is None:
                o, pr, m, st = shape(r.output_tokens, r.prompt_tokens, r.max_tokens, r.stream)
                by_shape.setdefault(f"out{o}/prompt{pr}/max{m}/stream{st}", []).append(r.duration_s)
        return VersionStats(
            len(rows),
            sum(is_server_error(r.error_type) for r in rows) / len(rows),
            quantile(ok, 0.99) if ok else None,
            sum(rel) / len(rel) if rel else None,
            sum(r.error_type == CLIENT_ERROR for r in rows),
            sum(r.error_type == CANCELLED for r in rows),
            tuple((k, len(v), quantile(v, 0.99)) for k, v in sorted(by_shape.items())),
            tuple((k, n, e) for k, (n, e) in sorted(errors.items())),
        )

    def output_drift_p_value(self, new: str, old: str, since: dt.datetime) -> float | None:
        return None if self.output_drift is None else self.output_drift(new, old, since)


@dataclass(frozen=True)
class AnalysisPolicy:
    window_s: float = 1800.0  # how long after a deploy the new version is watched
    interval_s: float = 60.0  # between checks
    baseline_s: float = 1800.0  # the previous version's traffic before the deploy
    max_failed_checks: int = 3
    min_requests: int = 20  # fewer on either side: the check is inconclusive, not failed
    error_rate_margin: float = 0.02
    error_rate_ratio: float = 2.0
    p99_ratio: float = 1.5
    relevance_drop: float = 0.1
    drift_p_value: float = 0.01
    max_rollbacks_per_day: int = 3
    max_hold_s: float = 1800.0  # how long past the window an undecided paired check holds the verdict


@dataclass(frozen=True)
class FailedCheck:
    """One check that failed, with its figures: `value` against `limit` (`previous`: the
    previous version's figure it was derived from, None for output drift)."""

    check: str  # error_rate, p99_latency, relevance, output_drift
    value: float
    limit: float
    previous: float | None
    text: str


@dataclass(frozen=True)
class CheckResult:
    analysis_id: int
    at: dt.datetime
    verdict: str  # passed, failed, inconclusive
    failures: tuple[str, ...]  # the failed checks' texts, with their figures
    new: VersionStats
    old: VersionStats
    output_drift_p_value: float | None
    rollback: ActionOutcome | None = None
    failed_checks: tuple[FailedCheck, ...] = ()
    pairs: int = 0  # pairs of the two versions behind the paired checks
    paired: str = ""  # the paired checks' figures, or why they are off
    deployed_at: dt.datetime | None = None  # the analysed deploy's time: its rollback comes after it


def _compare(
    p: AnalysisPolicy, new: VersionStats, old: VersionStats, drift_p: float | None, *, paired: bool = False,
    paired_latency: bool = False,
) -> tuple[FailedCheck, ...]:  # fmt: skip
    """The unpaired checks; with `paired`, relevance and output drift are left to the pairs,
    and with `paired_latency` latency too (the pairs' step times: both versions timed under
    the same load, where the p99 before against after reads any change of load as the release's)."""
    out = []
    rates = _like_errors(new, old)
    if rates is not None:
        new_rate, old_rate, like = rates
        limit = max(old_rate * p.error_rate_ratio, old_rate + p.error_rate_margin)
        if new_rate > limit:
            text = f"error rate {new_rate:.1%} > {limit:.1%} (previous {old_rate:.1%}){like}"
            out.append(FailedCheck("error_rate", new_rate, limit, old_rate, text))
    latency = None if paired_latency else _like_p99(new, old)
    if latency is not None and latency[0] > latency[1] * p.p99_ratio:
        new_p99, old_p99, like = latency
        text = f"p99 latency {new_p99:.3f}s > {p.p99_ratio:g} x previous {old_p99:.3f}s{like}"
        out.append(FailedCheck("p99_latency", new_p99, old_p99 * p.p99_ratio, old_p99, text))
    if (
        not paired
        and new.relevance is not None
        and old.relevance is not None
        and new.relevance < old.relevance - p.relevance_drop
    ):
        limit = old.relevance - p.relevance_drop
        text = f"mean relevance {new.relevance:.3f} < previous {old.relevance:.3f} - {p.relevance_drop:g}"
        out.append(FailedCheck("relevance", new.relevance, limit, old.relevance, text))
    if not paired and drift_p is not None and drift_p < p.drift_p_value:
        text = f"output drift p = {drift_p:.2g} < {p.drift_p_value:g}"
        out.append(FailedCheck("output_drift", drift_p, p.drift_p_value, None, text))
    return tuple(out)


class DeployAnalyzer:
    def __init__(
        self,
        engine: Engine,
        metrics: VersionMetrics,
        runner: ActionRunner,
        *,
        policy: AnalysisPolicy | None = None,
        clock: Callable[[], float] = time.time,
        owner: str | None = None,
        lease_s: float = 600.0,
        pairs: PairedEvidence | None = None,
    ) -> None:
        self.engine = engine
        self.metrics = metrics
        self.runner = runner
        self.policy = policy or AnalysisPolicy()
        self.clock = clock
        self.owner = owner or f"analysis-{uuid.uuid4().hex[:12]}"
        self.lease_s = lease_s  # longer than a check and its rollback take
        self.pairs = pairs

    def _now(self) -> dt.datetime:
        return dt.datetime.fromtimestamp(self.clock(), dt.UTC)

    def observe(self, event: Any) -> None:
        """Engine subscriber adapter: a `VersionDeployed` with reason "deploy" starts an analysis.
        (Call from a queue consumer, not on the engine's loop thread: it writes to the store.)"""
        if type(event).__name__ == "VersionDeployed" and event.reason == "deploy" and event.from_version:
            self.on_deploy(event.to_version, event.from_version, dt.datetime.fromtimestamp(event.at, dt.UTC))

    def on_deploy(self, to_version: str, from_version: str | None, at: dt.datetime) -> int:
        """Start watching `to_version` (an analysis still running of another version is
        superseded; one of the same deploy, reported by another replica, is returned)."""
        p = self.policy
        with self.engine.begin() as conn:
            if conn.dialect.name == "postgresql":  # replicas reporting one deploy at once: one by one
                conn.execute(text("SELECT pg_advisory_xact_lock(532545539)"))
            same = conn.execute(
                select(deploy_analyses.c.id).where(
                    deploy_analyses.c.state == "running",
                    deploy_analyses.c.to_version == to_version,
                    deploy_analyses.c.from_version.is_not_distinct_from(from_version),
                )
            ).first()
            if same is not None:
                return int(same.id)
            conn.execute(
                update(deploy_analyses).where(deploy_analyses.c.state == "running").values(state="superseded")
            )
            result = conn.execute(
                insert(deploy_analyses).values(
                    to_version=to_version,
                    from_version=from_version,
                    deployed_at=at,
                    ends_at=at + dt.timedelta(seconds=p.window_s),
                    next_check_at=at + dt.timedelta(seconds=p.interval_s),
                    checks=0,
                    failed_checks=0,
                    state="running",
                    evidence="[]",
                )
            )
            pk = result.inserted_primary_key
        assert pk is not None
        if self.pairs is not None and from_version:  # a new analysis: pairs of an earlier deploy do not count
            self.pairs.forget(to_version, from_version)
        return int(pk[0])

    def tick(self) -> list[CheckResult]:
        """Run the checks that are due and that no other replica has claimed."""
        now = self._now()
        free = and_(
            deploy_analyses.c.state == "running",
            deploy_analyses.c.next_check_at <= now,
            or_(deploy_analyses.c.lease_until.is_(None), deploy_analyses.c.lease_until < now),
        )
        due = select(deploy_analyses.c.id).where(free).with_for_update(skip_locked=True)
        claim = (
            update(deploy_analyses)
            .where(deploy_analyses.c.id.in_(due.scalar_subquery()), free)
            .values(lease_owner=self.owner, lease_until=now + dt.timedelta(seconds=self.lease_s))
            .returning(*deploy_analyses.c)
        )
        with self.engine.begin() as conn:
            claimed = sorted(conn.execute(claim).all(), key=lambda r: r.id)
        return [self._check(row, now) for row in claimed]

    def _check(self, row: Any, now: dt.datetime) -> CheckResult:
        p = self.policy
        new = self.metrics.stats(row.to_version, row.deployed_at, now)
        old = (
            self.metrics.stats(
                row.from_version, row.deployed_at - dt.timedelta(seconds=p.baseline_s), row.deployed_at
            )
            if row.from_version
            else VersionStats(0, None, None, None)
        )
        paired_on = self.pairs is not None and self.pairs.enabled and bool(row.from_version)
        drift = (
            self.metrics.output_drift_p_value(row.to_version, row.from_version, row.deployed_at)
            if row.from_version and not paired_on
            else None
        )
        n_pairs, paired_checks = (
            self.pairs.checks(row.to_version, row.from_version)
            if self.pairs is not None and paired_on
            else (0, ())
        )
        paired_failed = tuple(_paired_failure(c) for c in paired_checks if c.regressed)
        failed_checks: tuple[FailedCheck, ...] = ()
        if new.requests < p.min_requests or old.requests < p.min_requests:
            failed_checks = paired_failed  # always-valid: a paired regression needs no minimum
            verdict = "failed" if failed_checks else "inconclusive"
        else:
            paired_latency = paired_on and self.pairs is not None and self.pairs.step_times
            failed_checks = (
                *_compare(p, new, old, drift, paired=paired_on, paired_latency=paired_latency),
                *paired_failed,
            )
            verdict = "failed" if failed_checks else "passed"
        if paired_on:
            paired = (
                f"{n_pairs} pairs: " + "; ".join(c.describe() for c in paired_checks)
                if paired_checks
                else "0 pairs yet"
            )
        else:
            paired = self.pairs.off_reason if self.pairs is not None else "paired checks off"
        failures = tuple(f.text for f in failed_checks)
        failed = row.failed_checks + (verdict == "failed")
        evidence = [
            *json.loads(row.evidence),
            {
                "at": now.isoformat(),
                "verdict": verdict,
                "failures": list(failures),
                "failed_checks": [asdict(f) for f in failed_checks],
                "new": asdict(new),
                "old": asdict(old),
                "output_drift_p_value": drift,
                "pairs": n_pairs,
                "paired": paired,
            },
        ]
        state = "running"
        rollback = None
        if failed >= p.max_failed_checks:
            # the state says what happened, so it is written once the rollback's outcome is known
            # (a crash before then leaves it running: the next check asks the runner again, by key)
            rollback = self._roll_back(row, failed_checks, evidence, now, n_pairs, paired_on, paired)
            state = _AFTER_ROLLBACK.get(rollback.state, "running")
        elif now >= row.ends_at:
            held = self._undecided(paired_checks, n_pairs) if paired_on else ()
            # a check failing now is not passed either: the next one may confirm it
            if (held or verdict == "failed") and now < row.ends_at + dt.timedelta(seconds=p.max_hold_s):
                evidence[-1]["held"] = (
                    "a check failed: held past the window for the next one"
                    if not held
                    else f"{', '.join(held)} not decided after {n_pairs} pairs: held past the window until it "
                    f"is, or {self.pairs.policy.max_pairs if self.pairs else 0} pairs, or {p.max_hold_s:g} s "
                    "past the window's end"
                )
            else:
                state = "passed"
                if held:
                    evidence[-1]["held"] = f"{', '.join(held)} still undecided after {n_pairs} pairs: passed"
        with self.engine.begin() as conn:
            conn.execute(
                update(deploy_analyses)
                .where(deploy_analyses.c.id == row.id)
                .values(
                    checks=row.checks + 1,
                    failed_checks=failed,
                    state=state,
                    evidence=json.dumps(evidence),
                    next_check_at=now + dt.timedelta(seconds=p.interval_s),
                    lease_owner=None,
                    lease_until=None,
                )
            )
        return CheckResult(
            row.id, now, verdict, failures, new, old, drift, rollback, failed_checks, n_pairs, paired,
            row.deployed_at,
        )  # fmt: skip

    def _undecided(self, checks: tuple[PairedCheck, ...], n_pairs: int) -> tuple[str, ...]:
        """The checks the pair policy wants decided that measured pairs and neither regressed
        nor cleared, while the comparison is under the policy's pair limit."""
        if self.pairs is None or n_pairs >= self.pairs.policy.max_pairs:
            return ()
        decide = self.pairs.policy.decide
        return tuple(
            c.name for c in checks if c.name in decide and c.pairs > 0 and not c.regressed and not c.cleared
        )

    def _roll_back(
        self, row: Any, failed_checks: tuple[FailedCheck, ...], evidence: list[Any], now: dt.datetime,
        n_pairs: int, paired_on: bool, paired: str,
    ) -> ActionOutcome:  # fmt: skip
        """The verdict's one path: the page is raised from it first, then the action runner rolls
        back (once per analysis: its key), then the same page says what the rollback did."""
        failures = [f.text for f in failed_checks]
        basis = f"{n_pairs} pairs" if paired_on else paired  # the page says what the verdict rests on
        labels = {
            "severity": "critical",
            "model_version": row.to_version,
            "previous_version": row.from_version or "",
            "failed_checks": ",".join(f.check for f in failed_checks),
        }

        def page(done: str) -> None:
            with self.engine.begin() as conn:
                push_alert(
                    conn,
                    REGRESSION_ALERT,
                    labels,
                    {
                        "summary": f"{row.to_version} regressed against {row.from_version} after deploy: {'; '.join(failures)} ({basis}); {done}",
                        "failed_checks": "; ".join(failures),
                        "pairs": str(n_pairs),
                        "evidence": json.dumps(evidence[-self.policy.max_failed_checks :]),
                        "runbook_url": "https://runbooks.example.org/infersight#post-deploy-regression",
                    },
                    now=now,
                    ends_at=now + dt.timedelta(hours=1),
                )

        page("rolling back to the previous version")
        spec = ActionSpec("rollback", cooldown_s=0.0, daily_cap=self.policy.max_rollbacks_per_day)
        outcome = self.runner.run(
            spec,
            trigger="analysis",
            key=f"analysis-{row.id}",
            alertname=REGRESSION_ALERT,
            labels={"model_version": row.to_version},
        )
        page(rollback_done(outcome))
        return outcome


def rollback_done(outcome: ActionOutcome) -> str:
    """What a rollback did, in the words of the page that asked for it."""
    return {
        "succeeded": f"rolled back to {outcome.after_version}",
        "failed": "ROLLBACK FAILED",
        "refused": f"not rolled back: {outcome.detail.get('reason', 'refused')}",
    }.get(outcome.state, f"rollback {outcome.state}")


def _paired_failure(check: PairedCheck) -> FailedCheck:
    """A paired check that regressed, as the analysis records it (`value`: the mean per-pair
    figure; `limit`: its null, 0 for a difference)."""
    return FailedCheck(
        check.name, check.mean if check.mean is not None else 0.0, check.null, None, check.describe()
    )


_MIN_STRATUM = 5  # successful requests of a shape on each side before its p99 is compared


def _like_errors(new: VersionStats, old: VersionStats) -> tuple[float, float, str] | None:
    """(new error rate, previous error rate, how compared) within strata of what the requests
    asked (max_tokens bucket, stream flag), standardised Mantel-Haenszel style to the strata
    both sides have: a shape with a higher base error rate that only one side was asked for
    carries no weight. None when they share no stratum; without strata (figures from
    elsewhere than the store) the overall rates."""
    if not new.errors_by_shape and not old.errors_by_shape:
        if new.error_rate is None or old.error_rate is None:
            return None
        return new.error_rate, old.error_rate, ""
    before = {k: (n, e) for k, n, e in old.errors_by_shape}
    after = {k: (n, e) for k, n, e in new.errors_by_shape}
    cells = {}
    for k in {*before, *after}:
        (n1, e1), (n0, e0) = after.get(k, (0, 0)), before.get(k, (0, 0))
        cells[k] = (e1, n1, e0, n0)
    rates = like_rates(cells)
    if rates is None:
        return None
    new_rate, old_rate, shared = rates
    if len(cells) == 1:
        return new_rate, old_rate, ""
    return new_rate, old_rate, f" on requests of the same shape ({shared} of {len(after)} shapes)"


def _like_p99(new: VersionStats, old: VersionStats) -> tuple[float, float, str] | None:
    """(new p99, previous p99, how compared) over requests of the same shape only: per stratum
    both sides have, weighted geometric means (weights n_new n_old / (n_new + n_old), as
    Mantel-Haenszel's), so a change in what clients ask (longer answers after the deploy)
    is not read as the release being slower. None when no shape has enough on both sides;
    without strata (figures from elsewhere than the store) the overall p99s."""
    if not new.p99_by_shape and not old.p99_by_shape:
        if new.p99_s is None or old.p99_s is None:
            return None
        return new.p99_s, old.p99_s, ""
    before = {k: (n, v) for k, n, v in old.p99_by_shape if n >= _MIN_STRATUM and v > 0}
    pairs = [
        (n, v, *before[k]) for k, n, v in new.p99_by_shape if k in before and n >= _MIN_STRATUM and v > 0
    ]
    if not pairs:
        return None
    weights = [n1 * n0 / (n1 + n0) for n1, _, n0, _ in pairs]
    total = sum(weights)
    log_new = sum(w * math.log(v1) for w, (_, v1, _, _) in zip(weights, pairs, strict=True)) / total
    log_old = sum(w * math.log(v0) for w, (_, _, _, v0) in zip(weights, pairs, strict=True)) / total
    like = f" on requests of the same shape ({len(pairs)} of {len(new.p99_by_shape)} shapes)"
    return math.exp(log_new), math.exp(log_old), like
