"""What can be configured: one frozen dataclass per section of `infersight.yaml` (the top
level is `ServiceConfig`), with its defaults.

Each field's comment (on its line, or the block directly above it) is its description in
the configuration reference and the JSON Schema (config_schema.py reads them from here), so
a new key documents itself where it is declared. Reading the file and the environment into
these, and the rules across fields, are in config.py, which re-exports every class here.
"""

from __future__ import annotations

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
    "ShadowUpstreamConfig",
    "UpstreamConfig",
]


@dataclass(frozen=True)
class EngineConfig:
    """Serve with the embedded runtime from a registry directory."""

    # the model registry directory (`infersight models register` fills it)
    registry: Path
    version: str | None = None  # None: the newest registered version
    # the version the `failover` action switches to when its rule names no `backup`
    # (a registered version known to be good, e.g. the previous release or an int8 build)
    backup_version: str | None = None
    # requests decoded together in one step
    max_batch_size: int = 8
    # a longer prompt is answered 400
    max_prompt_tokens: int = 1024
    # prompt plus generated tokens, per request
    max_seq_len: int = 2048
    # the torch device (None: cpu, or cuda where one is present)
    device: str | None = None
    max_tokens_limit: int = 1024  # the largest `max_tokens` a request may ask for
    # requests ahead in a path's queue beyond which a new one is answered 429 + Retry-After
    # admission control: a request finding max_queue requests ahead of it in its path's queue,
    # or a predicted wait over max_queue_wait_s, is answered 429 + Retry-After (outcome
    # `overloaded`) instead of waiting without end (engine/admission.py)
    max_queue: int = 64
    # a request whose predicted wait is longer is answered 429 + Retry-After
    max_queue_wait_s: float = 30.0
    # the request header that keeps a user on one version during a canary (None: `user` only)
    # the header whose value keeps a user on one version during a canary (None: the
    # OpenAI `user` field only; the header wins when both are sent)
    canary_user_header: str | None = None
    # the prefix KV cache's memory budget in MiB, LRU over blocks (0 turns it off)
    # the prefix KV cache: reuse the keys and values of shared prompt prefixes, LRU over
    # blocks of prefix_block_tokens under this budget (0 turns it off). Every prompt is
    # prefilled in such blocks, cache or not, so a miss costs nothing over no cache and the
    # answers are the same bits (docs/benchmarks/serving.md). At start and at every deploy the
    # preload_prompts most frequent block prefixes of the recorded prompts are prefilled
    # before traffic
    prefix_cache_mb: float = 256.0
    # the prefix cache's block, in tokens: prompts are prefilled in such blocks
    prefix_block_tokens: int = 64
    # the most frequent recorded prompt prefixes prefilled at start and at every deploy
    preload_prompts: int = 32
    # a shared tier so that a new replica starts warm, e.g. "redis://127.0.0.1:6379/0" (off)
    prefix_cache_redis_url: str | None = None
    # the key prefix of the shared tier's entries
    prefix_cache_redis_prefix: str = "infersight:kv:"
    # the secret the shared tier's blocks are sealed with (HMAC-SHA256), the same on every replica
    # required with prefix_cache_redis_url, at least 32 bytes; better given as INFERSIGHT_KV_KEY
    # than in the file. Without it, anyone who can write to Redis could forge a block
    prefix_cache_redis_key: str | None = field(default=None, repr=False)
    # the share of live requests also answered by the other version for paired checks (0: off)
    # paired release checks (engine/runtime_shadow.py): while a canary runs, and for the
    # post-deploy analysis window after a deploy (the previous version stays loaded), this
    # share of live requests is also answered by the other version (0 turns pairs off).
    # Shadows use at most pair_slots batch slots per version (default a quarter of the
    # batch) and only when no live request waits; otherwise they are dropped, counted
    pair_share: float = 0.1
    # batch slots per version that shadow requests may use (None: a quarter of the batch)
    pair_slots: int | None = None


