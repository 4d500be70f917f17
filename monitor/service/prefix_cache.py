"""The service's side of the engine's prefix KV cache: built from `engine.prefix_cache_*`,
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
prefix even though no whole prompt repeats.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from infersight.monitor.store.tables import requests
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector
from sqlalchemy import select
from sqlalchemy.engine import Engine

from .chat_template import render_chat
from .openai_schema import ChatMessage

if TYPE_CHECKING:
    from infersight.engine.prefix_cache import PrefixCache

    from .config import EngineConfig

__all__ = ["FrequentPrompts", "PrefixCacheCollector", "build_prefix_cache"]


def build_prefix_cache(cfg: EngineConfig) -> PrefixCache | None:
    """The runtime's prefix cache as configured; None when `prefix_cache_mb` is 0."""
    if cfg.prefix_cache_mb <= 0:
        return None
    from infersight.engine.prefix_cache import PrefixCache
    from infersight.engine.prefix_cache_redis import RedisTier

    shared = None
    if cfg.prefix_cache_redis_url:
        shared = RedisTier(cfg.prefix_cache_redis_url, key_prefix=cfg.prefix_cache_redis_prefix)
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
                requests.c.started_at >= since,
            )
            .order_by(requests.c.started_at.desc())
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
    """Prefix-cache counters per version, read from the runtime at scrape time."""

    def __init__(self, runtime: Any, *, model: str) -> None:
        self.runtime, self.model = runtime, model

    def collect(self) -> Iterator[Metric]:
        stats = self.runtime.prefix_cache_stats()
        labels = ["model", "version"]
        families: dict[str, Metric] = {
            "hits": CounterMetricFamily(
                "infersight_prefix_cache_hits", "Prompt blocks served from the prefix KV cache", labels=labels
            ),
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
        for version, s in sorted(stats.items()):
            for name, family in families.items():
                family.add_metric([self.model, version], float(getattr(s, name)))  # type: ignore[attr-defined]
        yield from families.values()
