"""Proxy mode's shadow: a second upstream answers a share of live requests again, for pairs.

With `shadow_upstream:` configured (the other version, e.g. the previous release still
served beside the new one), a share (`shadow_upstream.share`, default 0.1) of the live
requests that the live upstream answered successfully, streamed or not, is re-sent to the
shadow upstream with the same body (same messages or prompt, parameters and seed; only
`stream` is forced off and `stream_options` dropped, as a non-streamed request must not carry
them; `shadow_upstream.served_model`, when given, replaces the body's `model`, for a shadow
upstream that serves under another name). It runs in the background on the service's event loop, after the live answer has gone
to the client: the live answer is never delayed and the client never sees the shadow's.

The shadow work is bounded: at most `shadow_upstream.max_in_flight` shadow requests at once;
one more is dropped, not queued. Everything is counted in
`infersight_shadow_requests_total{outcome}` as the embedded runtime's shadows are: `paired`
(sent), `completed` (answered and handed on), `dropped` (no room), `failed` (the shadow
upstream did not answer 200 with a readable answer), `not_scored` (the pair feed was full),
`same_release` (not sent: the shadow upstream serves the live side's own release, below).

The shadow side's version is the `shadow_upstream.release_header` of its answer where set
(another infersight sidecar names its release in `x-infersight-release`), else
`shadow_upstream.model`, else the answer's `model`. Shadow requests carry
`x-infersight-shadow`, so a sidecar receiving one does not shadow it in turn. When the
shadow's header names the live side's own release (a stable pod whose shadow upstream is
the stable Service, i.e. its own release), the pair would compare a release with itself:
such pairs are not scored, and further shadows are skipped (`same_release`) but for one in
`_REPROBE` chosen ones, which finds out when the shadow upstream serves another release again.

Each completed shadow becomes a `TextPair` (pair_feed.py) of the live answer (candidate) and the
shadow's (baseline), which `PairFeed` scores like the runtime's pairs and hands to the
post-deploy analysis' `PairedEvidence`. The shares are chosen by a running credit (share per
live success, one pair per whole credit): exactly `floor(n * share)` of n requests, spread out.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import orjson
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from .config import ShadowUpstreamConfig
from .pair_feed import PairFeed, TextPair

__all__ = ["LiveAnswer", "ProxyShadow", "ProxyShadowCollector", "ShadowCounts"]

log = logging.getLogger(__name__)
_FORWARDED = ("content-type", "accept", "authorization", "openai-organization", "openai-project")
_REPROBE = 64  # while the shadow upstream is this release, one chosen shadow in this many is still sent


@dataclass(frozen=True)
class LiveAnswer:
    """What the live upstream answered, for the pair's live side."""

    version: str
    text: str
    output_tokens: int | None  # from its usage (None: not given)
    finish: str


@dataclass(frozen=True)
class ShadowCounts:
    paired: int
    completed: int
    dropped: int
    failed: int
    in_flight: int
    same_release: int = 0  # chosen, not sent: the shadow upstream serves the live side's release


