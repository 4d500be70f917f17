"""`infersight models quantize`: an int4 build of a registered version, registered as a new one.

    infersight models quantize REGISTRY SRC NAME --method gptq --calibration FILE.jsonl
                               [--group-size 64|32] [--samples N] [--act-order] [--head int8|int4]
    infersight models quantize REGISTRY SRC NAME --method rtn [--group-size 64|32] [--head int8|int4]

SRC is a registered version, NAME the new one (its quant must be int4; SRC is recorded as its
parent). The calibration file is JSONL with a `prompt` (and optional `response`) per line: the
output of `infersight dataset export` is one, so an incident's collected traffic calibrates the
next build. Every input is checked before the model is read; on any error nothing is
registered and the partial build is removed.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from . import CommandError

__all__ = ["register_quantize"]


def register_quantize(actions: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    q = actions.add_parser(
        "quantize",
        help="build an int4 version of a registered one (GPTQ calibrated on a JSONL file, or RTN) and register it",
    )
    q.add_argument("directory", metavar="REGISTRY", help="registry directory")
    q.add_argument("source", metavar="SRC", help="the registered version to quantize")
    q.add_argument(
        "name", metavar="NAME", help="the new version, e.g. mixtral_banking_int4-v1.1 (quant int4)"
    )
    q.add_argument("--method", default="gptq", help="gptq (calibrated) or rtn (round to nearest)")
    q.add_argument(
        "--calibration", type=Path, metavar="FILE", help="JSONL with a 'prompt' field per line (gptq)"
    )
    q.add_argument("--group-size", type=int, default=64, help="int4 group size: 64 (default) or 32")
    q.add_argument("--samples", type=int, default=128, help="calibration texts to use (default 128)")
    q.add_argument("--max-tokens", type=int, default=256, help="tokens per calibration text (default 256)")
    q.add_argument(
        "--act-order", action="store_true", help="GPTQ: quantize columns by decreasing input energy"
    )
    q.add_argument("--head", default="int8", help="the output head's precision: int8 (default) or int4")
    q.set_defaults(handler=_quantize)


def _quantize(args: argparse.Namespace) -> int:
    from infersight.engine.calibrate import METHODS, calibration_texts, quantize_checkpoint
    from infersight.engine.errors import EngineError
    from infersight.engine.registry import Registry, VersionName

    try:
        if args.method not in METHODS:
            raise CommandError(f"unknown method {args.method!r}; choose one of {', '.join(METHODS)}")
        if VersionName.parse(args.name).quant != "int4":
            raise CommandError(f"{args.name}: a quantized build's name has quant int4")
        if args.samples < 1 or args.max_tokens < 1:
            raise CommandError("--samples and --max-tokens must be at least 1")
        registry = Registry(args.directory)
        source = registry.get(args.source)
        if args.name in registry:
            raise CommandError(f"version {args.name!r} is already registered")
        texts: list[str] = []
        if args.method == "gptq":
            if args.calibration is None:
                raise CommandError("--method gptq needs --calibration FILE.jsonl")
            texts = calibration_texts(args.calibration, limit=args.samples)
        work = Path(tempfile.mkdtemp(prefix=".quantize-", dir=registry.root))
        try:
            report = quantize_checkpoint(
                source.path,
                work / "checkpoint",
                method=args.method,
                texts=texts,
                group_size=args.group_size,
                head=args.head,
                act_order=args.act_order,
                max_tokens=args.max_tokens,
                source_version=source.name,
                progress=_progress_bar(),
            )
            info = registry.register(
                args.name, report.directory, quantize="int4", parent=source.name, copy=True
            )
        finally:
            shutil.rmtree(work, ignore_errors=True)
    except (EngineError, OSError) as exc:
        raise CommandError(str(exc)) from exc
    r = report.record
    extra = (
        f", {r.samples} texts / {r.tokens} tokens, {r.rtn_experts} expert(s) rounded to nearest"
        if r.method == "gptq"
        else ""
    )
    print(
        f"registered {info.name} (int4 {r.method}, groups of {r.group_size}, head {r.head}{extra}) "
        f"from {source.name}, sha256 {info.sha256[:12]}"
    )
    return 0


def _progress_bar() -> Callable[[int, int], None] | None:
    """A tqdm bar over the layers on a terminal; nothing elsewhere."""
    if not sys.stderr.isatty():
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    bar = tqdm(total=None, unit="layer", desc="quantize")

    def step(done: int, total: int) -> None:
        bar.total = total
        bar.n = done
        bar.refresh()
        if done >= total:
            bar.close()

    return step
