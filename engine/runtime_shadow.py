"""Paired answers: a share of live requests also answered by the other version, bounded.

While two versions are worth comparing (a canary beside the stable version, or the previous
version kept loaded for a while after a deploy), a share of the live requests (`share`,
chosen by a hash of the request id) is also run on the other version with the same chat,
rendered in its own version's template (`Runtime.submit`'s `prompts_by_version`; the same
prompt ids when the two templates agree or the caller gave one prompt), and the same token
budget, sampling parameters and seed: a release that changes only its template answers
differently in its pairs too. Only the live answer goes to the client; when
both have finished the runtime tells its subscribers a `PairCompleted` with both answers,
so a release check can compare the two versions on the same requests: nothing a client
chooses (its parameters, its prompts, when it asks) can differ between the two sides.

The shadow work is bounded and never delays a live request:
- a shadow waits in its own queue on the other version's replica (`Replica.shadow_queue`)
  and is admitted only in a step where no live request waits, into at most `slots` of
  that replica's batch slots;
- it is dropped, and counted (`ShadowStats.dropped`), when `max_pending` live requests
  (default: a batch) are waiting at submit, or as many shadows wait already; one not finished `max_age_s` after it was
  asked for (its replica went away) is dropped too;
- a live request the client hangs up on takes its shadow with it (`discarded`).

A pair also carries each version's decode step time at a batch size both ran in their
last steps (`PairCompleted.live_step_s`, `other_step_s`): one loop steps both replicas in
turn, so the two are timed under the same load, which a before-against-after latency
comparison cannot say.

A pair also carries how likely each version finds both answers, for the release's
`divergence` check (alerts/release/paired_checks.py): the loop sums the log-probability
(temperature 1, of the raw logits) of every token each side samples (`Request.logprob`, kept
only for a pair's two sides: one gather per batch that has one), and once both have finished
each answer is read by the other version: one teacher-forced forward pass on the other
side's replica, after that side's own prompt (`live_under_other`, `other_under_live`). Those
two passes per pair are bounded like the shadows: the completed pair waits in a queue of
`max_scoring`, and the loop reads at most one pair per step, in a step where no live
request waits, or, while live requests keep waiting, one that has waited `overdue_s` (a
second) already (`run_one`, the loop's `IdleWork`): a busy loop pays at most about one
pair's two passes a second for them. The pair is told when read, or without the
cross sums (`ShadowStats.unread`) when the queue is full, it waited `read_wait_s` (5 s: the
release checks read a pair's other figures now rather than wait on a loop too busy to read
it), a replica
went away or a pass failed: a pair is never lost for them.

The shadow's own events never reach subscribers: it is not traffic. The engine knows
nothing of what the pairs are checked for (alerts/release/paired_checks.py does that).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import random
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from .errors import InvalidArgument, RuntimeNotRunning
from .events import EngineEvent, PairCompleted, RequestFinished
from .replica import Replica, Request
from .requests import RequestHandle
from .runtime_canary import user_bucket
from .runtime_loop import Swap, apply_swap

if TYPE_CHECKING:
    from .deploy import RuntimeHost

__all__ = ["PAIR_SUFFIX", "ShadowControl", "ShadowStats"]

PAIR_SUFFIX = "#pair"  # a shadow's request id: the live one's with this suffix
_STEP_FRESH = 100  # a batch size a replica ran within this many of its steps is timed now


@dataclass(frozen=True)
class ShadowStats:
    """Counts since the runtime was made: live requests given a shadow (`paired`), pairs
    told to subscribers (`completed`), shadows dropped for want of room or time or because
    their prompt does not fit the other version (`dropped`), shadows let go because their
    live request failed or was cancelled (`discarded`), and completed pairs told without
    their cross log-probabilities (`unread`: the scoring queue was full, a job waited past
    `read_wait_s`, a replica went away or a pass failed)."""

    paired: int
    completed: int
    dropped: int
    discarded: int
    waiting: int  # pairs not finished yet
    kept_version: str | None  # the previous version kept loaded after a deploy, if any
    unread: int = 0


@dataclass(eq=False, slots=True)
class _Pair:
    live: Request
    shadow: Request
    other: str  # the shadow's version
    asked: float  # time.monotonic()
    live_finish: str | None = None  # a FinishReason, or "failed"
    shadow_finish: str | None = None


@dataclass(eq=False, slots=True)
class _Scoring:
    """A completed pair waiting for each answer to be read by the other version."""

    event: PairCompleted  # told as it is when it cannot be scored
    live: Request
    shadow: Request
    asked: float  # time.monotonic() when it was queued


class ShadowControl:
    """The runtime's handle for paired answers (`runtime.shadow`)."""

    def __init__(
        self,
        runtime: RuntimeHost,
        *,
        share: float = 0.1,
        keep_previous_s: float = 0.0,
        max_pending: int | None = None,
        max_age_s: float = 120.0,
        max_scoring: int = 64,
        overdue_s: float = 1.0,
        read_wait_s: float = 5.0,
    ) -> None:
        """`share`: of live requests paired while two versions are loaded (0 turns pairs off);
        `keep_previous_s`: after a deploy, how long the previous version stays loaded beside
        the new one to answer shadows (0: dropped at once, as before); `max_pending`: shadows waiting at once (default the batch size);
        `max_scoring`: completed pairs waiting for their cross log-probabilities (more are told without them);
        `overdue_s`: a pair waiting longer than this is read in the next step even while live
        requests wait (one a step), so a steadily busy loop still tells its pairs within about
        that long: the release checks decide on them, and a pair held back is evidence lost."""
        self._runtime = runtime
        self.share = float(share)
        self.keep_previous_s = float(keep_previous_s)
        self.max_pending = max_pending
        self.max_age_s = float(max_age_s)
        self.max_scoring = int(max_scoring)
        self.overdue_s = float(overdue_s)
        self.read_wait_s = float(read_wait_s)  # a pair not read by then is told without the cross sums
        self._lock = threading.Lock()
        self._scoring: collections.deque[_Scoring] = collections.deque()
        self._unread = 0
        self._pairs: dict[str, _Pair] = {}  # by the live request id
        self._shadows: dict[str, _Pair] = {}  # by the shadow's request id
        self._kept_until: float | None = None
        self._paired = self._completed = self._dropped = self._discarded = 0

    # -- configuration ------------------------------------------------------------------

    def configure(
        self, *, share: float | None = None, keep_previous_s: float | None = None, slots: int | None = None
    ) -> None:
        if share is not None:
            if not 0.0 <= share <= 1.0:
                raise InvalidArgument(f"pair share must lie in [0, 1], got {share!r}")
            self.share = float(share)
        if keep_previous_s is not None:
            self.keep_previous_s = max(0.0, float(keep_previous_s))
        if slots is not None:  # the batch slots shadows may hold on one replica (default: a quarter)
            self._runtime._state.shadow_slots = max(1, int(slots))

    def stats(self) -> ShadowStats:
        kept = self._runtime._state.shadow
        with self._lock:
            return ShadowStats(self._paired, self._completed, self._dropped, self._discarded, len(self._pairs),
                               kept.version if kept is not None else None, self._unread)  # fmt: skip

    # -- the previous version, kept beside after a deploy ---------------------------------

    def after_deploy(self, previous: Replica | None, reason: str) -> None:
        """A deploy swapped `previous` out: keep it loaded `keep_previous_s` for pairs when the
        deploy is a release ("deploy"); any other change (a rollback, a failover) lets the
        kept one go."""
        keep = previous is not None and reason == "deploy" and self.keep_previous_s > 0.0 and self.share > 0.0
        self._set_kept(previous if keep else None)

    def release(self) -> None:
        """Let the kept previous version go now (its running shadows finish first)."""
        self._set_kept(None)

    def _set_kept(self, replica: Replica | None) -> None:
        state = self._runtime._state
        if replica is None and state.shadow is None:
            return
        self._kept_until = time.monotonic() + self.keep_previous_s if replica is not None else None
        swap = Swap(replica=replica, reason="shadow", kind="shadow")
        if replica is None:
            state.request_swap(swap)  # a release: from a submitting thread too, never waited for
        else:  # kept before deploy() returns: the first request after it is already paired
            with contextlib.suppress(RuntimeNotRunning):  # stopped meanwhile: nothing to keep
                apply_swap(state, self._runtime._thread, swap, "keeping the previous version")

    # -- pairing (the submitting thread) --------------------------------------------------

    def pair(
        self, request: Request, live: Replica, prompt_for: Callable[[Replica], list[int] | None] | None = None
    ) -> None:
        """Called by `Runtime.submit` before `request` is queued on `live`: maybe queue its
        shadow on the other version, with the prompt `prompt_for(other)` gives (the same chat
        in that version's own template; default: the live prompt), not at all when that is
        None (it does not fit the other version: dropped). Sets a seed on a sampled request
        that has none, the same on both sides (the client's answer is drawn from the same
        distribution)."""
        other = self._other(live)
        if other is None or self.share <= 0.0:
            return
        if user_bucket(request.request_id, PAIR_SUFFIX) >= self.share:
            return
        state = self._runtime._state
        now = time.monotonic()
        pending = self.max_pending if self.max_pending is not None else other.max_batch
        self._expire(now)
        waiting = len(state.queue) + len(state.canary_queue)
        prompt = prompt_for(other) if prompt_for is not None else request.prompt_ids
        if prompt is None or waiting >= pending or len(other.shadow_queue) >= pending:
            with self._lock:
                self._dropped += 1  # no room (live requests first, always), or no prompt it takes
            return
        if request.temperature > 0.0 and request.seed is None:
            request.seed = random.getrandbits(62)
        sid = request.request_id + PAIR_SUFFIX
        shadow = Request(
            request_id=sid, prompt_ids=list(prompt), max_new_tokens=request.max_new_tokens,
            temperature=request.temperature, top_p=request.top_p, seed=request.seed, priority=request.priority,
            handle=RequestHandle(sid, other.version, lambda _h: None), arrival=now, shadow=True,
        )  # fmt: skip
        entry = _Pair(request, shadow, other.version, now)
        request.logprob = shadow.logprob = 0.0  # both sides' tokens' log-probabilities are summed
        with self._lock:
            self._pairs[request.request_id] = entry
            self._shadows[sid] = entry
            self._paired += 1
        other.shadow_queue.push(shadow)

    def _other(self, live: Replica) -> Replica | None:
        state = self._runtime._state
        if live is state.fast:
            return None  # SLA routing's fast path serves another population: nothing to pair
        if state.canary is not None:
            return state.current if live is state.canary else state.canary
        kept = state.shadow
        if kept is None or live is not state.current or kept.version == live.version:
            return None
        if self._kept_until is None or time.monotonic() > self._kept_until:
            self.release()  # let go (or being let go): no new shadow for it
            return None
        return kept

    def _expire(self, now: float) -> None:
        with self._lock:
            old = [e for e in self._pairs.values() if now - e.asked > self.max_age_s]
            for entry in old:
                self._forget(entry)
                entry.shadow.finished = True  # never admitted now
                self._dropped += 1

    def _forget(self, entry: _Pair) -> None:
        self._pairs.pop(entry.live.request_id, None)
        self._shadows.pop(entry.shadow.request_id, None)

    # -- events (the loop thread) ---------------------------------------------------------

    def observe(self, event: EngineEvent) -> bool:
        """Called with every event before subscribers see it: True for a shadow's own event
        (kept from subscribers). Notes how each side of a pair ended and, when both have,
        posts the `PairCompleted`."""
        if not self._paired:
            return False  # no pair was ever asked for: nothing to look at
        rid = getattr(event, "request_id", None)
        if rid is None:
            return False
        own = rid.endswith(PAIR_SUFFIX)  # a shadow's event: never traffic, even once forgotten
        kind = type(event).__name__
        if kind not in ("RequestFinished", "RequestFailed"):
            return own
        with self._lock:
            entry = self._shadows.get(rid) if own else self._pairs.get(rid)
            if entry is None:
                return own
            finish = event.finish_reason if isinstance(event, RequestFinished) else "failed"
            if own:
                entry.shadow_finish = finish
            else:
                entry.live_finish = finish
            done = self._settle(entry)
        if done is not None:
            self._score_later(_Scoring(done, entry.live, entry.shadow, time.monotonic()))
        return own

    def _settle(self, entry: _Pair) -> PairCompleted | None:
        # with self._lock held
        if entry.live_finish in ("cancelled", "failed"):  # the client's answer did not happen
            self._forget(entry)
            self._discarded += 1
            if entry.shadow_finish is None:
                if entry.shadow.replica is None:
                    entry.shadow.finished = True  # still queued: never admitted
                else:
                    self._runtime._state.cancel(entry.shadow)
            return None
        if entry.shadow_finish in ("cancelled", "failed"):
            self._forget(entry)
            self._dropped += 1
            return None
        if entry.live_finish is None or entry.shadow_finish is None:
            return None
        self._forget(entry)
        self._completed += 1
        live, shadow = entry.live, entry.shadow
        return PairCompleted(
            request_id=live.request_id, live_version=live.version or live.handle.model_version,
            other_version=entry.other, at=time.time(), prompt_ids=tuple(live.prompt_ids),
            other_prompt_ids=tuple(shadow.prompt_ids),
            max_new_tokens=live.max_new_tokens, live_tokens=tuple(live.tokens),
            other_tokens=tuple(shadow.tokens), live_finish=entry.live_finish,
            other_finish=entry.shadow_finish, seed=live.seed if live.temperature > 0.0 else None,
            live_logprob=live.logprob, other_logprob=shadow.logprob, **_step_times(live.replica, shadow.replica),
        )  # fmt: skip

    # -- reading each answer by the other version (the loop thread, when idle) --------------

    def _score_later(self, job: _Scoring) -> None:
        """Queue a completed pair for its cross log-probabilities; told without them at once when
        `max_scoring` wait already (never lost, never waited for)."""
        with self._lock:
            stale = self._stale(job.asked)
            full = len(self._scoring) >= self.max_scoring
            if full:
                self._unread += 1
            else:
                self._scoring.append(job)
        for event in [*stale, *([job.event] if full else [])]:
            self._runtime._state.post(event)
        self._runtime._state.wake.set()

    def _stale(self, now: float) -> list[PairCompleted]:
        # with self._lock held: jobs that waited past read_wait_s (the loop read slower than pairs came), told without them
        out: list[PairCompleted] = []
        while self._scoring and now - self._scoring[0].asked > self.read_wait_s:
            out.append(self._scoring.popleft().event)
            self._unread += 1
        return out

    def run_one(self, *, overdue_only: bool = False) -> bool:
        """`IdleWork`: called by the loop in every step, with `overdue_only` when live requests
        wait. Reads one pair's answers by the other version (two teacher-forced passes) and
        tells the pair; with `overdue_only`, only a pair that waited `overdue_s` already."""
        if not self._scoring:  # every step asks: the common answer without the lock
            return False
        if overdue_only and time.monotonic() - self._scoring[0].asked < self.overdue_s:
            return False
        with self._lock:
            stale = self._stale(time.monotonic())
            job = self._scoring.popleft() if self._scoring else None
        for event in stale:
            self._runtime._state.post(event)
        if job is None:
            return bool(stale)
        scored = self._scored(job)
        if scored is None:
            with self._lock:
                self._unread += 1
        self._runtime._state.post(scored or job.event)
        return True

    def give_up(self) -> None:
        """`IdleWork`: the loop ends: every pair still waiting is told without them."""
        with self._lock:
            jobs, self._scoring = list(self._scoring), collections.deque()
            self._unread += len(jobs)
        for job in jobs:
            self._runtime._state.post(job.event)

    def _scored(self, job: _Scoring) -> PairCompleted | None:
        """The pair with `live_under_other` and `other_under_live`, or None when a replica
        went away, a sequence does not fit, or a pass failed."""
        live, other = job.live.replica, job.shadow.replica
        state = self._runtime._state
        serving = [state.current, state.canary, state.shadow, state.fast, *state.draining]
        if (
            live is None
            or other is None
            or not any(r is live for r in serving)
            or not any(r is other for r in serving)
        ):
            return None
        try:  # each side's replica reads the other's answer after its own prompt
            live_under_other = _read(other, job.shadow.prompt_ids, job.live.tokens)
            other_under_live = _read(live, job.live.prompt_ids, job.shadow.tokens)
        except Exception:  # a failed pass costs the pair its scores, never serving
            return None
        if live_under_other is None or other_under_live is None:
            return None
        return dataclasses.replace(
            job.event, live_under_other=live_under_other, other_under_live=other_under_live
        )


