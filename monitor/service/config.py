"""The service's configuration: the YAML file and the environment that build it, strictly
checked, and the rules across its fields.

The configuration is frozen dataclasses, one per section (config_sections.py, re-exported
here), built from a YAML file plus the environment (`load_config`, below) or directly in
code and tests.

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
from pathlib import Path
from typing import Any

import yaml
from infersight.alerts.release.canary import LATENCY_MODES
from infersight.alerts.release.paired_checks import SIMILARITY_MODES
from infersight.monitor.store.retention import RetentionPolicy

from .config_sections import (
    AlertingConfig,
    CostConfig,
    DriftConfig,
    EngineConfig,
    LimitsConfig,
    RoutePathConfig,
    RoutingConfig,
    ScheduleConfig,
    ServiceConfig,
    ShadowUpstreamConfig,
    UpstreamConfig,
)
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
# the limits that may be 0 (no rate limit); every other limit must be positive
_RATES = frozenset({"client_rate", "client_burst", "token_client_rate", "token_client_burst"})


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
    if config.alerting.pair_similarity not in SIMILARITY_MODES:
        fail("alerting.pair_similarity", f"must be one of {', '.join(SIMILARITY_MODES)}")
    if config.alerting.canary_latency not in LATENCY_MODES:
        fail("alerting.canary_latency", f"must be one of {', '.join(LATENCY_MODES)}")
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
