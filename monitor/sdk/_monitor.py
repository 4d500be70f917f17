"""Monitor: one registry, one InferenceStats, one outbox of sampled records, one sink.

```python
monitor = Monitor(sink=HttpSink("http://127.0.0.1:8000/api/v1/events", token=...), sample_rate=0.05)

@monitor.track(model="fraud-triage", model_version="v3")
def answer(prompt: str) -> str: ...

monitor.serve_metrics(port=9400)   # or mount monitor.registry in your own app
```

Nothing here touches prometheus_client's global REGISTRY. The delivery thread
starts with the first sampled record, not before. Pending records are flushed at
interpreter exit (at most `exit_timeout_s`), and a forked child gets fresh locks, an
empty queue and its own delivery thread.
"""

from __future__ import annotations

import atexit
import itertools
import random
import secrets
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from infersight.collectors import (
    InferenceStats,
    InvalidObservation,
    MetricsServer,
    register_fork_handler,
    serve_metrics,
)
from infersight.monitor.records import InferenceRecord, build_record
from prometheus_client.registry import CollectorRegistry

from ._config import SDKConfig, SDKConfigError, SDKCounters, check_sample_rate, prepare_text
from ._feedback import FeedbackQueue
from ._outbox import Outbox
from ._tracker import Tracker

__all__ = ["DEFAULT_MODEL_VERSION", "Monitor", "configure", "default_monitor", "track"]

DEFAULT_MODEL_VERSION = "unknown"


