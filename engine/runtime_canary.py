"""A canary: a candidate version serving beside the stable one, on a share of the traffic.

The candidate gets its own replica (own KV cache, own batch, own pending queue), so the two
versions never share a batch or a cache. Traffic is assigned per request by a hash of the
user key (the OpenAI `user` field, or a header the service names) salted with the
candidate's name: the same user always lands on the same version while the weight stays,
and raising the weight only moves users from stable to canary (a user's hash is compared
with the weight, so a user under 10% is still under 50%). A request without a user key is
assigned by its request id. A request is assigned once, at submit, and never moves to the
other version while it runs: an aborted canary finishes the requests it started.

`CanaryControl` is the runtime's handle for it (`runtime.canary`); the decisions (when to
promote, when to roll back) belong to the analysis in alerts/release/canary.py.

The canary's state lives in the registry's deploy history (every start, step, promotion and
rollback is a record with its weight), not only in this process: `open_canary` reads the
canary the history leaves running, and `Runtime.start` resumes it (same version, weight,
start time and user assignment) when the restarted runtime serves its stable version, or
records it as rolled back when it does not.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

from .deploy import DeployOutcome, RuntimeHost
from .errors import CanaryRunning, EngineError, InvalidCanaryWeight, NoCanary, RuntimeNotRunning
from .events import CanaryChanged
from .registry import DeployRecord, Outcome
from .runtime_loop import Swap, apply_swap

__all__ = ["CanaryControl", "CanaryStatus", "open_canary", "user_bucket"]


def user_bucket(key: str, salt: str) -> float:
    """A number in [0, 1) fixed by `key` and `salt`, uniform over keys."""
    digest = hashlib.sha256(f"{salt}\x00{key}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64


def check_weight(weight: float) -> float:
    value = float(weight)
    if not (0.0 < value <= 1.0):
        raise InvalidCanaryWeight(f"canary weight must lie in (0, 1], got {weight!r}")
    return value


@dataclass(frozen=True)
class CanaryStatus:
    version: str
    stable_version: str
    weight: float
    started_at: float


def open_canary(records: Sequence[DeployRecord]) -> CanaryStatus | None:
    """The canary that `records` (oldest first) leave running, with its latest weight: one
    started and neither rolled back, promoted nor replaced by a deploy since. A restart
    ("start") does not end it: that is what `Runtime.start` resumes."""
    status: CanaryStatus | None = None
    for r in records:
        if r.reason == "canary" and r.outcome in ("started", "resumed") and r.from_version:
            weight = r.weight if r.weight is not None else 0.0
            started = status.started_at if r.outcome == "resumed" and status is not None else r.at
            status = CanaryStatus(r.to_version, r.from_version, weight, started)
        elif r.reason == "canary" and r.outcome == "reweighted" and status is not None:
            weight = r.weight if r.weight is not None else status.weight
            status = CanaryStatus(status.version, status.stable_version, weight, status.started_at)
        elif r.outcome == "rolled_back" or (r.outcome == "deployed" and r.reason != "start"):
            status = None
    return status if status is not None and status.weight > 0.0 else None


class CanaryControl:
    def __init__(self, runtime: RuntimeHost) -> None:
        self._runtime = runtime
        self._lock = threading.Lock()
        self._status: CanaryStatus | None = None

    @property
    def status(self) -> CanaryStatus | None:
        return self._status

    def route(self, user: str | None, request_id: str) -> bool:
        """True when this request goes to the canary."""
        status = self._status
        if status is None or self._runtime._state.canary is None:
            return False
        return (
            user_bucket(user if user is not None else f"request:{request_id}", status.version) < status.weight
        )

    def start(self, version: str, weight: float, *, resumed_from: float | None = None) -> DeployOutcome:
        """Load `version` beside the serving one (verified and warmed up like a deploy) and
        send it `weight` of the users. Raises InvalidCanaryWeight, CanaryRunning or a
        DeployRefused subclass; the stable version keeps serving all traffic then.
        `resumed_from`: the start time of the canary a restart resumes (`resume`)."""
        weight = check_weight(weight)
        runtime = self._runtime
        with runtime._deploy_lock:
            stable = runtime.serving_version
            if not runtime.is_running or stable is None:
                raise RuntimeNotRunning("runtime is not serving: call start() first")
            if self._status is not None:
                running = self._status.version
                runtime._refused(
                    CanaryRunning(f"canary {running} is running: promote or abort it first",
                                  version=version, reason="canary running"),
                    stable, to_version=version, reason="canary",
                )  # fmt: skip
            replica, prepared = runtime._prepare(version, "canary", from_version=stable)
            swap = self._apply(Swap(replica=replica, reason="canary", kind="canary"), version)
            started = swap.at if resumed_from is None else resumed_from
            self._status = CanaryStatus(version, stable, weight, started)
            message = f"canary at {weight:.0%} of users"
            outcome: Outcome = "started" if resumed_from is None else "resumed"
            if resumed_from is not None:
                message += " (resumed after a restart)"
            self._note(DeployRecord(swap.at, stable, version, "canary", outcome, message, weight), weight)
            return DeployOutcome(
                stable, version, "canary", swap.at, prepared.verify_s, prepared.load_s, prepared.warmup_s
            )

    def set_weight(self, weight: float) -> CanaryStatus:
        weight = check_weight(weight)
        with self._runtime._deploy_lock:
            status = self._require()
            self._status = CanaryStatus(status.version, status.stable_version, weight, status.started_at)
            self._note(DeployRecord(time.time(), status.stable_version, status.version, "canary", "reweighted",
                                    f"canary at {weight:.0%} of users", weight), weight)  # fmt: skip
            return self._status

    def promote(self, message: str = "") -> DeployOutcome:
        """The canary becomes the serving version for all traffic; the old one drains."""
        with self._runtime._deploy_lock:
            status = self._require()
            swap = self._apply(Swap(replica=None, reason="canary-promote", kind="promote"), status.version)
            self._status = None
            self._runtime.registry.history.record(
                DeployRecord(
                    swap.at, status.stable_version, status.version, "canary-promote", "deployed", message
                )
            )
            return DeployOutcome(
                status.stable_version, status.version, "canary-promote", swap.at, 0.0, 0.0, 0.0
            )

    def abort(self, message: str = "") -> CanaryStatus:
        """Roll the canary back: it takes no new request, finishes those it started, and
        the stable version serves everyone. `message` (the check and its figures) goes
        into the deploy history."""
        with self._runtime._deploy_lock:
            status = self._require()
            swap = self._apply(Swap(replica=None, reason="canary-rollback", kind="abort"), status.version)
            self._status = None
            record = DeployRecord(
                swap.at, status.version, status.stable_version, "canary", "rolled_back", message, 0.0
            )
            self._note(record, 0.0)
            return status

    def resume(self, pending: CanaryStatus | None) -> CanaryStatus | None:
        """After a restart: start again the canary the deploy history left open (`open_canary`;
        the restart's own "start" record does not close it), when the runtime serves its stable
        version. Otherwise, or when the candidate is refused now, the canary is recorded as
        rolled back, with why; the stable version serves everyone. Never raises."""
        runtime = self._runtime
        if pending is None:
            return None
        serving = runtime.serving_version
        if serving == pending.stable_version:
            try:
                self.start(pending.version, pending.weight, resumed_from=pending.started_at)
                return self._status
            except EngineError as exc:
                why = f"not resumed after a restart: {type(exc).__name__}: {exc}"
        else:
            why = f"not resumed after a restart: serving {serving}, not its stable {pending.stable_version}"
        record = DeployRecord(
            time.time(), pending.version, pending.stable_version, "canary", "rolled_back", why, 0.0
        )
        self._note(record, 0.0)
        return None

    def _note(self, record: DeployRecord, weight: float) -> None:
        """Into the registry's deploy history and, as a `CanaryChanged`, to subscribers."""
        runtime = self._runtime
        runtime.registry.history.record(record)
        canary, stable = (
            (record.to_version, record.from_version or "")
            if record.outcome != "rolled_back"
            else (record.from_version or "", record.to_version)
        )
        runtime._state.post(CanaryChanged(canary, stable, record.at, record.outcome, weight, record.message))
        runtime._state.wake.set()

    def _require(self) -> CanaryStatus:
        status = self._status
        if status is None:
            raise NoCanary("no canary is running", version="", reason="no canary")
        return status

    def _apply(self, swap: Swap, version: str) -> Swap:
        runtime = self._runtime
        return apply_swap(runtime._state, runtime._thread, swap, f"the canary {version} change")
