"""Pairs: the runtime's `PairCompleted` events, scored and handed to the release checks.

The embedded runtime answers a share of live requests with both versions while two are
loaded (engine/runtime_shadow.py: a canary, or the previous version kept for the post-deploy
analysis window; config `engine.pair_share`). `PairFeed` takes each completed pair off the
engine's loop thread (a bounded deque: what does not fit is counted, never waited for), and
a job (`pairs`, every `schedule.embed_s`) decodes both answers, embeds them with the drift
module's embedder (relevance of each answer to the prompt, and the cosine between the two
answers) and hands a `PairOutcome` to the running canary's controller and to the
post-deploy analysis' `PairedEvidence`. Without the drift module, pairs still carry their
lengths and finish reasons (the relevance and similarity checks then wait). An engine pair
also carries each answer's log-probabilities under its own version and read by the other
(the runtime reads them with two forward passes per pair when it is idle), mapped here to the
candidate and the baseline for the `divergence` check; proxy pairs have none (it waits).

The side under test (`candidate`) is the canary while one runs, else the live version (a
deploy's new version; the other side is the previous one).

In proxy mode the other version is a second upstream (`shadow_upstream:`, proxy_shadow.py):
its pairs come as `TextPair`s (the two answers' texts, token counts and finish reasons),
scored the same way (the live upstream is the candidate, the shadow upstream the baseline).
Without a shadow upstream no second version answers, so the paired checks are off and every
post-deploy verdict says so (`PairedEvidence.off_reason`).
"""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from infersight.alerts.release.paired_checks import PairedEvidence, PairOutcome, PairPolicy
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from .config import ServiceConfig

__all__ = [
    "PROXY_PAIRS_OFF",
    "PairFeed",
    "ShadowCollector",
    "TextPair",
    "engine_release_checks",
    "pairs_overview",
]

log = logging.getLogger(__name__)
PROXY_PAIRS_OFF = (
    "paired checks off: proxy mode has no second version to answer the same requests "
    "(error rate and latency only, arm against arm); configure shadow_upstream: to pair requests"
)


@dataclass(frozen=True)
class TextPair:
    """A pair whose answers are already text (proxy mode: two upstreams answered the same body)."""

    prompt: str
    live_text: str
    other_text: str
    live_version: str
    other_version: str
    live_count: int  # output tokens (or words, when either upstream gave no usage)
    other_count: int
    live_finish: str
    other_finish: str