@dataclass(frozen=True)
class RoutePathConfig:
    """One path of SLA routing: the registered version serving it and its latency target
    (arrival to last token); the fast path also bounds what it takes."""

    # the registered version serving this path
    version: str
    # the path's latency target, arrival to last token
    sla_ms: float
    # the longest prompt this path takes (None: no bound)
    max_prompt_tokens: int | None = None
    # the most tokens this path generates (None: no bound)
    max_new_tokens: int | None = None


@dataclass(frozen=True)
class RoutingConfig:
    """SLA routing in the embedded runtime: the standard version serves as the runtime's
    version, the fast one beside it (engine/routing.py)."""

    fast: RoutePathConfig
    standard: RoutePathConfig
    classifier: str | None = None  # "package.module:function", (RouteQuery) -> "fast" | "standard"
    # what the open length breaker does to long requests: reject (503) or standard
    # while a path's p99 is over its SLA, requests over the breaker's length threshold get
    # "reject" (503 + Retry-After) or go from the fast path to the "standard" one
    breaker_action: str = "reject"
    breaker_cooldown_s: float = 2.0  # open this long before half-open


@dataclass(frozen=True)
class UpstreamConfig:
    """Proxy /v1 to an existing OpenAI-compatible server, observing every request."""

    # the OpenAI-compatible server, e.g. http://127.0.0.1:8001 (vLLM, TGI, llama-server)
    url: str
    model: str | None = None  # the `model` label when the upstream's answer names none
    # how long one upstream request may take
    timeout_s: float = 300.0
    api_key: str | None = None  # sent to the upstream when the client sends no Authorization
    # the upstream's Prometheus page, read for its queue depth (None: <url>/metrics; "": off)
    # the upstream's Prometheus text (vLLM, TGI): its queue depth becomes the proxy's
    # `gen_ai_server_requests_waiting`. None: <url>/metrics; "" turns the scrape off
    metrics_url: str | None = None
    # The release this upstream serves, recorded as every answer's version instead of the answer's `model`.
    # In a pod, the controller's label for the release (Argo Rollouts' `rollouts-pod-template-hash`)
    # through the downward API and $INFERSIGHT_UPSTREAM_RELEASE; the proxy's answers name it in
    # the `x-infersight-release` header, which a shadow upstream's `release_header` reads.
    release: str | None = None


@dataclass(frozen=True)
class ShadowUpstreamConfig:
    """Proxy mode's paired checks: a second OpenAI-compatible server (the other version) that
    answers a share of live requests again, in the background (proxy_shadow.py)."""

    # the second OpenAI-compatible server, e.g. the next version beside the live one
    url: str
    model: str | None = None  # the shadow side's version name (None: its answer's `model`)
    served_model: str | None = None  # the body's `model` for the shadow upstream (None: the client's)
    # how long one shadow request may take
    timeout_s: float = 60.0
    api_key: str | None = None  # sent to the shadow upstream (else the client's Authorization)
    share: float = 0.1  # of successful live requests re-sent to it (0: none)
    max_in_flight: int = 4  # shadow requests at once; beyond it one is dropped and counted
    # The answer header naming the shadow side's release (before `model` and the answer's `model`).
    # `x-infersight-release` when the shadow upstream is another infersight sidecar with `upstream.release`.
    release_header: str | None = None


