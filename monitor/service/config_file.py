"""`load_config(path, env)`: the YAML config file of `infersight serve`, strictly checked.

Every key is optional; an unknown key, a wrong type or a bad value raises `ConfigInvalid`
naming its dotted path. Relative paths are resolved against the file's directory.
Environment variables override the file for secrets and the database URL:
`INFERSIGHT_TOKEN`, `INFERSIGHT_DATABASE_URL`, `INFERSIGHT_UPSTREAM_API_KEY`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from infersight.monitor.store.retention import RetentionPolicy

from .config import (
    AlertingConfig,
    CostConfig,
    DriftConfig,
    EngineConfig,
    LimitsConfig,
    RoutePathConfig,
    RoutingConfig,
    ScheduleConfig,
    ServiceConfig,
    UpstreamConfig,
)
from .errors import ConfigInvalid

__all__ = ["config_from_mapping", "load_config"]

ENV_TOKEN = "INFERSIGHT_TOKEN"
ENV_DATABASE_URL = "INFERSIGHT_DATABASE_URL"
ENV_UPSTREAM_API_KEY = "INFERSIGHT_UPSTREAM_API_KEY"
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
        "engine": EngineConfig, "upstream": UpstreamConfig, "alerting": AlertingConfig,
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
    metrics_url = config.upstream.metrics_url if config.upstream is not None else None
    if metrics_url and not metrics_url.startswith(("http://", "https://")):
        fail("upstream.metrics_url", "must be an http:// or https:// URL (or empty: no scrape)")
    if config.supervise_pid is not None and not config.supervise_pid > 0:
        fail("supervise_pid", "must be a positive process id")
    if config.token is not None and len(config.token) < 16:
        fail("token", "must be at least 16 characters")
    if not 0.0 <= config.text_sample_rate <= 1.0:
        fail("text_sample_rate", "must be between 0 and 1")
    if not 0 <= config.alerting.collect_after_rollback <= 100_000:
        fail("alerting.collect_after_rollback", "must be between 0 and 100000")
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
    for f in dataclasses.fields(ScheduleConfig):
        if not getattr(config.schedule, f.name) > 0:
            fail(f"schedule.{f.name}", "must be a positive number of seconds")
    for f in dataclasses.fields(LimitsConfig):
        if not getattr(config.limits, f.name) > 0:
            fail(f"limits.{f.name}", "must be positive")
    if config.cost is not None:
        if not (isinstance(config.cost.per_hour, int | float) and 0 < config.cost.per_hour < float("inf")):
            fail("cost.per_hour", "must be a positive number (cost of one hour of serving)")
        if config.cost.per not in ("process", "device"):
            fail("cost.per", "must be process or device")
        if not config.cost.window_s > 0:
            fail("cost.window_s", "must be a positive number of seconds")
    if config.engine is not None:
        for name in ("max_batch_size", "max_prompt_tokens", "max_seq_len", "max_tokens_limit"):
            if not getattr(config.engine, name) > 0:
                fail(f"engine.{name}", "must be positive")
        if not config.engine.prefix_cache_mb >= 0:
            fail("engine.prefix_cache_mb", "must be >= 0 (0 turns the prefix cache off)")
        if not config.engine.prefix_block_tokens > 0:
            fail("engine.prefix_block_tokens", "must be positive")
        if not config.engine.preload_prompts >= 0:
            fail("engine.preload_prompts", "must be >= 0")
        url = config.engine.prefix_cache_redis_url
        if url is not None and not url.startswith(("redis://", "rediss://", "unix://")):
            fail("engine.prefix_cache_redis_url", "must be a redis://, rediss:// or unix:// URL")
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
        return value