class Monitor:
    def __init__(
        self,
        registry: CollectorRegistry | None = None,
        *,
        clock: Callable[[], float] = time.perf_counter,
        window_s: float = 3600.0,
        interval_s: float = 10.0,
        relative_accuracy: float = 0.01,
        **options: Any,
    ) -> None:
        """`options`: the fields of SDKConfig (sink, sample_rate, extract_prompt,
        extract_response, redact, max_text_chars, max_payload_chars, queue_size,
        batch_size, flush_interval_s, exit_timeout_s)."""
        self.config = SDKConfig().with_changes(**options)
        self.registry = registry if registry is not None else CollectorRegistry()
        self.clock = clock
        self.stats = InferenceStats(
            self.registry,
            window_s=window_s,
            interval_s=interval_s,
            relative_accuracy=relative_accuracy,
            clock=clock,
        )
        self._outbox: Outbox
        self.counters = SDKCounters(self.registry, queue_depth=lambda: len(self._outbox))
        self._outbox = Outbox(lambda: self.config, self.counters, self._to_records)
        self._feedback = FeedbackQueue(lambda: self.config, self.counters, self._text)
        self._closed = False
        self._new_ids()
        register_fork_handler(self)
        _at_exit.add(self)

    # -- set-up ---------------------------------------------------------------------------
    def configure(self, **options: Any) -> Monitor:
        """Replace options (validated whole; raises SDKConfigError, keeps the old ones)."""
        self.config = self.config.with_changes(**options)
        return self

    def track(
        self,
        fn: Callable[..., Any] | None = None,
        *,
        model: str | None = None,
        model_version: str = DEFAULT_MODEL_VERSION,
        sample_rate: float | None = None,
        extract_prompt: Callable[[tuple[Any, ...], dict[str, Any]], Any] | None = None,
        extract_response: Callable[[Any], Any] | None = None,
        request_id: Callable[[Any], Any] | None = None,
    ) -> Any:
        """`@monitor.track(model=...)`, bare `@monitor.track` (model: the function's
        qualified name), or `with monitor.track(model=...) as call:`.

        `request_id`: a function of the result (of a stream: the list of its items) returning
        the id a sampled record gets, e.g. `lambda answer: answer.id` for an OpenAI answer, so
        that `feedback(answer.id, ...)` joins it."""
        if request_id is not None and not callable(request_id):
            raise SDKConfigError("track(): request_id must be a function of the call's result")
        if fn is not None and not callable(fn):
            raise SDKConfigError("track() takes the function to wrap, or keyword options only")
        if sample_rate is not None:
            check_sample_rate(sample_rate)
        name = model if model is not None else (getattr(fn, "__qualname__", None) if fn else None)
        if not isinstance(name, str) or not name:
            raise SDKConfigError("track() needs model=<non-empty name> (or decorate a named function)")
        try:
            tracker = Tracker(
                self,
                model=name,
                model_version=model_version,
                sample_rate=sample_rate,
                extract_prompt=extract_prompt,
                extract_response=extract_response,
                request_id=request_id,
            )
        except InvalidObservation as exc:
            raise SDKConfigError(
                f"track(): {exc.field} must be a non-empty string of at most 256 characters"
            ) from exc
        return tracker(fn) if fn is not None else tracker

    # -- the manual API ---------------------------------------------------------------------
    def record(
        self,
        *,
        model: str,
        model_version: str = DEFAULT_MODEL_VERSION,
        duration_s: float,
        ttft_s: float | None = None,
        tpot_s: float | None = None,
        queue_s: float | None = None,
        prompt_tokens: int | None = None,
        output_tokens: int | None = None,
        error_type: str | None = None,
        prompt: Any = None,
        response: Any = None,
    ) -> bool:
        """Record a call measured elsewhere. Bad values (NaN, negative, non-numeric) are
        refused and counted in infersight_sdk_records_rejected_total{reason}; returns
        whether the call was recorded. Never raises."""
        try:
            self.stats.add(
                model=model,
                model_version=model_version,
                duration_s=duration_s,
                ttft_s=ttft_s,
                tpot_s=tpot_s,
                queue_s=queue_s,
                prompt_tokens=prompt_tokens,
                output_tokens=output_tokens,
                error_type=error_type,
            )
        except InvalidObservation as exc:
            self.counters.count("rejected", exc.reason)
            return False
        except Exception:
            self.counters.count("internal", "record")
            return False
        try:
            rate = self.config.sample_rate
            if rate and (rate >= 1.0 or random.random() < rate):
                texts = []
                for text in (prompt, response):
                    if text is not None and not isinstance(text, str):
                        self.counters.count("rejected", "non_string_payload")
                        text = None
                    texts.append(text)
                started_at = time.time() - float(duration_s)
                self.enqueue(
                    (model, model_version, started_at, float(duration_s), ttft_s, tpot_s, queue_s,
                     prompt_tokens, output_tokens, error_type, texts[0], texts[1], None)
                )  # fmt: skip
        except Exception:
            self.counters.count("internal", "sample")
        return True

    def feedback(
        self,
        request_id: str,
        *,
        score: float | None = None,
        thumbs: str | None = None,
        rating: int | None = None,
        kind: str | None = None,
        comment: str | None = None,
        user: str | None = None,
    ) -> bool:
        """A user's feedback on a request (the `id` of its OpenAI-compatible answer): exactly
        one of `score` (0..1), `thumbs` ("up" or "down") or `rating` (1-5). Queued and sent
        from the background thread; returns whether it was queued. Never raises, never blocks."""
        return self._feedback.put(request_id, score=score, thumbs=thumbs, rating=rating, kind=kind,
                                  comment=comment, user=user)  # fmt: skip

    # -- delivery --------------------------------------------------------------------------------
    def enqueue(self, item: tuple[Any, ...]) -> None:
        self._outbox.put(item)

    def _new_ids(self) -> None:
        """Request ids: 64 random bits per process, then a counter (cheaper than uuid4)."""
        self._id_prefix = secrets.token_hex(8)
        self._id_counter = itertools.count(1)

    def _to_records(self, items: list[tuple[Any, ...]]) -> list[InferenceRecord]:
        """The delivery thread's work per batch: an id, checked text, one record per item.

        Written as one loop with everything it reads held in locals: it runs once per
        sampled call, and at 100% sampling its cost is most of the SDK's (docs/benchmarks/ingest.md).
        The fields are unpacked by name and passed on by name on purpose: it is faster than
        star-unpacking or slicing the tuple."""
        prefix, ids, text, record, cfg = (
            self._id_prefix,
            self._id_counter,
            self._text,
            build_record,
            self.config,
        )
        plain = cfg.redact is None
        limit = cfg.max_text_chars
        out = []
        for (
            model,
            version,
            started_at,
            duration,
            ttft,
            tpot,
            queue,
            ptok,
            otok,
            error,
            prompt,
            response,
            rid,
        ) in items:
            if prompt is not None and not (plain and len(prompt) <= limit):
                prompt = text("prompt", prompt)
            if response is not None and not (plain and len(response) <= limit):
                response = text("response", response)
            out.append(
                record(
                    rid or f"{prefix}-{next(ids):x}",
                    model,
                    version,
                    started_at if started_at > 0.0 else 0.0,
                    duration if duration > 0.0 else 0.0,
                    ttft,
                    tpot,
                    queue,
                    ptok,
                    otok,
                    error,
                    prompt,
                    response,
                    "sdk",
                )
            )
        return out

    def _text(self, field: str, text: str | None) -> str | None:
        if text is None:
            return None
        cfg = self.config
        if cfg.redact is None and len(text) <= cfg.max_text_chars:
            return text
        out, reason = prepare_text(
            text,
            max_text_chars=cfg.max_text_chars,
            max_payload_chars=cfg.max_payload_chars,
            redact=cfg.redact,
        )
        if reason == "truncated":
            self.counters.count("truncated", field)
        elif reason is not None:
            self.counters.count("rejected", reason)
        return out

    def flush(self, timeout: float = 5.0) -> bool:
        """Deliver every queued record and feedback item; True when done within `timeout` seconds."""
        return self._outbox.flush(timeout) and self._feedback.flush(timeout)

    def close(self, timeout: float | None = None) -> bool:
        """Flush (at most `timeout`, default exit_timeout_s) and stop the delivery thread."""
        if self._closed:
            return True
        self._closed = True
        limit = self.config.exit_timeout_s if timeout is None else timeout
        return self._outbox.stop(limit) and self._feedback.stop(limit)

    # -- exposition ------------------------------------------------------------------------------
    def serve_metrics(self, *, port: int = 0, host: str = "127.0.0.1") -> MetricsServer:
        """Serve this monitor's registry at http://host:port/metrics (port 0: a free one)."""
        return serve_metrics(self.registry, port=port, host=host)

    def _after_fork_in_child(self) -> None:
        self._new_ids()
        self._outbox.after_fork_in_child()
        self._feedback.after_fork_in_child()


