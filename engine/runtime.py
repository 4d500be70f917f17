"""The serving runtime: one background loop thread serving many concurrent requests.

Each iteration of the loop (a "step"):
1. applies what other threads asked for: posted events, cancellations, a version swap;
2. admits waiting requests, highest priority first, into free KV-cache slots of the
   serving replica and prefills each (continuous batching: requests join at any step);
3. runs one batched decode step per replica that has running requests (after a deploy
   the old replica keeps decoding its own requests until it drains);
4. samples every request's next token and reads them all with one device-to-host copy,
   the only sync of the step; then streams them, and frees the slots of requests that
   hit EOS, their token budget, or were cancelled (continuous batching: they leave).

Deploys load and validate on the caller's thread (see deploy.py) and hand the loop a
ready replica; the swap happens between two steps, so no request is dropped.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, NoReturn

import torch

from .admission import Admission, AdmissionLimits
from .deploy import DeployOutcome, prepare_replica
from .errors import (
    CanaryRunning,
    DeployRefused,
    InvalidRequest,
    NoPreviousVersion,
    PathOverloaded,
    PromptTooLong,
    QueueFull,
    RuntimeNotRunning,
)
from .events import DeployFailed, EngineEvent, RequestFailed, RequestQueued, VersionDeployed
from .prefix_cache import PrefixCache, PrefixCacheStats
from .registry import DeployRecord, Registry
from .replica import PendingQueue, Replica, Request
from .requests import RequestHandle
from .routing import RouteControl
from .runtime_canary import CanaryControl, open_canary
from .runtime_loop import LoopState, Swap, run_loop
from .runtime_shadow import ShadowControl
from .step_times import StepTimes

__all__ = ["Runtime"]

Subscriber = Callable[[EngineEvent], None]
# version -> the prompts to prefill into the prefix cache before that version takes traffic
# (token ids, or text the version's tokenizer encodes); e.g. the most frequent recorded ones
PreloadSource = Callable[[str], Sequence[Sequence[int] | str]]


class Runtime:
    """Serves the versions of `registry`, one at a time (two while a deploy drains)."""

    def __init__(
        self,
        registry: Registry,
        *,
        max_batch_size: int = 8,
        max_prompt_tokens: int = 1024,
        max_seq_len: int = 2048,
        device: str | torch.device | None = None,
        dtype: torch.dtype | None = None,
        prefix_cache: PrefixCache | None = None,
        preload_source: PreloadSource | None = None,
        prefill_block: int | None = None,
        preload_top: int | None = None,
        admission: AdmissionLimits | None = None,
    ) -> None:
        """`prefix_cache`: reuse the keys and values of shared prompt prefixes (None: off);
        `preload_source`: what to prefill into it at start and at every deploy: all of it,
        or with `preload_top` the N most frequent block prefixes among those prompts;
        `prefill_block`: prompts are prefilled in chunks of this many tokens, cache or not
        (default: the cache's block, else 64), so that the cache never changes an answer;
        `admission`: the bound on each path's queue and predicted wait (admission.py; None: unbounded)."""
        if max_batch_size < 1 or max_prompt_tokens < 1 or max_seq_len < 2:
            raise InvalidRequest("max_batch_size and max_prompt_tokens must be >= 1, max_seq_len >= 2")
        block = prefix_cache.block_tokens if prefix_cache is not None else 64
        if prefill_block is not None and (
            prefill_block < 1 or (prefix_cache is not None and prefill_block != block)
        ):
            raise InvalidRequest(
                f"prefill_block must be >= 1 and equal the prefix cache's block ({block}), got {prefill_block}"
            )
        self.prefill_block = prefill_block if prefill_block is not None else block
        self.registry = registry
        self.max_batch_size = max_batch_size
        self.max_prompt_tokens = max_prompt_tokens
        self.max_seq_len = max_seq_len
        self.device = device
        self.dtype = dtype
        self.prefix_cache = prefix_cache
        self.preload_source = preload_source
        self.preload_top = preload_top
        self.preload_errors = 0  # preload_source calls that raised (the deploy went on, cold)
        self._state = LoopState(queue=PendingQueue())
        self._subscribers: tuple[Subscriber, ...] = ()
        self._sub_lock = threading.Lock()
        self._deploy_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.canary = CanaryControl(self)
        self.routing = RouteControl(self)  # SLA routing, off until routing.start(spec)
        self.admission = Admission(admission)
        self.shadow = ShadowControl(self)  # paired answers while two versions are loaded
        self._state.idle_work = self.shadow  # it reads each pair's answers by the other version when idle

    # -- lifecycle -----------------------------------------------------------------------

    def start(self, version: str | None = None, *, resume_canary: bool = True) -> DeployOutcome:
        """Load `version` (default: the last good version of the deploy history), validate
        and warm it up, then start the loop thread. Raises DeployRefused on failure.
        A canary the deploy history left running is resumed beside it (`CanaryControl.resume`)."""
        with self._deploy_lock:
            if self.is_running:
                raise InvalidRequest("runtime already started: use deploy() to change the version")
            name = version if version is not None else self.registry.history.last_good()
            if name is None:
                raise NoPreviousVersion(
                    f"no version given and no deploy history in {self.registry.root}",
                    version="",
                    reason="start",
                )
            pending = open_canary(self.registry.history.records())  # left open by the last run
            replica, outcome = self._prepare(name, "start", from_version=None)
            state = self._state
            state.current = replica
            state.stopping = False
            state.cancel_all = False
            state.accepting = True
            state.emit = self._emit
            self._thread = threading.Thread(
                target=run_loop, args=(state,), name="infersight-engine", daemon=True
            )
            self._thread.start()
            state.post(VersionDeployed(from_version=None, to_version=name, at=outcome.at, reason="start"))
            self._record(outcome, "deployed")
        if resume_canary:
            self.canary.resume(pending)  # outside the deploy lock: it deploys the candidate
        return outcome

    def stop(self, *, drain: bool = True, timeout: float | None = 30.0) -> None:
        """Stop accepting requests; finish (drain=True) or cancel those queued and running,
        then end the loop thread. Requests still unfinished after `timeout` are cancelled."""
        thread = self._thread
        if thread is None:
            return
        state = self._state
        state.accepting = False
        state.stopping = True
        if not drain:
            state.cancel_all = True
        state.wake.set()
        thread.join(timeout)
        if thread.is_alive():
            state.cancel_all = True
            state.wake.set()
            thread.join()
        self._thread = None
        state.current = None
        state.canary = None
        self.canary._status = None
        state.fast = None
        state.shadow = None
        state.on_finished = None
        state.hold = None
        self.routing.spec = None

    def __enter__(self) -> Runtime:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop(drain=False)

    # -- requests ------------------------------------------------------------------------

    def submit(
        self,
        prompt_ids: Sequence[int],
        *,
        max_new_tokens: int,
        temperature: float = 0.0,
        top_p: float = 1.0,
        seed: int | None = None,
        priority: int = 0,
        request_id: str | None = None,
        user: str | None = None,
        text: str | None = None,
        prompts_by_version: Mapping[str, Sequence[int]] | None = None,
    ) -> RequestHandle:
        """Queue a request; returns at once. Raises PromptTooLong (over max_prompt_tokens,
        or prompt + max_new_tokens over max_seq_len) and InvalidRequest before the model
        sees anything, and RuntimeNotRunning when the runtime does not accept requests.
        With a canary running, `user` (sticky) decides which version serves it. With SLA
        routing on, the router picks the fast or the standard path (`handle.path`; `text`,
        the prompt's text, is what a user classifier reads) and raises PathOverloaded when
        that path's length breaker sheds the request. Raises QueueFull when the request's
        queue is full or its predicted wait too long (`admission`).

        `prompts_by_version`: the prompt each loaded version should see, when they differ (a
        chat rendered in each version's own template): the version the request is routed to
        answers its own entry, a shadow on the other version that one's; a version without an
        entry answers `prompt_ids`. The live prompt is checked against the limits as
        `prompt_ids` is; a shadow's prompt that does not fit is not answered (counted
        dropped), since a shadow never changes what the client gets."""
        state = self._state
        current = state.current
        if not state.accepting or current is None:
            raise RuntimeNotRunning("runtime is not serving: call start() first (or it is stopping)")
        rid = request_id if request_id is not None else uuid.uuid4().hex
        ids = [int(t) for t in prompt_ids]
        try:
            self._check(ids, max_new_tokens, temperature, top_p, current.vocab_size)
        except (PromptTooLong, InvalidRequest) as exc:
            state.post(RequestFailed(rid, current.version, time.time(), type(exc).__name__, str(exc)))
            raise
        decision = None
        if self.routing.active:
            try:
                decision = self.routing.decide(ids, int(max_new_tokens), text)
            except PathOverloaded as exc:
                state.post(RequestFailed(rid, current.version, time.time(), type(exc).__name__, str(exc)))
                raise
        fast = state.fast if decision is not None and decision.path == "fast" else None
        canary = state.canary if fast is None and self.canary.route(user, rid) else None
        target = fast or canary or current
        queue = (
            state.fast_queue
            if fast is not None
            else state.canary_queue
            if canary is not None
            else state.queue
        )
        path = "fast" if fast is not None else "canary" if canary is not None else "standard"
        prompts = _prompts_of(prompts_by_version)
        live_ids = prompts.get(target.version, ids)
        if live_ids is not ids:
            try:
                self._check(live_ids, max_new_tokens, temperature, top_p, target.vocab_size)
            except (PromptTooLong, InvalidRequest) as exc:
                state.post(RequestFailed(rid, target.version, time.time(), type(exc).__name__, str(exc)))
                raise
        try:
            self.admission.check(queue, target, priority=int(priority), path=path, user=user)
        except QueueFull as exc:
            if decision is not None:
                self.routing.count(decision.path, "overloaded", instead_of=decision.reason)
            state.post(RequestFailed(rid, target.version, time.time(), type(exc).__name__, str(exc)))
            raise
        handle = RequestHandle(rid, target.version, lambda _h: state.cancel(request))
        if decision is not None:
            handle.path, handle.route_reason = decision.path, decision.reason
        request = Request(
            request_id=rid,
            prompt_ids=live_ids,
            max_new_tokens=int(max_new_tokens),
            temperature=float(temperature),
            top_p=float(top_p),
            seed=seed,
            priority=int(priority),
            handle=handle,
            arrival=time.monotonic(),
            path=decision.path if decision is not None else None,
            user=user,
        )
        with state.submit_lock:
            if not state.accepting:
                raise RuntimeNotRunning("runtime is stopping: no new requests")
            state.post(RequestQueued(rid, target.version, time.time(), len(live_ids), request.priority))
            # maybe also answered by the other version, with its own prompt when it fits
            self.shadow.pair(
                request, target, lambda other: self._fitting(prompts.get(other.version, ids), request, other)
            )
            queue.push(request)
        state.wake.set()
        return handle

    def _fitting(self, ids: list[int], request: Request, replica: Replica) -> list[int] | None:
        """`ids` when `request` may run with them on `replica` (`_check`), else None."""
        try:
            self._check(ids, request.max_new_tokens, request.temperature, request.top_p, replica.vocab_size)
        except (PromptTooLong, InvalidRequest):
            return None
        return ids

    def _check(
        self, ids: list[int], max_new_tokens: int, temperature: float, top_p: float, vocab: int
    ) -> None:
        if not ids:
            raise InvalidRequest("prompt_ids is empty")
        if max_new_tokens < 1:
            raise InvalidRequest(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        if not (temperature >= 0.0) or not (0.0 < top_p <= 1.0):
            raise InvalidRequest(f"need temperature >= 0 and 0 < top_p <= 1, got {temperature}, {top_p}")
        if min(ids) < 0 or max(ids) >= vocab:
            raise InvalidRequest(f"prompt token ids must lie in [0, {vocab}), got {min(ids)}..{max(ids)}")
        if len(ids) > self.max_prompt_tokens:
            raise PromptTooLong(
                f"prompt of {len(ids)} tokens is over max_prompt_tokens={self.max_prompt_tokens}",
                limit_name="max_prompt_tokens",
                limit=self.max_prompt_tokens,
                got=len(ids),
            )
        if len(ids) + max_new_tokens > self.max_seq_len:
            raise PromptTooLong(
                f"prompt of {len(ids)} tokens + max_new_tokens={max_new_tokens} is over max_seq_len={self.max_seq_len}",
                limit_name="max_seq_len",
                limit=self.max_seq_len,
                got=len(ids) + max_new_tokens,
            )

    # -- prefix cache --------------------------------------------------------------------

    def preload(self, prompts: Sequence[Sequence[int] | str]) -> int:
        """Prefill `prompts` (token ids or text) into the prefix cache of the serving version,
        on the caller's thread beside serving; the number of prompt tokens cached. Start and
        deploy do this themselves, before the version takes traffic, with `preload_source`."""
        current = self._state.current
        if current is None:
            raise RuntimeNotRunning("runtime is not serving: call start() first")
        return current.preload(_token_lists(current, prompts))

    def prefix_cache_stats(self) -> dict[str, PrefixCacheStats]:
        """Per version: prefix-cache hits, misses, tokens saved, bytes held, evictions ({} when off)."""
        return self.prefix_cache.stats() if self.prefix_cache is not None else {}

    def _preload_new(self, replica: Replica) -> tuple[float, int]:
        if self.preload_source is None or replica.prefix is None:
            return 0.0, 0
        t0 = time.perf_counter()
        try:
            prompts = _token_lists(replica, self.preload_source(replica.version))
        except Exception:  # the source (a store) failed: the version starts cold, never refused
            self.preload_errors += 1
            return time.perf_counter() - t0, 0
        tokens = replica.preload(prompts, top=self.preload_top)
        return time.perf_counter() - t0, tokens

    # -- subscribers ---------------------------------------------------------------------

    def subscribe(self, fn: Subscriber) -> Callable[[], None]:
        """Call `fn` with every EngineEvent, on the loop thread. Returns unsubscribe."""
        with self._sub_lock:
            self._subscribers = (*self._subscribers, fn)

        def unsubscribe() -> None:
            with self._sub_lock:
                self._subscribers = tuple(s for s in self._subscribers if s is not fn)

        return unsubscribe

    def _emit(self, event: EngineEvent) -> None:
        if self.shadow.observe(event):
            return  # a shadow's own event: not traffic (its pair is told as a PairCompleted)
        for fn in self._subscribers:
            try:
                fn(event)
            except Exception:  # a subscriber never breaks serving: counted and swallowed
                self._state.subscriber_errors += 1

    # -- versions ------------------------------------------------------------------------

    def deploy(self, version: str, *, reason: str = "deploy") -> DeployOutcome:
        """Load `version` beside the serving one, validate and warm it up, then swap between
        two decode steps. Requests in flight finish on the version they started on. On any
        failure raises DeployRefused (a subclass names the check) and keeps serving."""
        with self._deploy_lock:
            current = self._state.current
            if not self.is_running or current is None:
                raise RuntimeNotRunning("runtime is not serving: call start() first")
            running = self.canary.status
            if running is not None:
                message = f"canary {running.version} is running: promote or abort it before a {reason}"
                self._refused(CanaryRunning(message, version=version, reason="canary running"), current.version,
                              to_version=version, reason=reason)  # fmt: skip
            replica, outcome = self._prepare(version, reason, from_version=current.version)
            swap = Swap(replica=replica, reason=reason)
            self._state.request_swap(swap)
            thread = self._thread
            while not swap.done.wait(timeout=0.5):
                if thread is None or not thread.is_alive():
                    break
            if not swap.applied:
                raise RuntimeNotRunning(f"runtime stopped before version {version} could be swapped in")
            self.shadow.after_deploy(current, reason)  # kept beside for pairs, a while
            outcome = DeployOutcome(
                from_version=current.version,
                to_version=version,
                reason=reason,
                at=swap.at,
                verify_s=outcome.verify_s,
                load_s=outcome.load_s,
                warmup_s=outcome.warmup_s,
                preload_s=outcome.preload_s,
                preloaded_tokens=outcome.preloaded_tokens,
            )
            self._record(outcome, "deployed")
            return outcome

    def failover(self, version: str) -> DeployOutcome:
        """A deploy of `version` recorded with reason "failover"."""
        return self.deploy(version, reason="failover")

    def rollback(self) -> DeployOutcome:
        """Deploy the previous good version (the one beneath the serving one in the history).
        With a canary running, the canary is the latest change: it is rolled back instead."""
        running = self.canary.status
        if running is not None:
            self.canary.abort("rollback asked for while the canary ran")
            return DeployOutcome(
                running.version, running.stable_version, "rollback", time.time(), 0.0, 0.0, 0.0
            )
        target = self.registry.history.previous_good()
        if target is None:
            serving = self.serving_version
            message = f"no good version before {serving} in the deploy history: nothing to roll back to"
            self._refused(NoPreviousVersion(message, version="", reason="no previous version"), serving)
        return self.deploy(target, reason="rollback")

    def history(self) -> list[DeployRecord]:
        """Deploy attempts, newest last (persisted in the registry root)."""
        return self.registry.history.records()

    def _prepare(
        self, version: str, reason: str, *, from_version: str | None
    ) -> tuple[Replica, DeployOutcome]:
        try:
            info = self.registry.get(version)
            replica, timings = prepare_replica(
                info,
                max_batch=self.max_batch_size,
                max_seq_len=self.max_seq_len,
                device=self.device,
                dtype=self.dtype,
                prefix=self.prefix_cache,
                prefill_block=self.prefill_block,
            )
            preload_s, preloaded = self._preload_new(replica)
        except DeployRefused as exc:
            self._refused(exc, from_version, to_version=version, reason=reason)
        except Exception as exc:  # unknown version, corrupt registry: refused all the same
            refusal = DeployRefused(
                f"{type(exc).__name__}: {exc}", version=version, reason=type(exc).__name__
            )
            self._refused(refusal, from_version, to_version=version, reason=reason, cause=exc)
        outcome = DeployOutcome(
            from_version, version, reason, time.time(), timings.verify_s, timings.load_s, timings.warmup_s,
            preload_s, preloaded,
        )  # fmt: skip
        return replica, outcome

    def _refused(
        self,
        exc: DeployRefused,
        serving: str | None,
        *,
        to_version: str | None = None,
        reason: str = "rollback",
        cause: BaseException | None = None,
    ) -> NoReturn:
        target = to_version if to_version is not None else exc.version
        now = time.time()
        self.registry.history.record(DeployRecord(now, serving, target, reason, "refused", str(exc)))
        event = DeployFailed(version=target, serving_version=serving, at=now, reason=str(exc))
        if self._thread is not None:
            self._state.post(event)
            self._state.wake.set()
        else:
            self._emit(event)
        if cause is not None:
            raise exc from cause
        raise exc

    def _record(self, outcome: DeployOutcome, result: Literal["deployed", "refused"]) -> None:
        self.registry.history.record(
            DeployRecord(outcome.at, outcome.from_version, outcome.to_version, outcome.reason, result)
        )

    # -- state ---------------------------------------------------------------------------

    @property
    def serving_version(self) -> str | None:
        current = self._state.current
        return current.version if current is not None else None

    def engine_paths(self) -> dict[str, Any]:
        """Per version serving traffic (stable, canary): the `EnginePath` its model decodes on."""
        state = self._state
        replicas = [r for r in (state.current, state.canary) if r is not None]
        return {r.version: getattr(r.model, "engine_path", None) for r in replicas}

    def step_times(self) -> dict[str, StepTimes]:
        """Per version serving traffic (stable, canary): its replica's measured step times, to
        read only. The fast path's replica is left out: requests are recorded by version, and
        its steps run another batch and model beside the version's own."""
        state = self._state
        return {r.version: r.step_times for r in (state.current, state.canary) if r is not None}

    @property
    def draining_versions(self) -> list[str]:
        return [r.version for r in list(self._state.draining)]

    @property
    def tokenizer(self) -> Any:
        current = self._state.current
        return current.model.tokenizer if current is not None else None

    @property
    def chat_format(self) -> tuple[str | None, dict[str, str]]:
        """The serving version's chat template (None: none) and the special tokens it may name."""
        current = self._state.current
        return _chat_format(current) if current is not None else (None, {})

    @property
    def chat_formats(self) -> dict[str, tuple[str | None, dict[str, str]]]:
        """`chat_format` of every loaded version a chat may be answered by, live or as a
        shadow: the serving version, the canary and the previous version kept for pairs (not
        SLA routing's fast path: it answers the serving version's rendering, as it always did)."""
        state = self._state
        replicas = [r for r in (state.current, state.canary, state.shadow) if r is not None]
        return {r.version: _chat_format(r) for r in replicas}

    @property
    def eos_token_ids(self) -> frozenset[int]:
        current = self._state.current
        return current.eos_ids if current is not None else frozenset()

    @property
    def queue_depth(self) -> int:
        return len(self._state.queue)

    @property
    def running(self) -> int:
        return self._state.running_count

    @property
    def subscriber_errors(self) -> int:
        return self._state.subscriber_errors

    @property
    def is_running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()


def _chat_format(replica: Replica) -> tuple[str | None, dict[str, str]]:
    model = replica.model
    return getattr(model, "chat_template", None), dict(getattr(model, "special_tokens", {}))


def _prompts_of(by_version: Mapping[str, Sequence[int]] | None) -> dict[str, list[int]]:
    return {v: [int(t) for t in ids] for v, ids in by_version.items()} if by_version else {}


def _token_lists(replica: Replica, prompts: Sequence[Sequence[int] | str]) -> list[list[int]]:
    out = []
    for p in prompts:
        if isinstance(p, str):
            tokenizer = replica.model.tokenizer
            if tokenizer is None:
                continue  # text needs the version's tokenizer; a version without one skips it
            out.append(list(tokenizer.encode(p, add_special_tokens=False).ids))
        else:
            out.append([int(t) for t in p])
    return out
