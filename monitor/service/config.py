"""The service's configuration: the dataclasses and the YAML file that builds them.

The service's configuration: frozen dataclasses, built from a YAML file plus the
environment (`load_config`, below) or directly in code and tests.

Secrets never need to be in the file: `INFERSIGHT_TOKEN` (bearer token),
`INFERSIGHT_DATABASE_URL`, `INFERSIGHT_UPSTREAM_API_KEY`, `INFERSIGHT_SHADOW_UPSTREAM_API_KEY`,
`INFERSIGHT_KV_KEY` (the shared KV tier's seal key); receivers' secrets are named by
`*_env` keys in the rule file (e.g. `routing_key_env: INFERSIGHT_PAGERDUTY_ROUTING_KEY`).

`load_config(path, env)`: the YAML config file of `infersight serve`, strictly checked.

Every key is optional; an unknown key, a wrong type or a bad value raises `ConfigInvalid`
naming its dotted path. Relative paths are resolved against the file's directory.
Environment variables override the file for secrets and the database URL:
`INFERSIGHT_TOKEN`, `INFERSIGHT_DATABASE_URL`, `INFERSIGHT_UPSTREAM_API_KEY`,
`INFERSIGHT_SHADOW_UPSTREAM_API_KEY`, and `INFERSIGHT_UPSTREAM_RELEASE` (`upstream.release`:
set per pod from the controller's label through the downward API)."""

from __future__ import annotations

import dataclasses
import ipaddress
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from infersight.monitor.store.retention import RetentionPolicy

from .errors import ConfigInvalid

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
    "config_from_mapping",
    "is_loopback",
    "load_config",
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
    snapshot_requests: int = 100  # requests kept in the snapshot taken at an automatic rollback
    # requests kept for `dataset export --kind collected` after an automatic rollback (0: none)
    # the next requests (any version: the previous one now answers the same traffic) kept for
    # `infersight dataset export --kind collected` after an automatic rollback; 0: none
    collect_after_rollback: int = 200
    # canary requests a canary serves at one step (10% -> 50% -> 100%) with no regression
    # before it moves on to the next; the last step's count promotes it
    canary_step_requests: int = 200


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


_RATES = frozenset({"client_rate", "client_burst", "token_client_rate", "token_client_burst"})


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


def _check_shadow_upstream(
    shadow: ShadowUpstreamConfig, *, proxy: bool, fail: Callable[[str, str], None]
) -> None:
    if not proxy:
        fail(
            "shadow_upstream",
            "is for proxy mode (upstream:); the embedded runtime pairs with engine.pair_share",
        )
    if not shadow.url.startswith(("http://", "https://")):
        fail("shadow_upstream.url", "must be an http:// or https:// URL")
    if not 0.0 <= shadow.share <= 1.0:
        fail("shadow_upstream.share", "must lie in [0, 1]")
    if not 1 <= shadow.max_in_flight <= 1024:
        fail("shadow_upstream.max_in_flight", "must be between 1 and 1024")
    if not shadow.timeout_s > 0:
        fail("shadow_upstream.timeout_s", "must be a positive number of seconds")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


ENV_TOKEN = "INFERSIGHT_TOKEN"
ENV_DATABASE_URL = "INFERSIGHT_DATABASE_URL"
ENV_UPSTREAM_API_KEY = "INFERSIGHT_UPSTREAM_API_KEY"
ENV_SHADOW_UPSTREAM_API_KEY = "INFERSIGHT_SHADOW_UPSTREAM_API_KEY"
ENV_KV_KEY = "INFERSIGHT_KV_KEY"
ENV_UPSTREAM_RELEASE = "INFERSIGHT_UPSTREAM_RELEASE"
_RELEASE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,255}")  # as the deploy marks' names
_PATH_FIELDS = {"data_dir", "registry", "rules", "reference"}