class PairFeed:
    """Completed pairs of `runtime` -> scored `PairOutcome`s -> `canary` (its controller, if
    any) and `evidence` (read by the post-deploy analysis)."""

    def __init__(
        self,
        runtime: Any,
        evidence: PairedEvidence,
        *,
        canary: Any = None,
        max_waiting: int = 512,
    ) -> None:
        self.runtime = runtime
        self.evidence = evidence
        self.canary = canary
        self.detector: Any = None  # the drift module's, once wired: relevance and similarity
        self._waiting: collections.deque[Any] = collections.deque()
        self._max_waiting = max_waiting
        self._lock = threading.Lock()
        self.overflow = 0  # pairs not scored: more waited than `max_waiting`
        self.scored = 0

    def on_event(self, event: Any) -> None:
        """Engine subscriber (the loop thread): keep the pair, nothing more."""
        if type(event).__name__ != "PairCompleted" and not isinstance(event, TextPair):
            return
        with self._lock:
            if len(self._waiting) >= self._max_waiting:
                self.overflow += 1
                return
            self._waiting.append(event)

    def score(self) -> int:
        """The job: score the pairs waiting and hand them on -> how many."""
        with self._lock:
            events, self._waiting = list(self._waiting), collections.deque()
        tokenizer = getattr(self.runtime, "tokenizer", None)
        if tokenizer is None:  # an engine's pairs cannot be read without it (proxy pairs are text)
            events = [e for e in events if isinstance(e, TextPair)]
        if not events:
            return 0

        def text(ids: tuple[int, ...]) -> str:
            assert tokenizer is not None  # only an engine's pairs are decoded, and only with one
            return str(tokenizer.decode(list(ids), skip_special_tokens=True)) or " "

        def texts(e: Any) -> tuple[str, str, str]:
            if isinstance(e, TextPair):
                return e.prompt or " ", e.live_text or " ", e.other_text or " "
            return text(e.prompt_ids), text(e.live_tokens), text(e.other_tokens)

        prompts, live, other = (list(side) for side in zip(*map(texts, events), strict=True))
        scores: list[tuple[float, float, float] | None] = [None] * len(events)
        if self.detector is not None:
            try:
                scores = self._embed(prompts, live, other)
            except Exception:  # the embedder failed: lengths and finish reasons still count
                log.exception("%d pairs not embedded", len(events))
        for event, score in zip(events, scores, strict=True):
            outcome = self._outcome(event, score)
            self.evidence.observe(outcome)
            if self.canary is not None:
                self.canary.on_pair(outcome)
        self.scored += len(events)
        return len(events)

    def _embed(
        self, prompts: list[str], live: list[str], other: list[str]
    ) -> list[tuple[float, float, float] | None]:
        from infersight.monitor.drift import TextWindow

        a, b = self.detector.embed(TextWindow.of(prompts, live), TextWindow.of(prompts, other))
        similarity = (a.response_embeddings * b.response_embeddings).sum(axis=1)
        return [
            (float(ra), float(rb), float(s))
            for ra, rb, s in zip(a.relevance, b.relevance, similarity, strict=True)
        ]

    def _outcome(self, event: Any, score: tuple[float, float, float] | None) -> PairOutcome:
        status = getattr(getattr(self.runtime, "canary", None), "status", None)
        live_first = status is None or status.version != event.other_version
        counts = (
            (event.live_count, event.other_count)
            if isinstance(event, TextPair)
            else (len(event.live_tokens), len(event.other_tokens))
        )
        sides = [(event.live_version, counts[0], event.live_finish),
                 (event.other_version, counts[1], event.other_finish)]  # fmt: skip
        relevance = [score[0], score[1]] if score is not None else [None, None]
        steps = [getattr(event, "live_step_s", None), getattr(event, "other_step_s", None)]  # engine pairs
        # (own, read by the other version) per answer, live first: engine pairs only
        logprobs = [(getattr(event, "live_logprob", None), getattr(event, "live_under_other", None)),
                    (getattr(event, "other_logprob", None), getattr(event, "other_under_live", None))]  # fmt: skip
        if not live_first:  # the canary answered the shadow: it is the candidate
            sides.reverse()
            relevance.reverse()
            steps.reverse()
            logprobs.reverse()
        (cand, c_n, c_fin), (base, b_n, b_fin) = sides
        similarity = score[2] if score is not None else None
        return PairOutcome(cand, base, c_n, b_n, c_fin, b_fin, relevance[0], relevance[1], similarity,
                           candidate_step_s=steps[0], baseline_step_s=steps[1],
                           candidate_logprob=logprobs[0][0], candidate_under_baseline=logprobs[0][1],
                           baseline_logprob=logprobs[1][0], baseline_under_candidate=logprobs[1][1])  # fmt: skip


class ShadowCollector(Collector):
    """The runtime's paired work at scrape time (`ShadowStats`): pairs asked for, completed,
    dropped for want of room, discarded with their hung-up live request, and told without
    their answers read by the other version (`unread`)."""

    def __init__(self, runtime: Any, feed: PairFeed, *, model: str) -> None:
        self.runtime = runtime
        self.feed = feed
        self.model = model

    def collect(self) -> Iterator[Any]:
        stats = self.runtime.shadow.stats()
        shadows = CounterMetricFamily(
            "infersight_shadow_requests", "Live requests also answered by the other version, by outcome",
            labels=["model", "outcome"],
        )  # fmt: skip
        for outcome in ("paired", "completed", "dropped", "discarded", "unread"):
            shadows.add_metric([self.model, outcome], float(getattr(stats, outcome)))
        shadows.add_metric([self.model, "not_scored"], float(self.feed.overflow))
        yield shadows
        waiting = GaugeMetricFamily("infersight_shadow_waiting", "Pairs not finished yet", labels=["model"])
        waiting.add_metric([self.model], float(stats.waiting))
        yield waiting