def _read(replica: Replica, prompt: Sequence[int], answer: Sequence[int]) -> float | None:
    """Sum of log-probabilities (temperature 1) of `answer` after `prompt` under `replica`'s
    model, by one full forward (None: empty prompt, or longer than its `max_seq_len`)."""
    if not answer:
        return 0.0
    if not prompt or len(prompt) + len(answer) > replica.max_seq_len:
        return None
    ids = torch.tensor([[*prompt, *answer]], dtype=torch.long, device=replica.device)  # [1, P+N]
    logits = replica.model.logits(ids)[0, len(prompt) - 1 : -1]  # [N, V]: each predicts the next token
    lsm = torch.log_softmax(logits.float(), dim=-1)
    return float(lsm.gather(1, ids[0, len(prompt) :, None]).sum().item())


def _step_times(live: Replica | None, other: Replica | None) -> dict[str, float]:
    """Both replicas' decode step at the smallest batch size both ran within their last
    `_STEP_FRESH` steps ({} when they have none in common)."""
    if live is None or other is None or live is other:
        return {}
    a, b = live.step_times.recent_decode_s(_STEP_FRESH), other.step_times.recent_decode_s(_STEP_FRESH)
    common = sorted(a.keys() & b.keys())
    if not common:
        return {}
    return {"live_step_s": a[common[0]], "other_step_s": b[common[0]]}