def load_config(path: str | Path | None, env: Mapping[str, str] | None = None) -> ServiceConfig:
    """The config at `path` (None: all defaults), with the environment applied."""
    env = env if env is not None else {}
    if path is None:
        return config_from_mapping({}, env=env)
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigInvalid("config", f"cannot read: {exc.strerror or exc}", source=source) from exc
    except UnicodeDecodeError as exc:
        raise ConfigInvalid("config", "not UTF-8 text", source=source) from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark is not None else "config"
        raise ConfigInvalid(where, f"not valid YAML: {getattr(exc, 'problem', exc)}", source=source) from exc
    if isinstance(data, dict) and "token" in data:  # a file is copied, committed and shown: no secrets
        raise ConfigInvalid(
            "token", f"the token does not go in the config file: set ${ENV_TOKEN} in the service's "
            "environment (on loopback, without it, one is generated in DATA_DIR/api-token)", source=source,
        )  # fmt: skip
    return config_from_mapping(data or {}, env=env, base=Path(path).resolve().parent, source=source)


def config_from_mapping(
    data: Any, *, env: Mapping[str, str] | None = None, base: Path | None = None, source: str | None = None
) -> ServiceConfig:
    env = env or {}
    reader = _Reader(base or Path.cwd(), source)
    routing = None
    if isinstance(data, dict) and data.get("routing") is not None:
        data = dict(data)
        routing = reader.routing(data.pop("routing"))
    top = reader.section(data, "", ServiceConfig, nested={
        "engine": EngineConfig, "upstream": UpstreamConfig,
        "shadow_upstream": ShadowUpstreamConfig, "alerting": AlertingConfig,
        "drift": DriftConfig, "retention": RetentionPolicy, "schedule": ScheduleConfig,
        "limits": LimitsConfig, "cost": CostConfig,
    })  # fmt: skip
    if routing is not None:
        top["routing"] = routing
    if env.get(ENV_TOKEN):
        top["token"] = env[ENV_TOKEN]
    if env.get(ENV_DATABASE_URL):
        top["database_url"] = env[ENV_DATABASE_URL]
    upstream = top.get("upstream")
    if isinstance(upstream, UpstreamConfig) and env.get(ENV_UPSTREAM_API_KEY):
        top["upstream"] = dataclasses.replace(upstream, api_key=env[ENV_UPSTREAM_API_KEY])
    upstream = top.get("upstream")
    if isinstance(upstream, UpstreamConfig) and env.get(ENV_UPSTREAM_RELEASE):
        top["upstream"] = dataclasses.replace(upstream, release=env[ENV_UPSTREAM_RELEASE])
    shadow = top.get("shadow_upstream")
    if isinstance(shadow, ShadowUpstreamConfig) and env.get(ENV_SHADOW_UPSTREAM_API_KEY):
        top["shadow_upstream"] = dataclasses.replace(shadow, api_key=env[ENV_SHADOW_UPSTREAM_API_KEY])
    engine = top.get("engine")
    if isinstance(engine, EngineConfig) and env.get(ENV_KV_KEY):
        top["engine"] = dataclasses.replace(engine, prefix_cache_redis_key=env[ENV_KV_KEY])
    try:
        config = ServiceConfig(**top)
    except (TypeError, ValueError) as exc:
        raise ConfigInvalid("config", str(exc), source=source) from exc
    return check_config(config, source=source)


