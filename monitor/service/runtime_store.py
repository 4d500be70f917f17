"""What the service keeps in the store for the embedded runtime: its deploy history, and the
frequent prompts that warm its prefix cache.

Keeping the store's `deploys` and `model_versions` tables in step with the runtime.

The runtime tells its subscribers when the serving version changed or a deploy was
refused (on its loop thread, so the subscriber only appends to a deque); `flush()`
writes what arrived, from the scheduler or right after an API deploy. Deploys made by
anyone (the API, the alert engine's rollback action, the post-deploy analysis) are
recorded alike.

The service's side of the engine's prefix KV cache: built from `engine.prefix_cache_*`,
preloaded from the most frequent prompts in the store, and exposed to Prometheus.

The engine knows nothing of the store: the runtime takes a `preload_source(version)` and
calls it at start and at every deploy, before the version takes traffic. This module's
`FrequentPrompts` answers it with the `sample` most recent recorded prompts of the last
`window_s` seconds of the model's traffic (any version: a new version has none yet), each
as sent on /v1/completions and as a one-message chat rendered by the served template, so
that both routes find their template prefilled; a recorded chat that had a system prompt
(`requests.system_prompt`) is rendered as the [system, user] chat it was instead, so that
its system prompt is a prefix as the next such chat sends it; the runtime then prefills the
`preload_prompts` most frequent block prefixes among them (`engine.prefix_cache.
frequent_prefixes`): a system prompt shared by many different questions is one frequent
prefix even though no whole prompt repeats."""

from __future__ import annotations

import datetime as dt
import logging
import threading
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from infersight.engine.events import CanaryChanged, DeployFailed, EngineEvent, VersionDeployed
from infersight.monitor.store.tables import by_start, deploys, model_versions, requests, started_in
from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector
from sqlalchemy import Engine, insert, select, update
from sqlalchemy.exc import IntegrityError

from .openai_api import ChatMessage, render_chat

if TYPE_CHECKING:
    from infersight.engine.prefix_cache import PrefixCache

    from .config import EngineConfig

__all__ = ["DEPLOY_OUTCOMES", "DeployLog", "FrequentPrompts", "PrefixCacheCollector", "build_prefix_cache"]

DEPLOY_OUTCOMES = ("deployed", "rolled_back", "refused")

log = logging.getLogger(__name__)


