"""What the serving runtime tells its subscribers.

The monitor observes the engine through these events and nothing else: the engine
never imports the monitor. A subscriber is any `Callable[[EngineEvent], None]`
registered with `Runtime.subscribe`; it is called on the engine's loop thread, so it
must be quick (append to a queue, observe a histogram). An exception raised by a
subscriber is counted and swallowed, never propagated into serving.

Timestamps `at` are wall-clock seconds since the epoch (`time.time()`); durations are
measured with a monotonic clock and given in seconds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = [
    "BreakerChanged",
    "CanaryChanged",
    "DeployFailed",
    "EngineEvent",
    "FinishReason",
    "PairCompleted",
    "RequestFailed",
    "RequestFinished",
    "RequestQueued",
    "RequestStarted",
    "TokenEmitted",
    "VersionDeployed",
]

FinishReason = Literal["stop", "length", "cancelled"]


@dataclass(frozen=True, slots=True)
class RequestQueued:
    request_id: str
    model_version: str
    at: float
    prompt_tokens: int
    priority: int


@dataclass(frozen=True, slots=True)
class RequestStarted:
    """The request left the queue and joined the running batch (prefill begins)."""

    request_id: str
    model_version: str
    at: float
    queue_s: float


@dataclass(frozen=True, slots=True)
class TokenEmitted:
    """One output token. `index` 0 is the first token; `since_start_s` is measured from
    arrival (so for index 0 it is the time to first token)."""

    request_id: str
    model_version: str
    at: float
    index: int
    token_id: int
    since_start_s: float


@dataclass(frozen=True, slots=True)
class RequestFinished:
    request_id: str
    model_version: str
    at: float
    prompt_tokens: int
    output_tokens: int
    queue_s: float
    ttft_s: float | None  # None when no token was produced (cancelled before the first)
    duration_s: float  # arrival to last token
    finish_reason: FinishReason
    # of duration_s, the seconds the loop spent on other versions' forwards while this request
    # ran (a canary's or a shadow's): its version's own latency is duration_s - others_s
    others_s: float = 0.0


@dataclass(frozen=True, slots=True)
class RequestFailed:
    request_id: str
    model_version: str
    at: float
    error_type: str  # the exception's class name, e.g. "PromptTooLong"
    message: str


@dataclass(frozen=True, slots=True)
class VersionDeployed:
    """The serving version changed (a deploy, a failover or a rollback completed)."""

    from_version: str | None
    to_version: str
    at: float
    reason: str  # "deploy", "rollback", "failover", "start"


@dataclass(frozen=True, slots=True)
class DeployFailed:
    """A deploy was refused; `serving_version` kept serving throughout."""

    version: str
    serving_version: str | None
    at: float
    reason: str


@dataclass(frozen=True, slots=True)
class CanaryChanged:
    """A canary started, changed weight or was rolled back (its promotion is a `VersionDeployed`
    with reason "canary-promote"); `detail` names the check and its figures."""

    version: str
    stable_version: str
    at: float
    action: str  # "started", "reweighted", "rolled_back"
    weight: float
    detail: str


@dataclass(frozen=True, slots=True)
class BreakerChanged:
    """SLA routing: a path's length breaker changed state (engine/routing.py)."""

    path: str
    state: str  # "closed", "open", "half_open"
    at: float
    p99_ms: float | None  # of the path's recent completions
    threshold_tokens: int | None  # while open: longer requests (prompt + max_new_tokens) are shed


@dataclass(frozen=True, slots=True)
class PairCompleted:
    """A live request and its shadow on the other version (engine/runtime_shadow.py) both
    finished: the same chat (each side's prompt rendered in its own version's template:
    `prompt_ids` the live one's, `other_prompt_ids` the shadow's, equal when the templates
    are), budget, sampling parameters and seed, two answers. Only `live_tokens` went to the
    client. Finish reasons are "stop" or "length"."""

    request_id: str  # the live request's
    live_version: str
    other_version: str
    at: float
    prompt_ids: tuple[int, ...]
    other_prompt_ids: tuple[int, ...]
    max_new_tokens: int
    live_tokens: tuple[int, ...]
    other_tokens: tuple[int, ...]
    live_finish: str
    other_finish: str
    seed: int | None = None  # both sides sampled with it (None: greedy)
    # each version's decode step (seconds) at the smallest batch size both ran in their last
    # steps, read as the pair completed: two versions timed in the same seconds on the same
    # machine, so their ratio is the release's and not the load's (None: no common size)
    live_step_s: float | None = None
    other_step_s: float | None = None
    # log-probabilities (natural log, of the raw logits' softmax: temperature 1 whatever the
    # request sampled at), each summed over one answer's tokens. `live_logprob`: the live
    # answer under the live version, as it was generated; `other_logprob`: the shadow's
    # answer under the other version. `live_under_other`: the live answer read by the other
    # version (one teacher-forced pass on its replica, after that side's own prompt);
    # `other_under_live`: the shadow's answer read by the live version. The cross sums are
    # computed only when the loop is idle (runtime_shadow.py): None when the pair was posted
    # without them (too many waiting, a replica gone, a pass that failed)
    live_logprob: float | None = None
    other_logprob: float | None = None
    live_under_other: float | None = None
    other_under_live: float | None = None


EngineEvent = (
    RequestQueued
    | RequestStarted
    | TokenEmitted
    | RequestFinished
    | RequestFailed
    | VersionDeployed
    | DeployFailed
    | CanaryChanged
    | BreakerChanged
    | PairCompleted
)