def check_config(config: ServiceConfig, *, source: str | None = None) -> ServiceConfig:
    """Cross-field rules; returns `config` unchanged when it is valid."""

    def fail(field: str, reason: str) -> None:
        raise ConfigInvalid(field, reason, source=source)

    if config.engine is not None and config.upstream is not None:
        fail("upstream", "give either engine (embedded runtime) or upstream (proxy), not both")
    if config.upstream is not None and not config.upstream.url.startswith(("http://", "https://")):
        fail("upstream.url", "must be an http:// or https:// URL")
    release = config.upstream.release if config.upstream is not None else None
    if release is not None and not _RELEASE_NAME.fullmatch(release):
        fail("upstream.release", "must be a version name: letters, digits and ._:/@+- (at most 256)")
    header = config.shadow_upstream.release_header if config.shadow_upstream is not None else None
    if header is not None and not re.fullmatch(r"[A-Za-z0-9!#$%&'*+.^_`|~-]+", header):
        fail("shadow_upstream.release_header", "must be an HTTP header name, e.g. x-infersight-release")
    metrics_url = config.upstream.metrics_url if config.upstream is not None else None
    if metrics_url and not metrics_url.startswith(("http://", "https://")):
        fail("upstream.metrics_url", "must be an http:// or https:// URL (or empty: no scrape)")
    if config.shadow_upstream is not None:
        _check_shadow_upstream(config.shadow_upstream, proxy=config.upstream is not None, fail=fail)
    if config.supervise_pid is not None and not config.supervise_pid > 0:
        fail("supervise_pid", "must be a positive process id")
    if config.token is not None and len(config.token) < 16:
        fail("token", "must be at least 16 characters")
    if not 0.0 <= config.text_sample_rate <= 1.0:
        fail("text_sample_rate", "must be between 0 and 1")
    if not config.feedback_ttl_s > 0:
        fail("feedback_ttl_s", "must be a positive number of seconds")
    if config.long_prompt_tokens < 1:
        fail("long_prompt_tokens", "must be a positive number of tokens")
    if not 0 <= config.alerting.collect_after_rollback <= 100_000:
        fail("alerting.collect_after_rollback", "must be between 0 and 100000")
    if not 1 <= config.alerting.canary_step_requests <= 1_000_000:
        fail("alerting.canary_step_requests", "must be between 1 and 1000000")
    if config.redact is not None:
        from infersight.monitor.dataset import RedactorInvalid, load_redactor

        try:
            load_redactor(config.redact)
        except RedactorInvalid as exc:
            fail("redact", str(exc))
    if not 0 < config.port < 65536:
        fail("port", "must be between 1 and 65535")
    if config.database_url is not None and not config.database_url.startswith(("sqlite", "postgres")):
        fail("database_url", "must be a sqlite:/// or postgresql:// URL")
    if not 0.0 < config.drift.alpha < 1.0:
        fail("drift.alpha", "must be between 0 and 1")
    if config.drift.min_window < 2 or config.drift.window < config.drift.min_window:
        fail("drift.window", "must be at least drift.min_window, itself at least 2")
    if config.drift.stale_after_s is not None and not config.drift.stale_after_s > 0:
        fail("drift.stale_after_s", "must be a positive number of seconds or null")
    if config.drift.embedder not in ("auto", "onnxruntime", "openvino", "sentence-transformers"):
        fail("drift.embedder", "must be one of auto, onnxruntime, openvino, sentence-transformers")
    if config.drift.embed_threads is not None and not config.drift.embed_threads >= 1:
        fail("drift.embed_threads", "must be a positive number of threads or null")
    if config.drift.embed_cpu is not None and not 0 < config.drift.embed_cpu <= 1024:
        fail("drift.embed_cpu", "must be a positive share of one CPU (0.25: a quarter) or null")
    if not config.drift.reservoir >= 1:
        fail("drift.reservoir", "must be a positive number of texts")
    for f in dataclasses.fields(ScheduleConfig):
        if not getattr(config.schedule, f.name) > 0:
            fail(f"schedule.{f.name}", "must be a positive number of seconds")
    for f in dataclasses.fields(LimitsConfig):
        if f.name in _RATES:
            continue
        if not getattr(config.limits, f.name) > 0:
            fail(f"limits.{f.name}", "must be positive")
    if not (
        isinstance(config.limits.max_duration_s, int | float) and config.limits.max_duration_s < float("inf")
    ):
        fail("limits.max_duration_s", "must be a finite number of seconds")
    if not (isinstance(config.limits.max_tokens, int) and config.limits.max_tokens <= 2**31 - 1):
        fail("limits.max_tokens", "must be an integer of at most 2147483647")
    for rate, burst in (("client_rate", "client_burst"), ("token_client_rate", "token_client_burst")):
        value = getattr(config.limits, rate)
        if not (isinstance(value, int | float) and 0 <= value < float("inf")):
            fail(f"limits.{rate}", "must be a number of requests per second, 0 for no limit")
        if value > 0 and not getattr(config.limits, burst) >= 1:
            fail(f"limits.{burst}", f"must be at least 1 when limits.{rate} is set")
    if config.cost is not None:
        if not (isinstance(config.cost.per_hour, int | float) and 0 < config.cost.per_hour < float("inf")):
            fail("cost.per_hour", "must be a positive number (cost of one hour of serving)")
        if config.cost.per not in ("process", "device"):
            fail("cost.per", "must be process or device")
        if not config.cost.window_s > 0:
            fail("cost.window_s", "must be a positive number of seconds")
    if config.engine is not None:
        for name in ("max_batch_size", "max_prompt_tokens", "max_seq_len", "max_tokens_limit", "max_queue",
                     "max_queue_wait_s"):  # fmt: skip
            if not getattr(config.engine, name) > 0:
                fail(f"engine.{name}", "must be positive")
        if not config.engine.prefix_cache_mb >= 0:
            fail("engine.prefix_cache_mb", "must be >= 0 (0 turns the prefix cache off)")
        if not config.engine.prefix_block_tokens > 0:
            fail("engine.prefix_block_tokens", "must be positive")
        if not 0.0 <= config.engine.pair_share <= 1.0:
            fail("engine.pair_share", "must lie in [0, 1]")
        if config.engine.pair_slots is not None and config.engine.pair_slots < 1:
            fail("engine.pair_slots", "must be at least 1")
        if not config.engine.preload_prompts >= 0:
            fail("engine.preload_prompts", "must be >= 0")
        url = config.engine.prefix_cache_redis_url
        if url is not None and not url.startswith(("redis://", "rediss://", "unix://")):
            fail("engine.prefix_cache_redis_url", "must be a redis://, rediss:// or unix:// URL")
        key = config.engine.prefix_cache_redis_key
        if url is not None and config.engine.prefix_cache_mb > 0 and len((key or "").encode()) < 32:
            fail("engine.prefix_cache_redis_key", f"the shared tier needs a secret of at least 32 bytes "
                 f"(or {ENV_KV_KEY}) to seal its blocks with; {'none' if not key else 'a shorter one'} given")  # fmt: skip
    if config.routing is not None:
        _check_routing(config, fail)
    return config