@dataclass(frozen=True)
class AlertingConfig:
    rules: Path | None = None  # None: the default rule set shipped with infersight
    # evaluate the rules and send notifications
    enabled: bool = True
    # post-deploy analysis: the new version against the previous one, then rollback
    analysis_window_s: float = 1800.0  # how long after a deploy the new version is watched
    analysis_interval_s: float = 60.0  # between checks
    analysis_failed_checks: int = 3  # failed checks before the automatic rollback
    analysis_min_requests: int = 20  # fewer on either side: inconclusive
    analysis_p99_ratio: float = 1.5  # the new version's p99 over this times the previous one fails a check
    # past the window, how long a paired check that must be decided (divergence) may hold the
    # verdict while undecided; the previous version stays loaded that much longer to answer shadows
    analysis_max_hold_s: float = 1800.0
    snapshot_requests: int = 100  # requests kept in the snapshot taken at an automatic rollback
    # requests kept for `dataset export --kind collected` after an automatic rollback (0: none)
    # the next requests (any version: the previous one now answers the same traffic) kept for
    # `infersight dataset export --kind collected` after an automatic rollback; 0: none
    collect_after_rollback: int = 200
    # canary requests a canary serves at one step (10% -> 50% -> 100%) with no regression
    # before it moves on to the next; the last step's count promotes it
    canary_step_requests: int = 200
    # when the paired similarity check may fail a release (canary and post-deploy):
    # "without_divergence" (only on pairs without the runtime's divergence, a proxy's; on the
    # runtime's own pairs it is reported and divergence decides) or "always". docs/releases.md
    pair_similarity: str = "without_divergence"
    # the canary's latency check: "whole" (arrival to last token) or "own" (less the seconds a
    # request waited on the other arm's forwards in the runtime's shared steps). docs/releases.md
    canary_latency: str = "whole"


@dataclass(frozen=True)
class DriftConfig:
    reference: Path | None = None  # a .jsonl/.csv/.txt file; None: the first window after a deploy
    # the significance level of the drift tests
    alpha: float = 0.05
    window: int = 300  # texts in the current window
    min_window: int = 50  # no verdict on fewer
    # the share of one CPU the streaming `embed` job may take on average (None: no budget)
    # the share of one CPU the streaming `embed` job may take on average (CPU seconds per
    # second): each tick takes as many texts as that buys at the CPU a text measured to cost on
    # this machine (a faster embedder embeds more for the same CPU); None: no budget, the
    # reservoir alone bounds a tick. The rest are counted as skipped.
    embed_cpu: float | None = 0.25
    # the most texts one `embed` tick takes, whatever the budget allows
    # at most this many texts per `embed` tick whatever the budget allows (the memory the
    # waiting texts may hold: up to 64 KB of text each)
    reservoir: int = 1024
    # default_embedder's backend: auto | onnxruntime | openvino | sentence-transformers
    embedder: str = "auto"
    # the int8 embedder's threads (None: every CPU the process may use)
    # the int8 embedder's threads; None: the CPUs the process may use. 1: the least CPU per
    # text, and the budget measures the job's own thread exactly (docs/benchmarks/drift.md)
    embed_threads: int | None = 1
    embedding_cache: int = 20_000  # texts whose embeddings are kept (about 1.6 KB each)
    # embed the texts and score drift
    enabled: bool = True
    # seconds without a request after which a version's drift state is dropped (None: kept)
    # a version with no request for this long (e.g. rolled back) has its drift state dropped:
    # its p-values and gauges go, so its drift alerts resolve; None keeps them forever
    stale_after_s: float | None = 1800.0


@dataclass(frozen=True)
class CostConfig:
    """What serving costs: `per_hour` (any currency) for the process, or for each GPU it
    watches (`per: device`). Exported as `infersight_cost_per_1k_output_tokens` by version."""

    # what one hour of serving costs, in any currency
    per_hour: float
    per: str = "process"  # "process" | "device"
    window_s: float = 3600.0  # the cost per 1k tokens covers this trailing window


@dataclass(frozen=True)
class ScheduleConfig:
    """Job intervals in seconds."""

    # between samples of the process and GPU collectors
    sample_s: float = 1.0
    upstream_metrics_s: float = 5.0  # proxy mode: reading the upstream's /metrics for its queue depth
    # between points of the page's time series
    timeseries_s: float = 5.0
    timeseries_window_s: float = 60.0  # latency quantiles of each point cover this window
    # between ticks of the streaming `embed` job
    embed_s: float = 2.0
    # between drift reports
    drift_s: float = 60.0
    rules_s: float = 1.0  # each rule group keeps its own `interval`; this is how often they are checked
    # between deliveries of the notification outbox
    outbox_s: float = 2.0
    # between ticks of the post-deploy analysis
    post_deploy_s: float = 5.0
    publish_s: float = 1.0  # each replica's heartbeat and statistics to the shared store
    # between retention sweeps
    retention_s: float = 3600.0


