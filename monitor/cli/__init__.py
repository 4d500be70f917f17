"""The `infersight` command line.

Each subcommand lives in its own module `_<name>.py` exposing `register(subparsers)`,
which adds its parser and sets `handler` (a function `(argparse.Namespace) -> int`).
Modules import their heavy dependencies inside the handler, so `infersight --help`
stays fast. A handler reports bad input by raising `CommandError`; `main` prints it
as one line and exits 2, never with a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

from ._errors import CommandError

__all__ = ["CommandError", "main"]

_COMMANDS = ("models", "drift", "rules", "dashboards", "serve", "dataset", "demo")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="infersight",
        description="Observability and drift monitoring for LLM inference.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in _COMMANDS:
        importlib.import_module(f"{__name__}._{name}").register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.handler(args))
    except CommandError as exc:
        print(f"infersight {args.command}: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print(f"infersight {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        if os.environ.get("INFERSIGHT_DEBUG"):
            raise
        print(
            f"infersight {args.command}: internal error: {type(exc).__name__}: {exc} "
            "(set INFERSIGHT_DEBUG=1 for the traceback)",
            file=sys.stderr,
        )
        return 70


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
