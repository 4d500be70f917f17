"""The `/v1` backend of proxy mode: the upstream OpenAI-compatible server, observed.

Serving `/v1` by proxying to an existing OpenAI-compatible server (vLLM, TGI,
llama.cpp's server) with httpx, observing every request.

The client's body goes upstream byte for byte and the upstream's answer comes back
untouched (status, body, SSE stream as it arrives). Beside it the proxy measures latency
and time to first token (the first chunk that carries text), takes token counts from the
`usage` field (or, in a stream without usage, counts the chunks that carried text, one
per token as vLLM and llama.cpp send them), and keeps the prompt and answer text
(sampled) for drift. Every call becomes an `InferenceRecord` with source "proxy"; an
upstream 4xx is recorded as the client's `client_error` and a client that hangs up as
`cancelled`, neither a server error. A client that hangs up before a non-streamed answer
came back cancels the upstream call too (the connection to the upstream is closed, which
vLLM and TGI take as an abort), so the upstream stops generating for nobody. The answer's
`model` is the upstream's own: the proxy runs no canary, so it has no arm to hide.
With `shadow_upstream:` a share of the successful answers is shadowed (proxy_shadow.py):
the same body goes to the shadow upstream after the live answer is out, for the paired checks.
With `upstream.release` (the pod's release, e.g. Argo Rollouts' pod-template hash) every
answer is recorded as that version and names it in the `x-infersight-release` header, so a
sidecar that shadows to this one knows which release answered; a request that is itself
another sidecar's shadow (`x-infersight-shadow`) is answered but never shadowed again.

The upstream server's own queue depth, read from its Prometheus text (proxy mode).

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
a queue nobody can see is not reported as one."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, Protocol

import httpx
import orjson
from fastapi.responses import Response, StreamingResponse
from infersight.monitor.records import CANCELLED, CLIENT_ERROR, is_server_error
from infersight.monitor.redaction import redact_url
from prometheus_client import CollectorRegistry, Counter
from prometheus_client.parser import text_string_to_metric_families

from .config import UpstreamConfig
from .errors import UpstreamUnreachable
from .openai_api import ObservedRequest
from .pipeline import CallTimer, RecordPipeline, make_record
from .proxy_shadow import LiveAnswer

if TYPE_CHECKING:
    from .metrics import ServiceMetrics
    from .proxy_shadow import ProxyShadow

__all__ = [
    "QUEUE_METRICS",
    "RELEASE_HEADER",
    "SHADOW_HEADER",
    "ProxyBackend",
    "SSEObserver",
    "UpstreamQueueScraper",
    "queue_depths",
]

_FORWARDED = ("content-type", "accept", "authorization", "openai-organization", "openai-project")
RELEASE_HEADER = "x-infersight-release"  # the release that answered (upstream.release)
SHADOW_HEADER = "x-infersight-shadow"  # on a shadow request: answer it, shadow it no further


def _answer_id(obj: dict[str, Any]) -> str | None:
    """An OpenAI-compatible answer's `id`, where it can be a request id."""
    value = obj.get("id")
    return value if isinstance(value, str) and 0 < len(value) <= 256 else None


class SSEObserver:
    """Reads an OpenAI SSE stream as it passes: text, first-text time, usage, model."""

    def __init__(self, timer: CallTimer, chat: bool) -> None:
        self.timer = timer
        self.chat = chat
        self.parts: list[str] = []
        self.text_chunks = 0
        self.usage: dict[str, Any] | None = None
        self.model: str | None = None
        self.answer_id: str | None = None  # the upstream's own `id` of the answer
        self.error: str | None = None
        self.finish_reason: str | None = None
        self._buffer = b""

    def feed(self, data: bytes) -> None:
        self._buffer += data
        while b"\n" in self._buffer:
            line, self._buffer = self._buffer.split(b"\n", 1)
            self._line(line.rstrip(b"\r"))

    def _line(self, line: bytes) -> None:
        if not line.startswith(b"data:"):
            return
        payload = line[5:].strip()
        if not payload or payload == b"[DONE]":
            return
        try:
            obj = orjson.loads(payload)
        except orjson.JSONDecodeError:
            return
        if not isinstance(obj, dict):
            return
        if isinstance(obj.get("model"), str):
            self.model = obj["model"]
        if self.answer_id is None:
            self.answer_id = _answer_id(obj)
        if isinstance(obj.get("usage"), dict):
            self.usage = obj["usage"]
        if isinstance(obj.get("error"), dict):
            self.error = "UpstreamStreamError"
        choices = obj.get("choices")
        if isinstance(choices, list) and choices and isinstance(choices[0], dict):
            if isinstance(choices[0].get("finish_reason"), str):
                self.finish_reason = choices[0]["finish_reason"]
            text = _choice_text(choices[0], self.chat)
            if text:
                self.timer.first()
                self.parts.append(text)
                self.text_chunks += 1

    @property
    def text(self) -> str:
        return "".join(self.parts)