def _check_routing(config: ServiceConfig, fail: Any) -> None:
    """SLAs positive, limits positive, the classifier importable, both versions registered
    (whether they load is known at start: the service refuses to start, naming the key)."""
    routing = config.routing
    assert routing is not None
    if config.engine is None:
        fail("routing", "needs the embedded runtime (engine:), not a proxy")
        return
    for name in ("fast", "standard"):
        path = getattr(routing, name)
        if not (0 < path.sla_ms < float("inf")):
            fail(f"routing.{name}.sla_ms", "must be a positive number of milliseconds")
        for limit in ("max_prompt_tokens", "max_new_tokens"):
            value = getattr(path, limit)
            if value is not None and not value > 0:
                fail(f"routing.{name}.{limit}", "must be positive")
    if routing.breaker_action not in ("reject", "standard"):
        fail("routing.breaker_action", "must be reject (503 + Retry-After) or standard")
    if not routing.breaker_cooldown_s > 0:
        fail("routing.breaker_cooldown_s", "must be a positive number of seconds")
    if config.engine.version is not None and config.engine.version != routing.standard.version:
        fail(
            "routing.standard.version",
            f"must be engine.version ({config.engine.version}) or engine.version unset",
        )
    if routing.classifier is not None:
        from infersight.monitor.dataset import RedactorInvalid, load_redactor

        try:
            load_redactor(routing.classifier)  # the same "module:function" import as `redact`
        except RedactorInvalid as exc:
            fail("routing.classifier", f"cannot use {routing.classifier!r}: {str(exc).split(': ', 1)[-1]}")
    from infersight.engine.errors import RegistryError
    from infersight.engine.registry import Registry

    try:
        registry = Registry(config.engine.registry)
        for name in ("fast", "standard"):
            version = getattr(routing, name).version
            if version not in registry:
                fail(f"routing.{name}.version", f"{version} is not registered in {config.engine.registry}")
    except RegistryError as exc:
        fail("engine.registry", str(exc))


