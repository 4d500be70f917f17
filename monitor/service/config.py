"""The service's configuration: frozen dataclasses, built from a YAML file plus the
environment (`load_config`, in config_file.py) or directly in code and tests.

Secrets never need to be in the file: `INFERSIGHT_TOKEN` (bearer token),
`INFERSIGHT_DATABASE_URL`, `INFERSIGHT_UPSTREAM_API_KEY`; receivers' secrets are named by
`*_env` keys in the rule file (e.g. `routing_key_env: INFERSIGHT_PAGERDUTY_ROUTING_KEY`).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from pathlib import Path

from infersight.monitor.store.retention import RetentionPolicy

__all__ = [
    "AlertingConfig",
    "CostConfig",
    "DriftConfig",
    "EngineConfig",
    "LimitsConfig",
    "RoutePathConfig",
    "RoutingConfig",
    "ScheduleConfig",
    "ServiceConfig",
    "UpstreamConfig",
    "is_loopback",
]


@dataclass(frozen=True)
class EngineConfig:
    """Serve with the embedded runtime from a registry directory."""

    registry: Path
    version: str | None = None  # None: the newest registered version
    # the version the `failover` action switches to when its rule names no `backup`
    # (a registered version known to be good, e.g. the previous release or an int8 build)
    backup_version: str | None = None
    max_batch_size: int = 8
    max_prompt_tokens: int = 1024
    max_seq_len: int = 2048
    device: str | None = None
    max_tokens_limit: int = 1024  # the largest `max_tokens` a request may ask for
    # the header whose value keeps a user on one version during a canary (None: the
    # OpenAI `user` field only; the header wins when both are sent)
    canary_user_header: str | None = None
    # the prefix KV cache: reuse the keys and values of shared prompt prefixes, LRU over
    # blocks of prefix_block_tokens under this budget (0 turns it off). Every prompt is
    # prefilled in such blocks, cache or not, so a miss costs nothing over no cache and the
    # answers are the same bits (docs/benchmarks.md). At start and at every deploy the
    # preload_prompts most frequent block prefixes of the recorded prompts are prefilled
    # before traffic
    prefix_cache_mb: float = 256.0
    prefix_block_tokens: int = 64
    preload_prompts: int = 32
    # a shared tier so that a new replica starts warm, e.g. "redis://127.0.0.1:6379/0" (off)
    prefix_cache_redis_url: str | None = None
    prefix_cache_redis_prefix: str = "infersight:kv:"


@dataclass(frozen=True)
class RoutePathConfig:
    """One path of SLA routing: the registered version serving it and its latency target
    (arrival to last token); the fast path also bounds what it takes."""

    version: str
    sla_ms: float
    max_prompt_tokens: int | None = None
    max_new_tokens: int | None = None


@dataclass(frozen=True)
class RoutingConfig:
    """SLA routing in the embedded runtime: the standard version serves as the runtime's
    version, the fast one beside it (engine/routing.py)."""

    fast: RoutePathConfig
    standard: RoutePathConfig
    classifier: str | None = None  # "package.module:function", (RouteQuery) -> "fast" | "standard"
    # while a path's p99 is over its SLA, requests over the breaker's length threshold get
    # "reject" (503 + Retry-After) or go from the fast path to the "standard" one
    breaker_action: str = "reject"
    breaker_cooldown_s: float = 2.0  # open this long before half-open


@dataclass(frozen=True)
class UpstreamConfig:
    """Proxy /v1 to an existing OpenAI-compatible server, observing every request."""

    url: str
    model: str | None = None  # the `model` label when the upstream's answer names none
    timeout_s: float = 300.0
    api_key: str | None = None  # sent to the upstream when the client sends no Authorization
    # the upstream's Prometheus text (vLLM, TGI): its queue depth becomes the proxy's
    # `gen_ai_server_requests_waiting`. None: <url>/metrics; "" turns the scrape off
    metrics_url: str | None = None


@dataclass(frozen=True)
class AlertingConfig:
    rules: Path | None = None  # None: the default rule set shipped with infersight
    enabled: bool = True
    # post-deploy analysis: the new version against the previous one, then rollback
    analysis_window_s: float = 1800.0  # how long after a deploy the new version is watched
    analysis_interval_s: float = 60.0  # between checks
    analysis_failed_checks: int = 3  # failed checks before the automatic rollback
    analysis_min_requests: int = 20  # fewer on either side: inconclusive
    analysis_p99_ratio: float = 1.5  # the new version's p99 over this times the previous one fails a check
    snapshot_requests: int = 100  # requests kept in the snapshot taken at an automatic rollback
    # the next requests (any version: the previous one now answers the same traffic) kept for
    # `infersight dataset export --kind collected` after an automatic rollback; 0: none
    collect_after_rollback: int = 200


@dataclass(frozen=True)
class DriftConfig:
    reference: Path | None = None  # a .jsonl/.csv/.txt file; None: the first window after a deploy
    alpha: float = 0.05
    window: int = 300  # texts in the current window
    min_window: int = 50  # no verdict on fewer
    reservoir: int = 256  # at most this many texts embedded per `embed` tick; the rest counted as skipped
    embedding_cache: int = 20_000  # texts whose embeddings are kept (about 1.6 KB each)
    enabled: bool = True
    # a version with no request for this long (e.g. rolled back) has its drift state dropped:
    # its p-values and gauges go, so its drift alerts resolve; None keeps them forever
    stale_after_s: float | None = 1800.0


@dataclass(frozen=True)
class CostConfig:
    """What serving costs: `per_hour` (any currency) for the process, or for each GPU it
    watches (`per: device`). Exported as `infersight_cost_per_1k_output_tokens` by version."""

    per_hour: float
    per: str = "process"  # "process" | "device"
    window_s: float = 3600.0  # the cost per 1k tokens covers this trailing window


@dataclass(frozen=True)
class ScheduleConfig:
    """Job intervals in seconds."""

    sample_s: float = 1.0
    upstream_metrics_s: float = 5.0  # proxy mode: reading the upstream's /metrics for its queue depth
    timeseries_s: float = 5.0
    timeseries_window_s: float = 60.0  # latency quantiles of each point cover this window
    embed_s: float = 2.0
    drift_s: float = 60.0
    rules_s: float = 1.0  # each rule group keeps its own `interval`; this is how often they are checked
    outbox_s: float = 2.0
    post_deploy_s: float = 5.0
    publish_s: float = 1.0  # each replica's heartbeat and statistics to the shared store
    retention_s: float = 3600.0


@dataclass(frozen=True)
class LimitsConfig:
    max_body_bytes: int = 8 * 1024 * 1024
    max_events_per_batch: int = 10_000
    write_queue_rows: int = 200_000  # ingest answers 503 beyond this backlog
    timeseries_points: int = 17_280  # 24 h at the default 5 s tick
    max_label_values: int = 100  # distinct model (and model_version) label values; the rest are `other`


@dataclass(frozen=True)
class ServiceConfig:
    data_dir: Path = Path("var")
    database_url: str | None = None  # None: SQLite in data_dir
    host: str = "127.0.0.1"
    port: int = 8000
    token: str | None = None  # None on loopback: generated and kept in data_dir/api-token
    model: str | None = None  # the model name reported in records (default: from the version)
    # the inference server's process, watched by the process (and GPU per-process) collector;
    # None: this process, which is the server only with the embedded runtime
    supervise_pid: int | None = None
    engine: EngineConfig | None = None
    upstream: UpstreamConfig | None = None
    alerting: AlertingConfig = field(default_factory=AlertingConfig)
    drift: DriftConfig = field(default_factory=DriftConfig)
    retention: RetentionPolicy = field(default_factory=RetentionPolicy)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    cost: CostConfig | None = None
    routing: RoutingConfig | None = None  # SLA routing (embedded runtime only); None: one path
    text_sample_rate: float = 1.0  # share of proxied/served requests whose text is kept
    # "package.module:function", the SDK's `redact` hook (str -> str): applied to every text
    # the dataset export (CLI and GET /api/v1/dataset) lets out; a hook that fails drops the text
    redact: str | None = None
    leader_election: bool = True  # one replica runs rules, drift, outbox and retention
    log_level: str = "info"


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
