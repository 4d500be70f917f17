"""`infersight demo`: the whole loop on this machine, no GPU, nothing from the network.

Starts the service with the embedded runtime and the demo model on SQLite, drives
Banking77 traffic through the OpenAI endpoint, then plays an incident: a topic shift the
drift module flags, and a bad release the post-deploy analysis rolls back by itself, with
a snapshot and a signed webhook delivered to a local receiver. Prints the timeline;
exits 0 when every step happened, 1 naming the step that did not.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

__all__ = ["register"]


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("demo", help="play the demo incident end to end (make demo)", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--data-dir", type=Path, default=Path("var/demo"),
                   help="where the demo model, database and snapshots go (default ./var/demo)")  # fmt: skip
    p.add_argument("--port", type=int, help="port of the service (default: a free one)")
    p.add_argument("--fast", action="store_true", help="smaller traffic windows (what the test runs)")
    p.add_argument(
        "--keep-running", action="store_true", help="keep the service up afterwards to browse the page"
    )
    p.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    from infersight.monitor.service.demo import DemoOptions, run_demo

    logging.basicConfig(level=logging.ERROR, format="%(levelname)s %(name)s: %(message)s")
    os.environ.setdefault("TQDM_DISABLE", "1")  # the embedding model's load bar would cut into the timeline
    result = run_demo(
        DemoOptions(data_dir=args.data_dir, fast=args.fast, port=args.port, keep_running=args.keep_running),
        sys.stdout,
    )
    return 0 if result.ok else 1