class _Reader:
    def __init__(self, base: Path, source: str | None) -> None:
        self.base = base
        self.source = source

    def fail(self, field: str, reason: str) -> None:
        raise ConfigInvalid(field, reason, source=self.source)

    def section(
        self, data: Any, prefix: str, cls: type, nested: Mapping[str, type] | None = None
    ) -> dict[str, Any]:
        if not isinstance(data, dict):
            self.fail(prefix.rstrip(".") or "config", "must be a mapping")
        fields = {f.name: f for f in dataclasses.fields(cls)}
        out: dict[str, Any] = {}
        for key, value in data.items():
            path = f"{prefix}{key}"
            if not isinstance(key, str) or key not in fields:
                self.fail(path, f"unknown key (known: {', '.join(sorted(fields))})")
            if nested and key in nested:
                if value is None:
                    out[key] = None
                    continue
                sub = self.section(value, f"{path}.", nested[key])
                try:
                    out[key] = nested[key](**sub)
                except TypeError as exc:
                    self.fail(path, f"incomplete: {exc}")
                except ValueError as exc:
                    self.fail(path, str(exc))
                continue
            out[key] = self.value(path, key, value, fields[key].type)
        return out

    def routing(self, data: Any) -> RoutingConfig:
        if not isinstance(data, dict):
            self.fail("routing", "must be a mapping")
        paths = {}
        for name in ("fast", "standard"):
            if name not in data:
                self.fail(f"routing.{name}", "is required (version and sla_ms)")
            sub = self.section(data[name], f"routing.{name}.", RoutePathConfig)
            for key in ("version", "sla_ms"):
                if key not in sub:
                    self.fail(f"routing.{name}.{key}", "is required")
            paths[name] = RoutePathConfig(**sub)
        rest = self.section({k: v for k, v in data.items() if k not in paths}, "routing.", RoutingConfig)
        return RoutingConfig(fast=paths["fast"], standard=paths["standard"], **rest)

    def value(self, path: str, key: str, value: Any, annotation: Any) -> Any:
        kind = str(annotation)
        if value is None:
            if "None" not in kind:
                self.fail(path, "must not be null")
            return None
        if key in _PATH_FIELDS:
            if not isinstance(value, str) or not value:
                self.fail(path, "must be a path")
            p = Path(value).expanduser()
            return p if p.is_absolute() else (self.base / p)
        if kind.startswith("bool"):
            if not isinstance(value, bool):
                self.fail(path, "must be true or false")
            return value
        if kind.startswith("int"):
            if isinstance(value, bool) or not isinstance(value, int):
                self.fail(path, "must be an integer")
            return value
        if kind.startswith("float"):
            if isinstance(value, bool) or not isinstance(value, int | float):
                self.fail(path, "must be a number")
            return float(value)
        if kind.startswith("str"):
            if not isinstance(value, str | int | float) or isinstance(value, bool):
                self.fail(path, "must be a string")
            return str(value)
        if kind.startswith("tuple[str"):
            if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
                self.fail(path, "must be a list of strings")
            return tuple(value)
        return value
