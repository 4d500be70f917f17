"""Serving `/v1` with the embedded runtime (`infersight.engine.Runtime`).

Prompts are tokenized with the serving version's tokenizer (chat through the model's own
template where its checkpoint has one, chat_template.py, else the documented one of
openai_api.py), generated with the runtime's continuous batching, and
streamed as SSE. Every call becomes an `InferenceRecord` (source "engine") with its
measured latency, time to first token, token counts and, sampled, its text. What the
client caused is recorded under its own label, never as a server error: a prompt over
the limits (answered 400) is `client_error`, a client that hangs up is `cancelled`.

Answers name the stable model (`model_name`), never the version that served them, so a
canary's clients cannot tell (or steer) their arm; a caller with the bearer token
(`reveal_version`) is told the version in the `x-infersight-version` header.

The runtime it serves with is started from `engine:`, and its canary resumed after a restart,
in wiring_engine.py.
"""

from __future__ import annotations

import asyncio
import math
import uuid
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

from fastapi import HTTPException
from fastapi.responses import JSONResponse, Response, StreamingResponse
from infersight.monitor.records import CANCELLED, CLIENT_ERROR, OVERLOADED, SHED
from prometheus_client import CollectorRegistry
from sqlalchemy import Engine

from . import openai_api as fmt
from .chat_template import ChatTemplateFailed, render_template
from .errors import BackendUnavailable
from .openai_api import ChatRequest, CompletionRequest, TextStream, render_chat
from .overload import PromptEncoder, PromptOverCharacters
from .pair_feed import engine_release_checks
from .pipeline import CallTimer, make_record
from .wiring_engine import model_of, resume_canary, start_runtime

if TYPE_CHECKING:
    from infersight.collectors import InferenceStats

    from .config import ServiceConfig
    from .metrics import CombinedRegistry
    from .pipeline import RecordPipeline

__all__ = ["EngineBackend"]

_FINISH = {"stop": "stop", "length": "length", "cancelled": "stop"}
VERSION_HEADER = "x-infersight-version"  # which version answered: only to callers with the token
# Below these the sampling distribution is a point mass at float precision; dividing logits
# by a subnormal temperature overflows and a top_p that underflows keeps no token, which
# the sampler refuses (found by the API fuzz test): such requests are served greedily.
_MIN_TEMPERATURE = 1e-4
_MIN_TOP_P = 1e-6


def _temperature(value: float) -> float:
    return 0.0 if value < _MIN_TEMPERATURE else value