class _AtExit:
    """Closes (flushes) every live monitor at interpreter exit; installed with the first."""

    def __init__(self) -> None:
        self.monitors: weakref.WeakSet[Monitor] = weakref.WeakSet()
        self.installed = False
        self.lock = threading.Lock()

    def add(self, monitor: Monitor) -> None:
        self.monitors.add(monitor)
        with self.lock:
            if not self.installed:
                atexit.register(self.close_all)
                self.installed = True

    def close_all(self) -> None:
        for monitor in list(self.monitors):
            try:
                monitor.close()
            except Exception:
                continue


_at_exit = _AtExit()


# ---- the default monitor behind the module-level `track`, made on first use (never at import) ----


class _Default:
    def __init__(self) -> None:
        self.monitor: Monitor | None = None
        self.lock = threading.Lock()

    def get(self) -> Monitor:
        if self.monitor is None:
            with self.lock:
                if self.monitor is None:
                    self.monitor = Monitor()
        return self.monitor


_default = _Default()


def default_monitor() -> Monitor:
    """The process's default Monitor (its `registry` is what to serve at /metrics)."""
    return _default.get()


def configure(**options: Any) -> Monitor:
    """Set options of the default monitor (sink, sample_rate, redact, ...); returns it."""
    return _default.get().configure(**options)


def feedback(
    request_id: str,
    *,
    score: float | None = None,
    thumbs: str | None = None,
    rating: int | None = None,
    kind: str | None = None,
    comment: str | None = None,
    user: str | None = None,
) -> bool:
    """A user's feedback on a request, sent by the default monitor. See `Monitor.feedback`."""
    return _default.get().feedback(request_id, score=score, thumbs=thumbs, rating=rating, kind=kind,
                                   comment=comment, user=user)  # fmt: skip


def track(
    fn: Callable[..., Any] | None = None,
    *,
    model: str | None = None,
    model_version: str = DEFAULT_MODEL_VERSION,
    sample_rate: float | None = None,
    extract_prompt: Callable[[tuple[Any, ...], dict[str, Any]], Any] | None = None,
    extract_response: Callable[[Any], Any] | None = None,
    request_id: Callable[[Any], Any] | None = None,
) -> Any:
    """Track calls on the default monitor: `@track(model="m", model_version="v1")`,
    bare `@track`, or `with track(model="m") as call:`. See `Monitor.track`."""
    return _default.get().track(
        fn,
        model=model,
        model_version=model_version,
        sample_rate=sample_rate,
        extract_prompt=extract_prompt,
        extract_response=extract_response,
        request_id=request_id,
    )
