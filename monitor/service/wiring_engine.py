"""Starting the embedded runtime for the service, and resuming its canary after a restart.

- Start (`start_runtime`): the runtime `engine:` configures, over the version registry at
  `engine.registry`, with its prefix cache (runtime_store.py's, preloaded from the frequent
  prompts the store recorded for the model), its admission limits, and SLA routing when
  `routing:` is set. It serves the routing's standard version, else `engine.version`, else
  the deploy history's last good version, else the newest registered one.
- Resume (`resume_canary`): a canary the registry's deploy history left running serves again
  beside the stable version, and its analysis goes on from the requests the store recorded
  since it started, not from zero.

The backend that serves `/v1` with the runtime (backend_engine.py) calls both; a runtime
given to the service ready-made is neither started here nor resumed.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from sqlalchemy import Engine

from .errors import BackendUnavailable

if TYPE_CHECKING:
    from .config import ServiceConfig

__all__ = ["model_of", "resume_canary", "start_runtime"]

log = logging.getLogger(__name__)


def start_runtime(config: ServiceConfig, db: Engine) -> Any:
    """Start the runtime `config.engine` configures (with SLA routing where `config.routing`
    is set) -> the running runtime; BackendUnavailable when the engine refuses to start."""
    from infersight.engine.admission import AdmissionLimits
    from infersight.engine.errors import EngineError
    from infersight.engine.registry import Registry
    from infersight.engine.runtime import Runtime

    from .runtime_store import FrequentPrompts, build_prefix_cache

    cfg = config.engine
    assert cfg is not None
    try:
        registry = Registry(cfg.registry)
        fixed = config.model
        frequent = FrequentPrompts(db, model=lambda version: fixed or model_of(version))
        runtime = Runtime(
            registry, max_batch_size=cfg.max_batch_size, max_prompt_tokens=cfg.max_prompt_tokens,
            max_seq_len=cfg.max_seq_len, device=cfg.device, prefix_cache=build_prefix_cache(cfg),
            preload_source=frequent, preload_top=cfg.preload_prompts, prefill_block=cfg.prefix_block_tokens,
            admission=AdmissionLimits(cfg.max_queue, cfg.max_queue_wait_s),
        )  # fmt: skip
        routing = config.routing
        version = routing.standard.version if routing is not None else None
        version = version or cfg.version or registry.history.last_good()
        if version is None:
            versions = registry.versions()
            if not versions:
                raise BackendUnavailable(f"no model version registered in {registry.root}")
            version = versions[-1].name
        runtime.start(version, resume_canary=False)  # resumed once the deploy log listens
    except EngineError as exc:
        raise BackendUnavailable(f"the embedded runtime did not start: {exc}") from exc
    if config.routing is not None:
        from .sla_routing import start_routing

        try:
            start_routing(runtime, config.routing)
        except Exception:
            runtime.stop(drain=False)
            raise
    return runtime


def resume_canary(runtime: Any, controller: Any, db: Engine) -> None:
    """The canary the deploy history of `runtime`'s registry left running serves again
    (`CanaryControl.resume`), and `controller`'s analysis replays the two versions' requests
    stored in `db` since it started. Nothing is resumed when the history cannot be read."""
    control = getattr(runtime, "canary", None)
    if control is None:
        return
    from infersight.engine.runtime_canary import open_canary

    try:
        pending = open_canary(runtime.registry.history.records())
    except Exception:  # an unreadable history: serve the stable version, as started
        log.exception("the deploy history could not be read: no canary resumed")
        return
    if pending is None or pending.stable_version != runtime.serving_version:
        control.resume(pending)  # records why it was not resumed
        return
    controller.begin(pending.version, pending.stable_version, pending.weight)  # before its first request
    status = control.resume(pending)
    if status is None:
        controller.end()
        return
    try:
        controller.replay(_stored_since(db, status))
    except Exception:  # the store is down: the analysis starts from now; serving goes on
        log.exception("canary %s: its stored requests could not be replayed", status.version)


def _stored_since(db: Engine, status: Any) -> list[Any]:
    """The two versions' stored requests since the canary started, oldest first."""
    import datetime as dt

    from infersight.monitor.records import StoredRequest
    from infersight.monitor.store.tables import by_start, requests, started_in
    from sqlalchemy import select

    c = requests.c
    query = (
        select(c.model_version, c.error_type, c.output_tokens, c.relevance, c.max_tokens, c.stream)
        .where(
            c.model_version.in_([status.version, status.stable_version]),
            *started_in(dt.datetime.fromtimestamp(status.started_at, dt.UTC)),
        )
        .order_by(*by_start())
    )
    with db.connect() as conn:
        return [StoredRequest(*row) for row in conn.execute(query)]


def model_of(version: str | None) -> str:
    """The model a version belongs to: `mixtral_banking_int8-v1.2` -> `mixtral_banking`."""
    if not version:
        return "unknown"
    base = version.split("-v", 1)[0]
    parts = base.split("_")
    return "_".join(parts[:-1]) if len(parts) >= 3 else base
