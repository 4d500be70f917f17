"""The `infersight` command line.

The subcommands live in modules by what they act on: `_serve.py` (serve, demo),
`_models.py` (models, rules, dashboards), `_data.py` (drift, dataset) and `_releases.py`
(a release's verdict, for a controller's job). Each exposes
`register(subparsers)`, which adds its parsers and sets each one's `handler` (a function
`(argparse.Namespace) -> int`).
Modules import their heavy dependencies inside the handler, so `infersight --help`
stays fast and works with the base install. A handler reports bad input by raising
`CommandError`; `main` prints it as one line and exits 2, never with a traceback, and so
for a subcommand whose optional extra is not installed (monitor/extras.py).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

from infersight.monitor.extras import MissingExtra, extra_for_module

__all__ = ["CommandError", "main"]

# The modules of subcommands, each with `register(subparsers)`, in the order `--help` lists them.
_COMMAND_MODULES = ("_models", "_data", "_serve", "_releases")


class CommandError(Exception):
    """Bad input or an unmet precondition, explained in one line."""

    def __init__(self, message: str, *, exit_code: int = 2) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="infersight",
        description="Observability and drift monitoring for LLM inference.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in _COMMAND_MODULES:
        importlib.import_module(f"{__name__}.{name}").register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        code = int(args.handler(args))
        sys.stdout.flush()  # here, so that a reader gone away is handled below, not at exit
        return code
    except BrokenPipeError:  # `infersight ... | head -3`: the reader has what it wanted
        return _closed_pipe()
    except CommandError as exc:
        print(f"infersight {args.command}: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except ImportError as exc:
        extra = exc.extra if isinstance(exc, MissingExtra) else extra_for_module(exc.name)
        if extra is None:  # not an optional dependency: a bug, reported below
            return _internal_error(args.command, exc)
        print(f"infersight {args.command} needs the {extra} extra: pip install 'infersight[{extra}]'",
              file=sys.stderr)  # fmt: skip
        return 2
    except KeyboardInterrupt:
        print(f"infersight {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        return _internal_error(args.command, exc)


def _closed_pipe() -> int:
    """Exit quietly as a pipeline's writer does (141: 128 + SIGPIPE). What is still buffered
    goes to /dev/null, so that Python's flush at exit does not report the pipe again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # stdout is not a file (captured in tests)
        pass
    return 141


def _internal_error(command: str, exc: Exception) -> int:
    if os.environ.get("INFERSIGHT_DEBUG"):
        raise exc
    print(
        f"infersight {command}: internal error: {type(exc).__name__}: {exc} "
        "(set INFERSIGHT_DEBUG=1 for the traceback)",
        file=sys.stderr,
    )
    return 70


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
