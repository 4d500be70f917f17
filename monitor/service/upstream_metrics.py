"""The upstream server's own queue depth, read from its Prometheus text (proxy mode).

A proxy sees a request only while it is in flight, not whether the upstream has it queued
or running; vLLM and TGI say so on their `/metrics`. `UpstreamQueueScraper.scrape_once`
(a scheduler job) reads that page and sets the proxy's `gen_ai_server_requests_waiting`
series, which is what the `queue_depth` signal reads, so `GPUUnderusedWhileQueued` can fire
beside vLLM.

- vLLM: `vllm:num_requests_waiting{model_name=...}` (summed over its engines), one series
  per model name, labelled as the proxy labels that model's requests.
- TGI: `tgi_queue_size` (no model label): the series of the model the upstream's latest
  answer named (or the configured `upstream.model`).

A page that cannot be read (unreachable, an HTTP error, not Prometheus text) counts in
`infersight_upstream_metrics_errors_total{reason}` and sets the depths it had set back to 0:
a queue nobody can see is not reported as one.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

import httpx
from prometheus_client import CollectorRegistry, Counter
from prometheus_client.parser import text_string_to_metric_families

__all__ = ["QUEUE_METRICS", "UpstreamQueueScraper", "queue_depths"]

log = logging.getLogger(__name__)

# metric name -> the label naming the model (None: the upstream serves one model and says not which)
QUEUE_METRICS: dict[str, str | None] = {"vllm:num_requests_waiting": "model_name", "tgi_queue_size": None}
_MAX_BYTES = 4 * 1024 * 1024  # a metrics page larger than this is not read
_MAX_MODELS = 64  # distinct model names taken from one page (an upstream serves a handful)


class _Stats(Protocol):
    def series(self, model: str, model_version: str) -> Any: ...


class _Proxy(Protocol):
    last_model_version: str | None


def queue_depths(text: str) -> dict[str | None, int]:
    """Requests waiting per model name (None: unnamed) in a Prometheus text page.
    Raises ValueError when the text is not Prometheus exposition format."""
    out: dict[str | None, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name not in QUEUE_METRICS:
                continue
            label = QUEUE_METRICS[sample.name]
            name = sample.labels.get(label) if label is not None else None
            if name is None and label is not None:
                continue
            if name not in out and len(out) >= _MAX_MODELS:
                continue
            if sample.value == sample.value:  # NaN: no reading
                out[name] = out.get(name, 0.0) + float(sample.value)
    return {name: max(0, round(value)) for name, value in out.items()}


class UpstreamQueueScraper:
    def __init__(
        self,
        url: str,
        stats: _Stats,
        proxy: _Proxy,
        *,
        model: str | None = None,
        registry: CollectorRegistry | None = None,
        timeout_s: float = 5.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        """`model`: the proxy's configured `upstream.model` (the `model` label of its series)."""
        self.url = url
        self.stats = stats
        self.proxy = proxy
        self.model = model
        self.client = httpx.Client(timeout=timeout_s, transport=transport)
        self.errors = Counter(
            "infersight_upstream_metrics_errors", "Failed reads of the upstream's Prometheus metrics",
            ["reason"], registry=registry,
        )  # fmt: skip
        self._set: set[tuple[str, str]] = set()  # the series whose depth this scraper set

    def scrape_once(self) -> dict[tuple[str, str], int]:
        """Read the page and set each series' queue depth; returns what was set."""
        try:
            text = self._fetch()
            try:
                depths = queue_depths(text)
            except ValueError as exc:
                raise _ScrapeFailed("unparsable", str(exc)[:200]) from exc
        except _ScrapeFailed as exc:
            self.errors.labels(exc.reason).inc()
            log.debug("upstream metrics at %s: %s", self.url, exc)
            depths = {}
        return self._apply(depths)

    def _fetch(self) -> str:
        try:
            with self.client.stream("GET", self.url, headers={"Accept": "text/plain"}) as resp:
                if resp.status_code != 200:
                    raise _ScrapeFailed("http_status", f"answered {resp.status_code}")
                body = b""
                for chunk in resp.iter_bytes():
                    body += chunk
                    if len(body) > _MAX_BYTES:
                        raise _ScrapeFailed("too_large", f"more than {_MAX_BYTES} bytes")
        except httpx.HTTPError as exc:
            raise _ScrapeFailed("unreachable", type(exc).__name__) from exc
        try:
            return body.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise _ScrapeFailed("unparsable", "not UTF-8") from exc

    def _labels(self, name: str | None) -> tuple[str, str]:
        """The (model, model_version) the proxy records that model's requests under."""
        version = name or self.proxy.last_model_version or self.model or "unknown"
        return self.model or version, version

    def _apply(self, depths: dict[str | None, int]) -> dict[tuple[str, str], int]:
        now: dict[tuple[str, str], int] = {}
        for name, depth in depths.items():
            key = self._labels(name)
            now[key] = now.get(key, 0) + depth
        for key in self._set - now.keys():
            self.stats.series(*key).set_waiting(0)
        for key, depth in now.items():
            self.stats.series(*key).set_waiting(depth)
        self._set = set(now)
        return now

    def close(self) -> None:
        self.client.close()


class _ScrapeFailed(Exception):
    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