def _choice_text(choice: dict[str, Any], chat: bool) -> str:
    if chat:
        holder = choice.get("delta") if isinstance(choice.get("delta"), dict) else choice.get("message")
        content = holder.get("content") if isinstance(holder, dict) else None
    else:
        content = choice.get("text")
    return content if isinstance(content, str) else ""


class ProxyBackend:
    passes_through = True  # the router hands over the body unvalidated (openai_schema.ObservedRequest)

    def __init__(
        self,
        config: UpstreamConfig,
        *,
        pipeline: RecordPipeline,
        metrics: ServiceMetrics,
        text_sample_rate: float = 1.0,
        transport: Any = None,
        shadow: ProxyShadow | None = None,
    ) -> None:
        """Records each call into `pipeline`, counts upstream failures in `metrics`; `shadow`:
        the shadow upstream that answers a share of the successful calls again (None: no pairs)."""
        self.config = config
        self.pipeline = pipeline
        self.metrics = metrics
        self.text_sample_rate = text_sample_rate
        self.client = httpx.AsyncClient(
            base_url=config.url.rstrip("/"),
            timeout=httpx.Timeout(config.timeout_s, connect=min(10.0, config.timeout_s)),
            transport=transport,
        )
        self.last_model_version: str | None = None  # as the latest answer named it (for upstream metrics)
        self._accepted: set[str] = set()  # model names the upstream answered 200 for
        # the answer ids seen lately: an upstream that repeats ids (a fake, an old server) must
        # not make calls collide on one request id, whose duplicates the store drops
        self._recent_ids: OrderedDict[str, None] = OrderedDict()
        self.shadow = shadow
        self.pair_feed = shadow.feed if shadow is not None else None  # scored on the embedder's beat

    async def aclose(self) -> None:
        if self.shadow is not None:
            await self.shadow.aclose()
        await self.client.aclose()

    def close(self) -> None:
        if not self.client.is_closed:  # not closed on its event loop (aclose): let it go with the process
            pass

    def not_ready(self) -> str | None:
        return None

    def answered_as(self, version: str) -> bool:
        """Whether this upstream's answers were recorded as `version` (or it is configured so)."""
        return version in self._accepted or version in (self.config.release, self.config.model)

    def _release_headers(self) -> dict[str, str]:
        return {RELEASE_HEADER: self.config.release} if self.config.release else {}

    async def models(self) -> Any:
        try:
            resp = await self.client.get("/v1/models", headers=self._headers({}))
        except httpx.HTTPError as exc:
            raise UpstreamUnreachable(
                f"upstream {redact_url(self.config.url)} did not answer: {type(exc).__name__}"
            ) from None
        return Response(
            resp.content, status_code=resp.status_code, media_type=resp.headers.get("content-type")
        )

    def _headers(self, incoming: Any) -> dict[str, str]:
        headers = {k: v for k in _FORWARDED if (v := incoming.get(k)) is not None}
        if "authorization" not in headers and self.config.api_key:
            headers["authorization"] = f"Bearer {self.config.api_key}"
        return headers

    async def completion(
        self, req: ObservedRequest, raw: bytes, headers: Any, *, reveal_version: bool = False
    ) -> Response:
        return await self._forward("/v1/completions", req, req.prompt_text(), raw, headers, chat=False)

    async def chat(
        self, req: ObservedRequest, raw: bytes, headers: Any, *, reveal_version: bool = False
    ) -> Response:
        return await self._forward("/v1/chat/completions", req, req.last_user_text(), raw, headers, chat=True)

    async def _forward(
        self,
        path: str,
        req: ObservedRequest,
        prompt: str | None,
        raw: bytes,
        headers: Any,
        *,
        chat: bool,
    ) -> Response:
        timer = CallTimer()
        rid = f"proxy-{uuid.uuid4().hex}"
        request = self.client.build_request("POST", path, content=raw, headers=self._headers(headers))
        try:
            upstream = await self.client.send(request, stream=True)
        except httpx.HTTPError as exc:
            kind = "UpstreamTimeout" if isinstance(exc, httpx.TimeoutException) else "UpstreamUnreachable"
            self.metrics.proxy_errors.labels(kind).inc()
            self._record(rid, req.model, timer, None, None, kind, prompt, None, req=req)
            raise UpstreamUnreachable(
                f"upstream {redact_url(self.config.url)} did not answer: {type(exc).__name__}"
            ) from None
        except asyncio.CancelledError:  # the client hung up: the upstream call ends with it
            self._record(rid, req.model, timer, None, None, CANCELLED, prompt, None, req=req)
            raise
        content_type = upstream.headers.get("content-type", "application/json")
        if upstream.status_code != 200 or not content_type.startswith("text/event-stream"):
            try:
                body = await upstream.aread()
            except httpx.HTTPError as exc:
                self._record(rid, req.model, timer, None, None, "UpstreamUnreachable", prompt, None, req=req)
                raise UpstreamUnreachable(
                    f"upstream {redact_url(self.config.url)} broke off: {type(exc).__name__}"
                ) from None
            except asyncio.CancelledError:  # the client hung up while the answer came
                self._record(rid, req.model, timer, None, None, CANCELLED, prompt, None, req=req)
                raise
            finally:
                await upstream.aclose()
            live = self._observe_whole(rid, req, timer, prompt, upstream.status_code, body, chat)
            if live is not None and self._shadows(headers):  # after the answer is read: never delays it
                assert self.shadow is not None
                self.shadow.offer(path, raw, headers, prompt, live, chat=chat)
            return Response(body, status_code=upstream.status_code, media_type=content_type,
                            headers=self._release_headers())  # fmt: skip
        return StreamingResponse(
            self._relay(upstream, rid, req, timer, prompt, chat, shadow_of=(path, raw, headers)),
            status_code=200,
            media_type=content_type,
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no", **self._release_headers()},
        )

    def _shadows(self, headers: Any) -> bool:
        """Whether a request may be shadowed: a shadow upstream is set and the request is not
        itself a shadow (one sidecar shadowing to another would otherwise shadow in turn)."""
        return self.shadow is not None and headers.get(SHADOW_HEADER) is None

    async def _relay(
        self, upstream: httpx.Response, rid: str, req: Any, timer: CallTimer, prompt: str | None, chat: bool,
        *, shadow_of: tuple[str, bytes, Any],
    ) -> AsyncIterator[bytes]:  # fmt: skip
        observer = SSEObserver(timer, chat)
        error: str | None = None
        try:
            async for chunk in upstream.aiter_raw():
                observer.feed(chunk)
                yield chunk
        except httpx.HTTPError as exc:
            error = "UpstreamStreamBroken"
            self.metrics.proxy_errors.labels(error).inc()
            yield (
                b'data: {"error":{"type":"upstream_error","message":"upstream stream broke off: '
                + type(exc).__name__.encode()
                + b'"}}\n\n'
            )
        except BaseException:  # the client went away mid-stream
            error = CANCELLED
            raise
        finally:
            await upstream.aclose()
            usage = observer.usage or {}
            version = self._record(
                self._request_id(observer.answer_id, rid), observer.model or req.model, timer, _int(usage.get("prompt_tokens")),
                _int(usage.get("completion_tokens")) if observer.usage else observer.text_chunks,
                error or observer.error, prompt, observer.text, finish=observer.finish_reason, req=req,
            )  # fmt: skip
            if error is None and observer.error is None and self._shadows(shadow_of[2]):
                live = LiveAnswer(version, observer.text, _int(usage.get("completion_tokens")),
                                  observer.finish_reason or "unknown")  # fmt: skip
                path, raw, headers = shadow_of
                assert self.shadow is not None  # _shadows says so
                self.shadow.offer(path, raw, headers, prompt, live, chat=chat)

    def _observe_whole(
        self, rid: str, req: Any, timer: CallTimer, prompt: str | None, status: int, body: bytes, chat: bool
    ) -> LiveAnswer | None:
        """Records the call -> the answer when it succeeded (for the shadow), else None."""
        timer.finish()
        if status != 200:
            self.metrics.proxy_errors.labels(f"http_{status}").inc()
            self._record(rid, req.model, timer, None, None, _status_outcome(status), prompt, None, req=req)
            return None
        try:
            obj = orjson.loads(body)
        except orjson.JSONDecodeError:
            obj = None
        if not isinstance(obj, dict):
            self._record(rid, req.model, timer, None, None, "UpstreamBadJSON", prompt, None, req=req)
            return None
        rid = self._request_id(_answer_id(obj), rid)  # the id the client sees: what its users' feedback names
        usage: dict[str, Any] = obj["usage"] if isinstance(obj.get("usage"), dict) else {}
        choices = obj.get("choices")
        text = (
            _choice_text(choices[0], chat)
            if isinstance(choices, list) and choices and isinstance(choices[0], dict)
            else ""
        )
        model = obj.get("model") if isinstance(obj.get("model"), str) else req.model
        output = _int(usage.get("completion_tokens"))
        first = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else {}
        finish = first.get("finish_reason") if isinstance(first.get("finish_reason"), str) else None
        version = self._record(rid, model, timer, _int(usage.get("prompt_tokens")), output, None, prompt, text,
                               finish=finish, req=req)  # fmt: skip
        return LiveAnswer(version, text, output, finish or "unknown")

    def _request_id(self, answer_id: str | None, rid: str) -> str:
        """The answer's own id as the request id, unless it is missing or was seen lately."""
        if answer_id is None or answer_id in self._recent_ids:
            return rid
        self._recent_ids[answer_id] = None
        if len(self._recent_ids) > _RECENT_IDS:
            self._recent_ids.popitem(last=False)
        return answer_id

    def _record(
        self, rid: str, model_version: str | None, timer: CallTimer, prompt_tokens: int | None,
        output_tokens: int | None, error: str | None, prompt: str | None, response: str | None,
        *, finish: str | None = None, req: Any = None,
    ) -> str:  # fmt: skip
        """Hands the call's record to the pipeline -> the version it is recorded under."""
        # a label slot is only for a name the upstream accepted: junk names answered 4xx or
        # never answered would fill the cap and push the real model into `other`
        if error is None and model_version:
            if len(self._accepted) < _MAX_ACCEPTED_NAMES:
                self._accepted.add(model_version)
        elif model_version not in self._accepted:
            model_version = None
        version = self.config.release or model_version or self.config.model or "unknown"
        self.last_model_version = version
        record = make_record(
            request_id=rid, model=self.config.model or version, model_version=version, timer=timer, source="proxy",
            prompt_tokens=prompt_tokens, output_tokens=output_tokens, error_type=error, prompt=prompt,
            response=response if error is None else None, text_sample_rate=self.text_sample_rate,
            max_tokens=getattr(req, "max_tokens", None), stream=getattr(req, "stream", None),
            finish_reason="cancelled" if error == CANCELLED else "error" if is_server_error(error) else finish,
        )  # fmt: skip
        self.pipeline.submit_one(record)
        return version


_RECENT_IDS = 65_536  # answer ids remembered against repeats
_MAX_ACCEPTED_NAMES = 4096  # names an upstream answered for: a handful in practice; bounded anyway


def _status_outcome(status: int) -> str:
    """The record's error label for an upstream answer that is not 200: a 4xx refused the
    client's request (`client_error`, not a server error), except 408 and 429, which say
    the upstream is too slow or too busy; anything else is `http_<status>`."""
    if 400 <= status < 500 and status not in (408, 429):
        return CLIENT_ERROR
    return f"http_{status}"


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**31 else None


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
            log.debug("upstream metrics at %s: %s", redact_url(self.url), exc)
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
