"""`infersight dashboards export DIR` and `infersight dashboards push --url URL --token TOKEN`."""

from __future__ import annotations

import argparse
import os

from ._errors import CommandError


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("dashboards", help="export or push the Grafana dashboards")
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")

    exp = actions.add_parser("export", help="write the dashboard JSON and a Grafana provisioning YAML")
    exp.add_argument("directory", metavar="DIR")
    exp.add_argument(
        "--dashboards-path",
        help="directory Grafana reads the JSON from, written into the YAML (default: DIR, absolute)",
    )
    exp.add_argument("--folder", default="infersight", help="Grafana folder for provisioned dashboards")
    exp.set_defaults(handler=_export)

    push = actions.add_parser("push", help="upload the dashboard to Grafana (overwrites the previous one)")
    push.add_argument("--url", required=True, help="Grafana base URL, e.g. http://127.0.0.1:3000")
    push.add_argument(
        "--token",
        default=os.environ.get("GRAFANA_TOKEN"),
        help="service-account token (default: $GRAFANA_TOKEN)",
    )
    push.add_argument("--folder", help="folder title or uid (created when missing; default: General)")
    push.add_argument("--timeout", type=float, default=10.0, help="seconds to wait for Grafana")
    push.set_defaults(handler=_push)


def _export(args: argparse.Namespace) -> int:
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


def _push(args: argparse.Namespace) -> int:
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
