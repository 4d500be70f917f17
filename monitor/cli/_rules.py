"""`infersight rules`: check a rule file, or export it as a Prometheus rule file.

    infersight rules check [RULES.yaml]
    infersight rules export FILE [--rules RULES.yaml]

Without a rule file, the default rule set shipped with infersight is used.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from ._errors import CommandError

if TYPE_CHECKING:
    from infersight.alerts import AlertConfig


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("rules", help="check alerting rules, export them for Prometheus")
    verbs = p.add_subparsers(dest="verb", required=True, metavar="VERB")
    check = verbs.add_parser("check", help="validate a rule file and list its rules")
    check.add_argument("rules", nargs="?", help="rule file (default: the shipped default rules)")
    check.set_defaults(handler=_check)
    export = verbs.add_parser("export", help="write the rules as a Prometheus rule file")
    export.add_argument("file", help="where to write the Prometheus rule file ('-' for stdout)")
    export.add_argument("--rules", help="rule file (default: the shipped default rules)")
    export.set_defaults(handler=_export)


def _load(path: str | None) -> AlertConfig:
    from infersight.alerts import RuleParseError, load_config

    try:
        return load_config(path)
    except RuleParseError as exc:
        raise CommandError(str(exc)) from exc


def _check(args: argparse.Namespace) -> int:
    from infersight.alerts.rules._yaml import format_duration

    config = _load(args.rules)
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


def _export(args: argparse.Namespace) -> int:
    from infersight.alerts import export_prometheus

    result = export_prometheus(_load(args.rules))
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