def pairs_overview(feed: PairFeed | None, *, proxy: bool) -> dict[str, Any]:
    """The overview's `pairs`: whether pairs come (and why not), and each comparison's figures."""
    if feed is None:
        reason = PROXY_PAIRS_OFF if proxy else "paired checks off: the runtime has no shadow support"
        return {"enabled": False, "off_reason": reason, "scored": 0, "comparisons": []}
    evidence = feed.evidence
    return {
        "enabled": evidence.enabled,
        "off_reason": None if evidence.enabled else evidence.off_reason,
        "scored": feed.scored,
        "comparisons": [
            {"candidate": c, "baseline": b, "pairs": n, "checks": [check.describe() for check in checks]}
            for c, b, n, checks in evidence.comparisons()
        ],
    }


def pair_policy(share: float, similarity: str = "without_divergence") -> PairPolicy | None:
    """The canary's paired checks when the runtime pairs requests (`share` > 0), else None;
    `similarity`: `alerting.pair_similarity`."""
    return PairPolicy(similarity_decides=similarity) if share > 0.0 else None


def engine_release_checks(
    runtime: Any, config: ServiceConfig, on_canary_decision: Callable[[Any], None],
    on_canary_rollback: Callable[[Any], None] | None = None,
) -> tuple[float, Any, PairFeed | None]:  # fmt: skip
    """The embedded runtime's release checks -> (pair share, canary controller, pair feed):
    the paired answers configured, the canary's controller (None without canary support), and
    the feed that scores the pairs (None without the runtime's shadow support)."""
    share = _configure_pairs(runtime, config)
    controller = _canary_controller(
        runtime, on_canary_decision, on_canary_rollback, share, config.alerting.canary_step_requests,
        config.alerting.pair_similarity, config.alerting.canary_latency,
    )  # fmt: skip
    if getattr(runtime, "shadow", None) is None:
        return share, controller, None
    # the post-deploy analysis' pairs: their step check at the analysis' own latency ratio
    policy = PairPolicy(max_step_ratio=config.alerting.analysis_p99_ratio,
                        similarity_decides=config.alerting.pair_similarity)  # fmt: skip
    off = "paired checks off: engine.pair_share is 0"
    evidence = PairedEvidence(policy, enabled=share > 0.0, off_reason=off, step_times=True)
    return share, controller, PairFeed(runtime, evidence, canary=controller)


def _canary_controller(
    runtime: Any,
    on_decision: Callable[[Any], None],
    rollback: Callable[[Any], None] | None,
    pair_share: float,
    step_requests: int,
    similarity: str = "without_divergence",
    latency: str = "whole",
) -> Any:
    """The controller that analyses and steps canaries (None without the runtime's canary
    support); its quality checks are paired when the runtime pairs requests."""
    control = getattr(runtime, "canary", None)
    if control is None:
        return None
    from infersight.alerts import CanaryController
    from infersight.alerts.release.canary import CanaryPolicy

    return CanaryController(
        control, CanaryPolicy(requests_per_step=step_requests, latency=latency), on_decision=on_decision,
        pairs=pair_policy(pair_share, similarity), rollback=rollback,
    )  # fmt: skip


def _configure_pairs(runtime: Any, config: ServiceConfig) -> float:
    """The runtime's paired answers as configured (`engine.pair_share`, `engine.pair_slots`);
    after a deploy the previous version stays loaded for the post-deploy analysis window
    (only with alerting on: nothing reads the pairs otherwise) -> the share (0: off)."""
    shadow = getattr(runtime, "shadow", None)
    if shadow is None:
        return 0.0
    cfg = config.engine
    share = cfg.pair_share if cfg is not None else 0.1
    alerting = config.alerting  # kept through a verdict held past the window, too
    keep = alerting.analysis_window_s + alerting.analysis_max_hold_s if alerting.enabled else 0.0
    shadow.configure(share=share, keep_previous_s=keep, slots=cfg.pair_slots if cfg is not None else None)
    return float(share)
