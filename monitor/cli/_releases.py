"""`infersight releases`: a release's verdict from a running server, for a controller's job.

    infersight releases wait --candidate V --baseline W [--timeout 10m] [--interval 10s]
                             [--min-pairs N] [--url URL] [--token T]

Asks `GET /api/v1/releases/verdict` every `--interval` until it is `pass` or `fail`, or
`--timeout` has passed, and prints the last verdict line. Exit status, as Argo Rollouts'
Job metric provider reads it (0 succeeds, anything else fails the measurement): 0 pass,
1 fail, 2 still inconclusive at the timeout (or the versions never seen, or the server
not reachable, by then: a candidate whose pods are starting or have not answered yet is
waited for, not refused). A bad argument,
a wrong token or a server that cannot judge (no pairs made there) is a one-line error,
exit 2, at once. The token comes as for the other commands that talk to a server:
--token, else $INFERSIGHT_TOKEN, else DATA_DIR/api-token.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import CommandError

__all__ = ["register", "wait_for_verdict"]

EXIT = {"pass": 0, "fail": 1, "inconclusive": 2}


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("releases", help="a release's paired-check verdict from a running server")
    verbs = p.add_subparsers(dest="verb", required=True, metavar="VERB")
    wait = verbs.add_parser(
        "wait", help="wait for the verdict on CANDIDATE against BASELINE: exit 0 pass, 1 fail, 2 timeout",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    wait.add_argument("--candidate", required=True, metavar="VERSION", help="the version under test")
    wait.add_argument("--baseline", required=True, metavar="VERSION", help="the version it is compared with")
    wait.add_argument(
        "--timeout", default="10m", help="how long to wait for pass or fail (default: %(default)s)"
    )
    wait.add_argument("--interval", default="10s", help="between questions (default: %(default)s)")
    wait.add_argument("--min-pairs", type=int, help="pairs before any verdict (default: the server's)")
    wait.add_argument("--url", default="http://127.0.0.1:8000", help="the service (default: %(default)s)")
    wait.add_argument("--token", default=None,
                      help="bearer token (default: $INFERSIGHT_TOKEN, else DATA_DIR/api-token)")  # fmt: skip
    wait.add_argument("--data-dir", type=Path, default=Path("var"),
                      help="the service's data directory, for its api-token file (default: ./var)")  # fmt: skip
    wait.set_defaults(handler=_wait)


def _seconds(flag: str, text: str) -> float:
    from infersight.alerts.rules.rules import parse_duration

    try:
        seconds = float(text) if text.replace(".", "", 1).isdigit() else parse_duration(text)
    except ValueError as exc:
        raise CommandError(f"{flag}: {exc}") from None
    if not seconds > 0:
        raise CommandError(f"{flag} must be positive, got {text}")
    return seconds


def wait_for_verdict(
    ask: Callable[[], tuple[int, dict[str, Any]]], *, timeout_s: float, interval_s: float,
    clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
) -> tuple[str, str]:  # fmt: skip
    """Ask until pass or fail or `timeout_s` -> (verdict, the line to print). `ask` returns
    the HTTP status (0: the server did not answer) and the JSON answer; a 404 (a version
    not seen yet) and no answer are waited on as inconclusive, any other error raises
    CommandError."""
    deadline = clock() + timeout_s
    while True:
        status, data = ask()
        if status == 200:
            verdict = str(data.get("verdict"))
            line = (f"{verdict} {data.get('candidate')} against {data.get('baseline')}: {data.get('pairs')} pairs "
                    f"(min {data.get('min_pairs')}): {data.get('reason')}")  # fmt: skip
            if verdict not in EXIT:
                raise CommandError(f"the server answered an unknown verdict {verdict!r}")
        elif status in (0, 404):
            verdict, line = "inconclusive", f"inconclusive: {_message(data)}"
        elif status == 401:
            raise CommandError("HTTP 401: the service wants its bearer token: pass --token, set "
                               "$INFERSIGHT_TOKEN, or point --data-dir at the service's data directory")  # fmt: skip
        else:
            raise CommandError(f"HTTP {status}: {_message(data)}")
        left = deadline - clock()
        if verdict != "inconclusive" or left <= 0:
            return verdict, line
        sleep(min(interval_s, left))


def _message(data: dict[str, Any]) -> str:
    error = data.get("error")
    if isinstance(error, dict):
        where = f"{error['field']}: " if error.get("field") else ""
        return " ".join(f"{where}{error.get('message', '')}".split())[:300]
    return " ".join(str(data.get("detail", data)).split())[:300]


def _wait(args: argparse.Namespace) -> int:
    import httpx

    from ._models import _token

    timeout_s, interval_s = _seconds("--timeout", args.timeout), _seconds("--interval", args.interval)
    base = args.url.rstrip("/")
    token = _token(args)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    params: dict[str, Any] = {"candidate": args.candidate, "baseline": args.baseline}
    if args.min_pairs is not None:
        params["min_pairs"] = args.min_pairs

    def ask() -> tuple[int, dict[str, Any]]:
        try:
            r = httpx.get(f"{base}/api/v1/releases/verdict", params=params, headers=headers, timeout=30.0)
        except httpx.HTTPError as exc:  # the pods may be starting: asked again until the timeout
            return 0, {"detail": f"cannot reach {base}: {type(exc).__name__}: {exc}"}
        try:
            data = r.json()
        except ValueError:
            data = {"detail": r.text[:200]}
        return r.status_code, data if isinstance(data, dict) else {"detail": data}

    verdict, line = wait_for_verdict(ask, timeout_s=timeout_s, interval_s=interval_s)
    print(line)
    return EXIT[verdict]
