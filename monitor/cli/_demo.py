"""`infersight demo`: PLACEHOLDER until its owner replaces this module."""

from __future__ import annotations

import argparse

from ._errors import CommandError


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("demo", help="(not built yet)")
    p.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    raise CommandError("not built yet")