class EngineBackend:
    """Serves `/v1` with `runtime`; records each call into `pipeline`, exposes the runtime's
    collectors in `exposition`, reads the canary's stored requests from `db`, and hands every
    canary decision to `on_canary_decision` (the composition root's: log, alert) and a
    rollback then to `on_canary_rollback` (the action runner's; None: the runtime aborts it)."""

    def __init__(
        self,
        runtime: Any,
        *,
        owned: bool,
        config: ServiceConfig,
        db: Engine,
        pipeline: RecordPipeline,
        exposition: CombinedRegistry,
        on_canary_decision: Callable[[Any], None] = lambda decision: None,
        on_canary_rollback: Callable[[Any], None] | None = None,
    ) -> None:
        self.config = config
        self.db = db
        self.pipeline = pipeline
        self.exposition = exposition
        self.runtime = runtime
        self._owned = owned
        cfg = config.engine
        self.max_tokens_limit = cfg.max_tokens_limit if cfg is not None else 1024
        self.user_header = cfg.canary_user_header if cfg is not None else None
        # the canary's controller, and the pairs' scoring with the runtime's shadow support (pair_feed.py)
        self.pair_share, self.canary_controller, self.pair_feed = engine_release_checks(
            runtime, config, on_canary_decision, on_canary_rollback
        )
        self.route_metrics: Any = None  # SLA routing's metrics, with `routing:` only
        # bounds a prompt's work before tokenizing it, and tokenizes off the event loop
        self.encoder = PromptEncoder(int(getattr(runtime, "max_prompt_tokens", 1024)))

    @classmethod
    def start(
        cls,
        config: ServiceConfig,
        db: Engine,
        *,
        pipeline: RecordPipeline,
        exposition: CombinedRegistry,
        runtime: Any = None,
        on_canary_decision: Callable[[Any], None] = lambda decision: None,
        on_canary_rollback: Callable[[Any], None] | None = None,
    ) -> EngineBackend:
        """Start the configured runtime (`config.engine`), or wrap the given `runtime`."""

        def backend(runtime: Any, *, owned: bool) -> EngineBackend:
            return cls(runtime, owned=owned, config=config, db=db, pipeline=pipeline, exposition=exposition,
                       on_canary_decision=on_canary_decision, on_canary_rollback=on_canary_rollback)  # fmt: skip

        if runtime is not None:
            return backend(runtime, owned=False)
        return backend(start_runtime(config, db), owned=True)

    def observe_events(self, stats: InferenceStats | None) -> None:
        """Feed the live statistics from the runtime's events (queue, in flight, timings),
        and expose the prefix cache's counters (read from the runtime at scrape time)."""
        from infersight.collectors import EngineAdapter, EnginePathCollector

        from .runtime_store import PrefixCacheCollector

        if hasattr(self.runtime, "prefix_cache_stats"):
            prefix_metrics = CollectorRegistry(auto_describe=False)
            prefix_metrics.register(PrefixCacheCollector(self.runtime, model=self.model_name))
            self.exposition.add(prefix_metrics)
        if hasattr(self.runtime, "engine_paths"):
            path_metrics = CollectorRegistry(auto_describe=False)
            path_metrics.register(EnginePathCollector(self.runtime, model=self.model_name))
            self.exposition.add(path_metrics)

        if stats is not None:
            self._adapter = EngineAdapter(stats, model=self.model_name)
            self._unsubscribe = self.runtime.subscribe(self._adapter)
            if self.runtime.serving_version:  # deployed before we subscribed: at 0 from the first scrape
                stats.series(self.model_name, self.runtime.serving_version, trusted=True)
        if self.canary_controller is not None:
            self._unsubscribe_canary = self.runtime.subscribe(self.canary_controller.on_event)
        if self.pair_feed is not None:
            from .pair_feed import ShadowCollector

            self._unsubscribe_pairs = self.runtime.subscribe(self.pair_feed.on_event)
            shadow_metrics = CollectorRegistry(auto_describe=False)
            shadow_metrics.register(ShadowCollector(self.runtime, self.pair_feed, model=self.model_name))
            self.exposition.add(shadow_metrics)
        routing = self.config.routing
        if routing is not None and getattr(self.runtime, "routing", None) is not None:
            from .sla_routing import RouteMetrics

            self.route_metrics = RouteMetrics(self.runtime, routing)
            self.exposition.add(self.route_metrics.registry)
            self._unsubscribe_routing = self.runtime.subscribe(self.route_metrics.on_event)

    def resume_canary(self) -> None:
        """After a restart: the canary the registry's deploy history left running serves
        again beside the stable version, and its analysis goes on from the requests the
        store recorded since it started (wiring_engine.py); only for a runtime started here."""
        if self.canary_controller is None or not self._owned:
            return
        resume_canary(self.runtime, self.canary_controller, self.db)

    def _hang_up(self, handle: Any) -> None:
        """The client went away: stop generating for it, counted as `cancelled`."""
        adapter = getattr(self, "_adapter", None)
        if adapter is not None:
            adapter.hung_up(handle.request_id)
        handle.cancel()

    def close(self) -> None:
        self.encoder.close()
        for name in ("_unsubscribe", "_unsubscribe_canary", "_unsubscribe_routing", "_unsubscribe_pairs"):
            unsubscribe = getattr(self, name, None)
            if unsubscribe is not None:
                unsubscribe()
        if self._owned:
            self.runtime.stop(drain=False)

    def not_ready(self) -> str | None:
        if not self.runtime.is_running or self.runtime.serving_version is None:
            return "the embedded runtime is not serving"
        if self.runtime.tokenizer is None:
            return "the serving version has no tokenizer"
        return None

    @property
    def model_name(self) -> str:
        if self.config.model:
            return self.config.model
        return model_of(self.runtime.serving_version)

    async def models(self) -> dict[str, Any]:
        """The stable model name first (clients should use it: it survives deploys and
        rollbacks), then the serving version's own name (which pins nothing: both serve)."""
        serving = self.runtime.serving_version
        if not serving:
            return {"object": "list", "data": []}
        ids = [self.model_name] + ([serving] if serving != self.model_name else [])
        return {"object": "list", "data": [{"id": i, "object": "model", "created": 0, "owned_by": "infersight"}
                                           for i in ids]}  # fmt: skip

    # -- requests ------------------------------------------------------------------------
    async def completion(
        self, req: CompletionRequest, raw: bytes, headers: Any, *, reveal_version: bool = False
    ) -> Response:
        if not isinstance(req.prompt, str) and len(req.prompt) > 1:
            raise HTTPException(
                422, {"field": "body.prompt", "reason": "the embedded runtime takes one prompt per request"}
            )
        user = self._user(req, headers)
        return await self._serve(
            req, req.prompt_text(), req.prompt_text(), req.max_tokens, chat=False, user=user,
            reveal=reveal_version,
        )  # fmt: skip

    async def chat(
        self, req: ChatRequest, raw: bytes, headers: Any, *, reveal_version: bool = False
    ) -> Response:
        """The messages rendered in the template of each loaded version that may answer them
        (`Runtime.chat_formats`: the serving version, a canary, the previous version kept for
        pairs), once per distinct template, so that each version answers, live or as a
        shadow, the chat as its own release renders it; with one template, one rendering.
        A template that fails for any of them is the client's 400, as the serving one's is."""
        rendered: dict[tuple[str | None, tuple[tuple[str, str], ...]], str] = {}
        by_version: dict[str, str] = {}
        for version, (template, special) in _chat_formats(self.runtime).items():
            key = (template, tuple(sorted(special.items())))
            if key not in rendered:
                try:
                    rendered[key] = _render(req, template, special)
                except ChatTemplateFailed as exc:
                    body = fmt_error(400, str(exc), "body.messages", "invalid_messages")
                    return JSONResponse(body, status_code=400)
            by_version[version] = rendered[key]
        texts = list(by_version.values())
        prompt = texts[0] if texts else render_chat(req.messages)  # the serving version's, listed first
        return await self._serve(
            req, prompt, req.last_user_text(), req.token_budget(), chat=True,
            user=self._user(req, headers), system=req.system_text(), reveal=reveal_version,
            texts_by_version=by_version if len(rendered) > 1 else None,
        )  # fmt: skip

    def _user(self, req: CompletionRequest | ChatRequest, headers: Any) -> str | None:
        """The key that keeps a user on one version during a canary."""
        if self.user_header and headers is not None:
            value = headers.get(self.user_header)
            if value:
                return str(value)
        return req.user

    async def _serve(
        self,
        req: CompletionRequest | ChatRequest,
        text: str,
        observed_prompt: str,
        max_tokens: int | None,
        *,
        chat: bool,
        user: str | None = None,
        system: str | None = None,  # a chat's system messages, kept in its record
        reveal: bool = False,  # the caller has the token: tell it which version answered
        texts_by_version: dict[str, str] | None = None,  # a chat's renderings, when they differ
    ) -> Response:
        """Tokenize `text` (and each of `texts_by_version`: the version it is routed to answers
        its own) and serve it. Every rendering is tokenized with the serving version's
        tokenizer: the versions of one model share it, only their templates may differ."""
        from infersight.engine.errors import (
            InvalidRequest,
            PathOverloaded,
            PromptTooLong,
            QueueFull,
            RuntimeNotRunning,
        )

        if req.n != 1:
            raise HTTPException(422, {"field": "body.n", "reason": "the embedded runtime serves n=1 only"})
        if max_tokens is not None and max_tokens > self.max_tokens_limit:
            field = (
                "body.max_completion_tokens"
                if chat and getattr(req, "max_completion_tokens", None)
                else "body.max_tokens"
            )
            raise HTTPException(422, {"field": field, "reason": f"at most {self.max_tokens_limit}"})
        serving = self.runtime.serving_version
        if req.model is not None and serving is not None and req.model not in (serving, self.model_name):
            raise HTTPException(
                404,
                {
                    "field": "body.model",
                    "reason": f"model {req.model!r} is not served here (serving {serving})",
                },
            )
        tokenizer = self.runtime.tokenizer
        if tokenizer is None:
            raise BackendUnavailable("the serving version has no tokenizer")
        field = "body.messages" if chat else "body.prompt"
        asked = (max_tokens, bool(req.stream))  # the request's shape, kept in its record
        try:
            prompt_ids = await self.encoder.encode(tokenizer, text)
            encoded = {text: prompt_ids}
            for other in (texts_by_version or {}).values():
                if other not in encoded:
                    encoded[other] = await self.encoder.encode(tokenizer, other)
        except PromptOverCharacters as exc:  # refused before tokenizing: a 7 MB prompt costs a len()
            self._record(f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}", serving, CallTimer(), None, 0,
                         None, CLIENT_ERROR, observed_prompt, None, system=system, asked=asked)  # fmt: skip
            return JSONResponse(fmt_error(400, str(exc), field, "context_length_exceeded"), status_code=400)
        if not all(encoded.values()):
            raise HTTPException(
                422, {"field": "body.messages" if chat else "body.prompt", "reason": "the prompt is empty"}
            )
        prompts_by_version = (
            {version: encoded[t] for version, t in texts_by_version.items()}
            if texts_by_version and len(encoded) > 1
            else None
        )
        budget = max_tokens if max_tokens is not None else self.max_tokens_limit
        # one budget for every rendering (a pair's two sides ask for the same), so the longest fits
        longest = max(len(ids) for ids in encoded.values())
        budget = max(1, min(budget, self.runtime.max_seq_len - longest))
        timer = CallTimer()
        request_id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        controller = getattr(self, "canary_controller", None)
        if controller is not None:  # the canary compares like with like (alerts/release/strata.py)
            controller.note_shape(request_id, max_tokens, bool(req.stream))
        try:
            handle = self.runtime.submit(
                prompt_ids, max_new_tokens=budget, temperature=_temperature(req.temperature),
                top_p=max(req.top_p, _MIN_TOP_P), seed=req.seed, request_id=request_id, user=user,
                text=observed_prompt, prompts_by_version=prompts_by_version,
            )  # fmt: skip
        except PromptTooLong as exc:
            self._record(request_id, serving, timer, len(prompt_ids), 0, None, CLIENT_ERROR, observed_prompt, None,
                         system=system, asked=asked)  # fmt: skip
            return JSONResponse(fmt_error(400, str(exc), field, "context_length_exceeded"), status_code=400)
        except PathOverloaded as exc:  # SLA routing's length breaker is open for this length
            self._record(request_id, serving, timer, len(prompt_ids), 0, None, SHED,
                         observed_prompt, None, path=exc.path, system=system, asked=asked)  # fmt: skip
            retry = str(max(1, math.ceil(exc.retry_after_s)))
            return JSONResponse(fmt_error(503, str(exc), None, "path_overloaded"), status_code=503,
                                headers={"Retry-After": retry})  # fmt: skip
        except QueueFull as exc:  # admission control: the path's queue is full or its wait too long
            self._record(request_id, serving, timer, len(prompt_ids), 0, None, OVERLOADED,
                         observed_prompt, None, path=exc.path if self.route_metrics is not None and routed(exc.path) else None, system=system, asked=asked)  # fmt: skip
            retry = str(max(1, math.ceil(exc.retry_after_s)))
            return JSONResponse(fmt_error(429, str(exc), None, "overloaded"), status_code=429,
                                headers={"Retry-After": retry})  # fmt: skip
        except InvalidRequest as exc:
            raise HTTPException(422, {"field": "body", "reason": str(exc)}) from None
        except RuntimeNotRunning as exc:
            raise BackendUnavailable(str(exc)) from None
        n_prompt = len((prompts_by_version or {}).get(handle.model_version, prompt_ids))  # the live prompt's
        stream = TextStream(lambda ids: tokenizer.decode(ids, skip_special_tokens=True), req.stop_list())
        if req.stream:
            include_usage = bool(req.stream_options and req.stream_options.include_usage)
            version = {VERSION_HEADER: handle.model_version} if reveal else {}
            chunks = self._sse(handle, stream, timer, chat, include_usage, observed_prompt, n_prompt,
                               system, reveal, asked=asked)  # fmt: skip
            return StreamingResponse(
                chunks,
                media_type="text/event-stream",
                headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no", **version},
            )
        return await self._whole(
            handle,
            stream,
            timer,
            chat,
            observed_prompt,
            n_prompt,
            system,
            reveal,
            tokenizer=tokenizer,
            asked=asked,
        )

    def _public(self, message: str, version: str, reveal: bool) -> str:
        """`message` as the client may read it: the version named only to a caller with the token."""
        return message if reveal or not version else message.replace(version, self.model_name)

    async def _whole(
        self, handle: Any, stream: TextStream, timer: CallTimer, chat: bool, prompt: str, n_prompt: int,
        system: str | None, reveal: bool = False, *, tokenizer: Any, asked: tuple[int | None, bool] = (None, False),
    ) -> Response:  # fmt: skip
        from infersight.engine.errors import GenerationFailed

        try:
            async for token in handle:
                timer.first()
                if not stream.has_stops:
                    stream.hold(token)  # decoded once at the end, off the event loop
                    continue
                stream.push(token)
                if stream.stopped:
                    handle.cancel()
                    break
            completion = await handle.aresult()
            if not stream.has_stops:  # decode_batch releases the GIL (decode holds it)
                decoded = await self.encoder.run(
                    tokenizer.decode_batch, [stream.ids], skip_special_tokens=True
                )
                stream.settle(decoded[0])
        except GenerationFailed as exc:
            self._record(handle.request_id, handle.model_version, timer, n_prompt, stream.token_count, None,
                         type(exc).__name__, prompt, None, path=getattr(handle, "path", None), system=system,
                         asked=asked, finish="error")  # fmt: skip
            raise BackendUnavailable(
                self._public(f"generation failed: {exc}", handle.model_version, reveal)
            ) from None
        except asyncio.CancelledError:  # the client went away: stop generating for it
            self._hang_up(handle)
            self._record(handle.request_id, handle.model_version, timer, n_prompt, stream.token_count, None,
                         CANCELLED, prompt, None, path=getattr(handle, "path", None), system=system,
                         asked=asked, finish="cancelled")  # fmt: skip
            raise
        stream.flush()
        finish = "stop" if stream.stopped else _FINISH.get(completion.finish_reason, "stop")
        n_out = stream.token_count
        self._record(handle.request_id, completion.model_version, timer, n_prompt, n_out, completion.queue_s, None,
                     prompt, stream.text, path=getattr(handle, "path", None), system=system, asked=asked,
                     finish=finish)  # fmt: skip
        u = fmt.usage(n_prompt, n_out)
        body = (fmt.chat_response if chat else fmt.completion_response)(
            handle.request_id, self.model_name, stream.text, finish, u
        )
        return JSONResponse(body, headers={VERSION_HEADER: completion.model_version} if reveal else None)

    async def _sse(
        self, handle: Any, stream: TextStream, timer: CallTimer, chat: bool, include_usage: bool, prompt: str,
        n_prompt: int, system: str | None, reveal: bool = False, *, asked: tuple[int | None, bool] = (None, True),
    ) -> AsyncIterator[bytes]:  # fmt: skip
        from infersight.engine.errors import GenerationFailed

        rid, version, name = handle.request_id, handle.model_version, self.model_name
        error: str | None = None
        completion = None
        finished = False
        finish: str | None = None
        try:
            if chat:
                yield fmt.sse(fmt.chat_chunk(rid, name, {"role": "assistant", "content": ""}, None))
            async for token in handle:
                timer.first()
                piece = stream.push(token)
                if piece:
                    yield fmt.sse(_piece(rid, name, piece, chat))
                if stream.stopped:
                    handle.cancel()
                    break
            completion = await handle.aresult()
            rest = stream.flush()
            if rest:
                yield fmt.sse(_piece(rid, name, rest, chat))
            finish = "stop" if stream.stopped else _FINISH.get(completion.finish_reason, "stop")
            last = (
                fmt.chat_chunk(rid, name, {}, finish) if chat else fmt.completion_chunk(rid, name, "", finish)
            )
            yield fmt.sse(last)
            if include_usage:
                obj = "chat.completion.chunk" if chat else "text_completion"
                yield fmt.sse(fmt.usage_chunk(rid, name, obj, fmt.usage(n_prompt, stream.token_count)))
            yield fmt.SSE_DONE
            finished = True
        except GenerationFailed as exc:
            error = type(exc).__name__
            yield fmt.sse(
                fmt_error(503, self._public(f"generation failed: {exc}", version, reveal), None, None)
            )
            yield fmt.SSE_DONE
        finally:
            if not finished and error is None:  # the client went away mid-stream
                error = CANCELLED
                self._hang_up(handle)
            if error is not None:
                finish = "cancelled" if error == CANCELLED else "error"
            version = completion.model_version if completion is not None else version
            queue_s = completion.queue_s if completion is not None else None
            self._record(
                rid,
                version,
                timer,
                n_prompt,
                stream.token_count,
                queue_s,
                error,
                prompt,
                stream.text,
                path=getattr(handle, "path", None),
                system=system,
                asked=asked,
                finish=finish,
            )

    def _record(
        self, request_id: str, version: str | None, timer: CallTimer, prompt_tokens: int | None, output_tokens: int,
        queue_s: float | None, error: str | None, prompt: str | None, response: str | None,
        *, path: str | None = None, system: str | None = None, asked: tuple[int | None, bool] = (None, False),
        finish: str | None = None,
    ) -> None:  # fmt: skip
        record = make_record(
            request_id=request_id, model=self.model_name, model_version=version or "unknown", timer=timer,
            source="engine", prompt_tokens=prompt_tokens, output_tokens=output_tokens, queue_s=queue_s,
            error_type=error, prompt=prompt, response=response if error is None else None,
            text_sample_rate=self.config.text_sample_rate, path=path, system_prompt=system,
            max_tokens=asked[0], stream=asked[1], finish_reason=finish,
        )  # fmt: skip
        route_metrics = getattr(self, "route_metrics", None)
        if route_metrics is not None:
            route_metrics.observe(path, record.duration_s, error)
        self.pipeline.submit_one(record, observe=False)  # the EngineAdapter fed the statistics