def _at(ts: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(ts, dt.UTC)


@dataclass(frozen=True)
class _Reason:
    """Why a version change was made, said by whoever asked for it."""

    from_version: str
    to_version: str
    reason: str
    since: dt.datetime
    detail: str

    def matches(self, row: dict[str, Any]) -> bool:
        return (row["from_version"], row["to_version"], row["reason"]) == (
            self.from_version, self.to_version, self.reason
        ) and row["outcome"] != "refused" and row["at"] >= self.since  # fmt: skip


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
        # reasons said before their change reached the log: written with its row when it arrives
        self._reasons: deque[_Reason] = deque(maxlen=64)
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
            for row in rows:
                reason = next((r for r in self._reasons if r.matches(row)), None)
                if reason is not None:
                    row["detail"] = reason.detail[:4000]
                    self._reasons.remove(reason)
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
        `reason` at or after `since`. The runtime posts its events off the caller's thread,
        so a change not recorded yet gets `detail` when it arrives: True when written now,
        False when kept for the change's arrival (never waited for here)."""
        self.flush()
        said = _Reason(from_version, to_version, reason, since, detail)
        d = deploys.c
        with self._lock, self.db.begin() as conn:
            row_id = conn.execute(
                select(d.id)
                .where(d.from_version == from_version, d.to_version == to_version, d.reason == reason,
                       d.outcome != "refused", d.at >= since)
                .order_by(d.id.desc())
                .limit(1)
            ).scalar()  # fmt: skip
            if row_id is None:
                self._reasons.append(said)
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
        """Insert the registry's versions the store does not know yet. Replicas starting together
        on one database race here: a name another one inserted meanwhile is a unique-key
        conflict, and the insert is tried again with what is known then."""
        versions = self.runtime.registry.versions()
        for attempt in range(3):
            try:
                with self.db.begin() as conn:
                    known = set(conn.execute(select(model_versions.c.name)).scalars())
                    new = [
                        {"name": v.name, "arch": v.arch, "dataset": v.dataset, "quant": v.quant,
                         "major": v.major, "minor": v.minor, "created_at": _at(v.created_at), "sha256": v.sha256,
                         "parent": v.parent, "path": str(v.path), "registered_at": dt.datetime.now(dt.UTC)}
                        for v in versions if v.name not in known
                    ]  # fmt: skip
                    if new:
                        conn.execute(insert(model_versions), new)
                return
            except IntegrityError:
                if attempt == 2:
                    raise


def build_prefix_cache(cfg: EngineConfig) -> PrefixCache | None:
    """The runtime's prefix cache as configured; None when `prefix_cache_mb` is 0."""
    if cfg.prefix_cache_mb <= 0:
        return None
    from infersight.engine.prefix_cache import PrefixCache, RedisTier

    shared = None
    if cfg.prefix_cache_redis_url:
        from infersight.engine.registry import Registry

        registry = Registry(cfg.registry)
        digests: dict[str, str] = {}

        def weights_digest(version: str) -> str:  # a version's weights never change: read once
            if version not in digests:
                digests[version] = registry.get(version).sha256
            return digests[version]

        # SealKeyInvalid (missing or short) stops the start: check_config names the key first
        shared = RedisTier(cfg.prefix_cache_redis_url, key_prefix=cfg.prefix_cache_redis_prefix,
                           secret=cfg.prefix_cache_redis_key, weights_digest=weights_digest)  # fmt: skip
    return PrefixCache(
        block_tokens=cfg.prefix_block_tokens, max_bytes=int(cfg.prefix_cache_mb * (1 << 20)), shared=shared
    )


class FrequentPrompts:
    """`preload_source` for the runtime: the recorded prompts of `model` the runtime ranks."""

    def __init__(
        self,
        db: Engine,
        *,
        model: Callable[[str], str],  # version -> the model its records name
        sample: int = 2000,
        window_s: float = 7 * 24 * 3600,
        now: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
    ) -> None:
        self.db, self.model, self.sample, self.window_s, self.now = db, model, sample, window_s, now

    def prompts(self, version: str) -> list[tuple[str, str | None]]:
        """Up to `sample` recorded (prompt, system prompt) of `version`'s model, newest first."""
        if self.sample <= 0:
            return []
        since = self.now() - dt.timedelta(seconds=self.window_s)
        query = (
            select(requests.c.prompt, requests.c.system_prompt)
            .where(
                requests.c.model == self.model(version),
                requests.c.prompt.is_not(None),
                *started_in(since),
            )
            .order_by(*by_start(newest_first=True))
            .limit(self.sample)
        )
        with self.db.connect() as conn:
            return [(str(row[0]), row[1] or None) for row in conn.execute(query) if row[0]]

    def __call__(self, version: str) -> list[str]:
        out: list[str] = []
        for text, system in self.prompts(version):
            user = ChatMessage(role="user", content=text, name=None)
            if system is None:
                out.append(text)
                out.append(render_chat([user]))
            else:  # a chat as it was sent (its system messages joined into one)
                out.append(render_chat([ChatMessage(role="system", content=system, name=None), user]))
        return out


class PrefixCacheCollector(Collector):
    """Prefix-cache counters per version, read from the runtime at scrape time. Labelled
    `model` and `model_version` like every other metric; hits by `tier`: `memory` (this
    process) or `redis` (the shared tier), so a cold replica warming from Redis shows."""

    def __init__(self, runtime: Any, *, model: str) -> None:
        self.runtime, self.model = runtime, model

    def collect(self) -> Iterator[Metric]:
        from infersight.engine.prefix_cache import REJECT_REASONS  # torch: only with a runtime

        stats = self.runtime.prefix_cache_stats()
        labels = ["model", "model_version"]
        hits = CounterMetricFamily(
            "infersight_prefix_cache_hits", "Prompt blocks served from the prefix KV cache, by tier",
            labels=[*labels, "tier"],
        )  # fmt: skip
        families: dict[str, Metric] = {
            "misses": CounterMetricFamily(
                "infersight_prefix_cache_misses", "Full prompt blocks not in the prefix KV cache", labels=labels
            ),
            "tokens_saved": CounterMetricFamily(
                "infersight_prefix_cache_tokens_saved", "Prompt tokens not prefilled thanks to the cache",
                labels=labels,
            ),
            "evictions": CounterMetricFamily(
                "infersight_prefix_cache_evictions", "Blocks evicted (LRU) to stay under the byte budget",
                labels=labels,
            ),
            "shared_failures": CounterMetricFamily(
                "infersight_prefix_cache_shared_failures", "Failed calls to the shared tier (Redis)",
                labels=labels,
            ),

            "bytes_held": GaugeMetricFamily(
                "infersight_prefix_cache_bytes", "Bytes of keys and values held by the prefix cache",
                labels=labels,
            ),
        }  # fmt: skip
        rejected = CounterMetricFamily(
            "infersight_prefix_cache_shared_rejected",
            "Blocks in the shared tier not served (misses), by reason: seal (forged, copied to another "
            "key, altered, other weights or seal key), format, payload", labels=[*labels, "reason"],
        )  # fmt: skip
        for version, s in sorted(stats.items()):
            hits.add_metric([self.model, version, "memory"], float(s.hits - s.shared_hits))
            hits.add_metric([self.model, version, "redis"], float(s.shared_hits))
            for reason in REJECT_REASONS:
                rejected.add_metric(
                    [self.model, version, reason], float(getattr(s, f"shared_rejected_{reason}"))
                )
            for name, family in families.items():
                family.add_metric([self.model, version], float(getattr(s, name)))  # type: ignore[attr-defined]
        yield hits
        yield rejected
        yield from families.values()