@dataclass(frozen=True)
class LimitsConfig:
    # the largest request body accepted (413 beyond)
    max_body_bytes: int = 8 * 1024 * 1024
    # the most events one ingest batch may hold
    max_events_per_batch: int = 10_000
    write_queue_rows: int = 200_000  # ingest answers 503 beyond this backlog
    timeseries_points: int = 17_280  # 24 h at the default 5 s tick
    max_label_values: int = 100  # distinct model (and model_version) label values; the rest are `other`
    # the longest one call can take, in seconds (duration, TTFT, TPOT, queue time)
    # an ingested event or OTLP span past it is refused by field: no measurement of 2**64 s
    # reaches the histograms
    max_duration_s: float = 86_400.0
    # the most tokens one call can count (prompt, output, the max_tokens asked for)
    # an ingested event or OTLP span past it is refused by field; at most 2**31-1, the store's integer
    max_tokens: int = 10_000_000
    # seconds a connection may take to send its request headers before it is closed
    # `infersight serve`'s sockets (overload.py): a connection whose request headers are not
    # all in this long after it opened (or its next request began) is closed, and one client
    # address holds at most this many connections at once (more are closed at once)
    header_timeout_s: float = 10.0
    # connections one client address may hold at once
    max_connections_per_client: int = 64
    # requests per second one client address may send without the token (0: no limit)
    # requests per second (and at once) from one client address without the token: more are
    # answered 429 + Retry-After before any routing (rate_limit.py); 0: no limit. Requests
    # with the token have their own bucket per address, token_client_rate (0: exempt)
    client_rate: float = 200.0
    # the burst one client address may send without the token
    client_burst: float = 400.0
    # requests per second from one address with the token (0: exempt)
    token_client_rate: float = 0.0
    # the burst one address may send with the token
    token_client_burst: float = 0.0
    rate_limited_clients: int = 10_000  # addresses tracked at once (least recently seen out)


@dataclass(frozen=True)
class ServiceConfig:
    # where the SQLite database, the token, snapshots and caches are kept
    data_dir: Path = Path("var")
    database_url: str | None = None  # None: SQLite in data_dir
    # the address `infersight serve` listens on (beyond loopback a token is required)
    host: str = "127.0.0.1"
    # the port `infersight serve` listens on
    port: int = 8000
    # Host header names answered besides the listen address (DNS rebinding guard; ["*"]: any)
    allowed_hosts: tuple[str, ...] = ()
    token: str | None = None  # None on loopback: generated and kept in data_dir/api-token
    model: str | None = None  # the model name reported in records (default: from the version)
    # the pid of the inference server the process and GPU collectors watch (None: this process)
    # the inference server's process, watched by the process (and GPU per-process) collector;
    # None: this process, which is the server only with the embedded runtime
    supervise_pid: int | None = None
    engine: EngineConfig | None = None
    upstream: UpstreamConfig | None = None
    shadow_upstream: ShadowUpstreamConfig | None = None  # proxy mode: the other version, for pairs
    alerting: AlertingConfig = field(default_factory=AlertingConfig)
    drift: DriftConfig = field(default_factory=DriftConfig)
    retention: RetentionPolicy = field(default_factory=RetentionPolicy)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    cost: CostConfig | None = None
    routing: RoutingConfig | None = None  # SLA routing (embedded runtime only); None: one path
    text_sample_rate: float = 1.0  # share of proxied/served requests whose text is kept
    # a "package.module:function" (str -> str) applied to every text a dataset export lets out
    # "package.module:function", the SDK's `redact` hook (str -> str): applied to every text
    # the dataset export (CLI and GET /api/v1/dataset) lets out; a hook that fails drops the text
    redact: str | None = None
    leader_election: bool = True  # one replica runs rules, drift, outbox and retention
    # seconds feedback whose request has not arrived is kept before it is deleted
    feedback_ttl_s: float = 86_400.0
    # prompt tokens above which the slowdown diagnosis counts a request as a long prompt
    long_prompt_tokens: int = 2048
    # debug | info | warning | error
    log_level: str = "info"