def _chat_formats(runtime: Any) -> dict[str, tuple[str | None, dict[str, str]]]:
    """Each loaded version's (chat template, special tokens), the serving version's first."""
    formats = getattr(runtime, "chat_formats", None)
    serving = runtime.serving_version
    if not formats:  # a runtime that tells only the serving version's
        return {serving: runtime.chat_format} if serving is not None else {}
    return dict(sorted(formats.items(), key=lambda item: item[0] != serving))


def _render(req: ChatRequest, template: str | None, special: dict[str, str]) -> str:
    """`req`'s messages as a prompt: in `template` (chat_template.py; raises
    ChatTemplateFailed), or the documented lines of openai_api.py where there is none."""
    if template is None:
        return render_chat(req.messages)
    messages = [{"role": m.role, "content": m.text()} | ({"name": m.name} if m.name else {})
                for m in req.messages]  # fmt: skip
    return render_template(template, messages, special)


def routed(path: str) -> bool:
    """A routing path's name (not the canary's queue): the records' `path` column."""
    return path in ("fast", "standard")


def _piece(rid: str, model: str, text: str, chat: bool) -> dict[str, Any]:
    if chat:
        return fmt.chat_chunk(rid, model, {"content": text}, None)
    return fmt.completion_chunk(rid, model, text, None)


def fmt_error(status: int, message: str, field: str | None, code: str | None) -> dict[str, Any]:
    from .http_edge import error_body

    body = error_body(status, message, field)
    body["error"]["code"] = code
    return body