class ProxyShadow:
    """Re-sends a share of live requests to the shadow upstream; hands the pairs to `feed`.
    Lives on the service's event loop (every method is called there)."""

    def __init__(self, config: ShadowUpstreamConfig, feed: PairFeed, *, transport: Any = None) -> None:
        self.config = config
        self.feed = feed
        self.client = httpx.AsyncClient(
            base_url=config.url.rstrip("/"),
            timeout=httpx.Timeout(config.timeout_s, connect=min(10.0, config.timeout_s)),
            transport=transport,
        )
        self._credit = 0.0
        self._tasks: set[asyncio.Task[None]] = set()
        self.paired = self.completed = self.dropped = self.failed = self.same_release = 0
        self._self_release: str | None = None  # the live release, while the shadow's header names it

    def counts(self) -> ShadowCounts:
        return ShadowCounts(self.paired, self.completed, self.dropped, self.failed, len(self._tasks),
                            self.same_release)  # fmt: skip

    def _chosen(self) -> bool:
        self._credit += self.config.share
        if self._credit < 1.0:
            return False
        self._credit -= 1.0
        return True

    def offer(
        self, path: str, raw: bytes, headers: Any, prompt: str | None, live: LiveAnswer, *, chat: bool
    ) -> bool:
        """A live request answered successfully: maybe shadow it -> whether one was sent."""
        if not self._chosen():
            return False
        if live.version == self._self_release and (self.same_release + 1) % _REPROBE:
            self.same_release += 1
            return False
        if len(self._tasks) >= self.config.max_in_flight:
            self.dropped += 1
            return False
        body = _shadow_body(raw, self.config.served_model)
        if body is None:  # not a JSON object: the live upstream took it, a shadow cannot be built
            self.failed += 1
            return False
        self.paired += 1
        task = asyncio.get_running_loop().create_task(
            self._shadow(path, body, headers, prompt or "", live, chat)
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return True

    async def _shadow(
        self, path: str, body: bytes, headers: Any, prompt: str, live: LiveAnswer, chat: bool
    ) -> None:
        try:
            resp = await self.client.post(path, content=body, headers=self._headers(headers))
            answer = _read_answer(resp.content, chat) if resp.status_code == 200 else None
        except httpx.HTTPError as exc:
            log.debug("shadow upstream did not answer: %s", type(exc).__name__)
            answer = None
        if answer is None:
            self.failed += 1
            return
        model, text, tokens, finish = answer
        named = resp.headers.get(self.config.release_header) if self.config.release_header else None
        version = named or self.config.model or model or "shadow"
        if named is not None:
            self._self_release = named if named == live.version else None
            if named == live.version:  # the same release on both sides: nothing to compare
                self.completed += 1
                return
        if live.output_tokens is not None and tokens is not None:
            counts = (live.output_tokens, tokens)
        else:  # a side without usage: both sides in words, so the ratio compares like with like
            counts = (len(live.text.split()), len(text.split()))
        self.feed.on_event(
            TextPair(
                prompt, live.text, text, live.version, version, counts[0], counts[1], live.finish, finish
            )
        )
        self.completed += 1

    def _headers(self, incoming: Any) -> dict[str, str]:
        headers = {k: v for k in _FORWARDED if (v := incoming.get(k)) is not None}
        headers["content-type"] = "application/json"
        headers["x-infersight-shadow"] = "1"  # a sidecar receiving it answers it and shadows it no further
        headers.pop("accept", None)  # the shadow is never streamed
        if self.config.api_key:
            headers["authorization"] = f"Bearer {self.config.api_key}"
        return headers

    async def aclose(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.client.aclose()


def _shadow_body(raw: bytes, served_model: str | None = None) -> bytes | None:
    """The live body with `stream` off (and `stream_options` gone), its `model` replaced by
    `served_model` when given; None if not a JSON object."""
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(obj, dict):
        return None
    if obj.get("stream"):
        obj["stream"] = False
    obj.pop("stream_options", None)
    if served_model is not None:
        obj["model"] = served_model
    return orjson.dumps(obj)


def _read_answer(body: bytes, chat: bool) -> tuple[str | None, str, int | None, str] | None:
    """(model, text, completion tokens, finish reason) of a non-streamed answer; None if unreadable."""
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    choices = obj.get("choices") if isinstance(obj, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return None
    choice = choices[0]
    holder = choice.get("message") if chat else choice
    text = holder.get("content") if chat and isinstance(holder, dict) else choice.get("text")
    usage = obj.get("usage") if isinstance(obj.get("usage"), dict) else {}
    tokens = usage.get("completion_tokens")
    finish = choice.get("finish_reason")
    return (
        obj["model"] if isinstance(obj.get("model"), str) else None,
        text if isinstance(text, str) else "",
        tokens if isinstance(tokens, int) and not isinstance(tokens, bool) and tokens >= 0 else None,
        finish if isinstance(finish, str) else "unknown",
    )


class ProxyShadowCollector(Collector):
    """The shadow upstream's work at scrape time, in the runtime's shadow series."""

    def __init__(self, shadow: ProxyShadow, *, model: str) -> None:
        self.shadow = shadow
        self.model = model

    def collect(self) -> Iterator[Any]:
        counts = self.shadow.counts()
        shadows = CounterMetricFamily(
            "infersight_shadow_requests", "Live requests also answered by the other version, by outcome",
            labels=["model", "outcome"],
        )  # fmt: skip
        for outcome in ("paired", "completed", "dropped", "failed", "same_release"):
            shadows.add_metric([self.model, outcome], float(getattr(counts, outcome)))
        shadows.add_metric([self.model, "not_scored"], float(self.shadow.feed.overflow))
        yield shadows
        waiting = GaugeMetricFamily("infersight_shadow_waiting", "Pairs not finished yet", labels=["model"])
        waiting.add_metric([self.model], float(counts.in_flight))
        yield waiting
        scored = CounterMetricFamily("infersight_shadow_pairs_scored", "Pairs scored for the release checks",
                                     labels=["model"])  # fmt: skip
        scored.add_metric([self.model], float(self.shadow.feed.scored))
        yield scored
