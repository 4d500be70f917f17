"""EngineAdapter: observe the embedded runtime through its events (engine/events.py).

`runtime.subscribe(EngineAdapter(stats, model="mixtral"))` feeds InferenceStats
(queue time, TTFT from the first TokenEmitted, TPOT from the token timestamps,
errors, in-flight and waiting) and hands one `InferenceRecord` (source "engine") per
finished or failed request to `on_record`. A request the runtime refused before the
model saw it (over-long prompt, invalid request) is the client's `client_error`, one
shed or refused by admission control is `shed` / `overloaded` (monitor/outcomes.py maps the
engine's error classes once); one
whose client hung up (the server calls `hung_up(request_id)` before cancelling it) is
`cancelled`: neither counts as a server error. Runs on the engine's loop thread, so it
only does dictionary work and appends; it never raises into the engine (a failure is
counted in `failures`).

Events are dispatched on their class name, so this module imports nothing from the engine
at run time but its torch-free errors (through monitor/outcomes.py): observing the engine
never pulls torch in.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from infersight.monitor.outcomes import engine_label
from infersight.monitor.records import CANCELLED, InferenceRecord
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from ._inference import InferenceStats

if TYPE_CHECKING:
    from infersight.engine.events import EngineEvent

__all__ = ["EngineAdapter", "EnginePathCollector"]


@dataclass
class _Request:
    model_version: str
    arrived_at: float  # wall clock
    prompt_tokens: int | None = None
    started: bool = False
    queued: bool = False
    queue_s: float | None = None
    first_token_s: float | None = None  # since arrival
    last_token_s: float | None = None
    tokens: int = 0
    hung_up: bool = False  # the client went away: its cancellation is the client's doing


class EngineAdapter:
    def __init__(
        self,
        stats: InferenceStats,
        *,
        model: str,
        on_record: Callable[[InferenceRecord], None] | None = None,
        max_tracked: int = 100_000,
    ) -> None:
        self._stats = stats
        self._model = model
        self._on_record = on_record
        self._max_tracked = max_tracked
        self._requests: dict[str, _Request] = {}
        self.failures = 0  # events this adapter could not handle
        self.evicted = 0  # requests forgotten because more than max_tracked were open

    def __call__(self, event: EngineEvent) -> None:
        """The subscriber: one engine event (see engine/events.py)."""
        try:
            self._handle(event)
        except Exception:  # never into the engine's loop
            self.failures += 1

    def hung_up(self, request_id: str) -> None:
        """The client of `request_id` went away (call before cancelling it): it ends as
        `cancelled`, not as a completed request. Unknown or finished ids are ignored."""
        req = self._requests.get(request_id)
        if req is not None:
            req.hung_up = True

    def _handle(self, event: Any) -> None:
        kind = type(event).__name__
        if kind == "RequestQueued":
            self._track(event.request_id, event.model_version, event.at).prompt_tokens = event.prompt_tokens
            self._requests[event.request_id].queued = True
            self._stats.series(self._model, event.model_version, trusted=True).add_waiting(1)
        elif kind == "RequestStarted":
            req = self._track(event.request_id, event.model_version, event.at - event.queue_s)
            series = self._stats.series(self._model, event.model_version, trusted=True)
            if req.queued:
                series.add_waiting(-1)
                req.queued = False
            req.started = True
            req.queue_s = event.queue_s
            series.enter()
        elif kind == "TokenEmitted":
            streaming = self._requests.get(event.request_id)
            if streaming is not None:
                if streaming.first_token_s is None or event.index == 0:
                    streaming.first_token_s = event.since_start_s
                streaming.last_token_s = event.since_start_s
                streaming.tokens = max(streaming.tokens, event.index + 1)
        elif kind == "RequestFinished":
            self._finish(event)
        elif kind == "RequestFailed":
            self._fail(event)
        elif kind == "VersionDeployed":  # its series exist at 0 before its first request (for rate())
            self._stats.series(self._model, event.to_version, trusted=True)

    def _track(self, request_id: str, version: str, arrived_at: float) -> _Request:
        req = self._requests.get(request_id)
        if req is None:
            if len(self._requests) >= self._max_tracked:
                self._forget(next(iter(self._requests)))
                self.evicted += 1
            req = self._requests[request_id] = _Request(version, arrived_at)
        return req

    def _forget(self, request_id: str) -> _Request | None:
        req = self._requests.pop(request_id, None)
        if req is not None:
            series = self._stats.series(self._model, req.model_version, trusted=True)
            if req.queued:
                series.add_waiting(-1)
            if req.started:
                series.leave()
        return req

    def _finish(self, e: Any) -> None:
        req = self._forget(e.request_id)
        ttft = e.ttft_s
        tpot = None
        if req is not None and req.first_token_s is not None:
            ttft = req.first_token_s
            if req.tokens > 1 and req.last_token_s is not None:
                tpot = max(0.0, (req.last_token_s - req.first_token_s) / (req.tokens - 1))
        if tpot is None and ttft is not None and e.output_tokens > 1:
            tpot = max(0.0, (e.duration_s - ttft) / (e.output_tokens - 1))
        self._emit(
            InferenceRecord(
                request_id=e.request_id,
                model=self._model,
                model_version=e.model_version,
                started_at=max(0.0, e.at - e.duration_s),
                duration_s=e.duration_s,
                ttft_s=ttft,
                tpot_s=tpot,
                queue_s=e.queue_s,
                prompt_tokens=e.prompt_tokens,
                output_tokens=e.output_tokens,
                error_type=CANCELLED if req is not None and req.hung_up else None,
                source="engine",
            )
        )

    def _fail(self, e: Any) -> None:
        req = self._forget(e.request_id)
        arrived = e.at if req is None else req.arrived_at
        self._emit(
            InferenceRecord(
                request_id=e.request_id,
                model=self._model,
                model_version=e.model_version,
                started_at=max(0.0, arrived),
                duration_s=max(0.0, e.at - arrived),
                queue_s=None if req is None else req.queue_s,
                prompt_tokens=None if req is None else req.prompt_tokens,
                output_tokens=None if req is None else req.tokens,
                error_type=engine_label(e.error_type),
                source="engine",
            )
        )

    def _emit(self, record: InferenceRecord) -> None:
        self._stats.observe(record)
        if self._on_record is not None:
            self._on_record(record)


class EnginePathCollector:
    """`infersight_engine_path_info`: which decode path (engine/paths.py) each version serving
    traffic runs on, and why, read from the runtime at scrape time (`source.engine_paths()`:
    version -> an object with `name`, `cpu`, `reason`, `setup_s`, and where it has them
    `kernels`, the native library's loops, and `activations`). The value is always 1.

    An `eager` path whose reason starts with "fallback" means the native kernels could not be
    built or loaded on this machine (no compiler, a failed build)."""

    def __init__(self, source: Any, *, model: str) -> None:
        self._source, self._model = source, model

    def collect(self) -> Iterator[Metric]:
        info = GaugeMetricFamily(
            "infersight_engine_path_info",
            "The decode path each serving version runs on (eager or native) and why, as labels",
            labels=["model", "model_version", "path", "cpu", "reason", "kernels", "activations"],
        )
        setup = GaugeMetricFamily(
            "infersight_engine_path_setup_seconds",
            "Time the version's load spent building and measuring the decode paths",
            labels=["model", "model_version"],
        )
        try:
            paths = dict(self._source.engine_paths())
        except Exception:  # a scrape never fails because the runtime is between states
            paths = {}
        for version, path in sorted(paths.items()):
            if path is None:
                continue
            reason = str(path.reason)
            kind = "fallback" if reason.startswith("fallback") else reason
            extra = [str(getattr(path, "kernels", "")), str(getattr(path, "activations", ""))]
            info.add_metric([self._model, version, str(path.name), str(path.cpu), kind, *extra], 1.0)
            setup.add_metric([self._model, version], float(path.setup_s))
        yield info
        yield setup

    def describe(self) -> Iterator[Metric]:
        return iter(())
