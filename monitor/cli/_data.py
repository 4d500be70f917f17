"""The commands over request texts: `infersight drift` and `infersight dataset` (whose
description is `_DATASET_DOC` below).

`infersight drift REFERENCE CURRENT`: is the current window still like the reference?
Reads .jsonl (`prompt`, optional `response`), .csv (`text` or `prompt` column, optional
`response`) or plain text (one per line); embeds with all-MiniLM-L6-v2 (or `--model DIR`;
`--embedder` picks what runs it, see `default_embedder`)
with a progress bar on stderr; prints the verdict, or one JSON object with `--json`;
`--report FILE.html` writes a self-contained HTML report.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from . import CommandError

if TYPE_CHECKING:
    from infersight.monitor.drift import DriftReport

__all__ = ["register"]


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    _register_drift(sub)
    _register_dataset(sub)


def _register_drift(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "drift",
        help="test whether a window of prompts/responses drifted from a reference",
        description="Semantic drift between two windows of texts (Sentence-BERT embeddings, "
        "MMD and nearest-neighbour novelty tests, Holm-corrected).",
    )
    p.add_argument("reference", help="reference window: .jsonl, .csv or .txt")
    p.add_argument("current", nargs="?", help="current window: .jsonl, .csv or .txt (not with --window-size)")
    p.add_argument(
        "--window-size",
        type=int,
        nargs="+",
        metavar="N",
        help="instead of testing, print for each window size N the smallest share of new-topic texts "
        "this reference detects with 90%% power (choose the window for the share you need to catch)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object (the full report)")
    p.add_argument("--alpha", type=float, default=0.05, help="family-wise false-alarm rate (default 0.05)")
    p.add_argument("--report", metavar="FILE.html", help="write a self-contained HTML report")
    p.add_argument(
        "--model", metavar="DIR", help="a Sentence-BERT model directory (default: all-MiniLM-L6-v2)"
    )
    p.add_argument(
        "--embedder",
        choices=("auto", "onnxruntime", "openvino", "sentence-transformers"),
        default="auto",
        help="what runs the model (default auto, or $INFERSIGHT_EMBED_BACKEND: on a CPU the faster "
        "int8 runtime installed, measured once per machine, else fp32)",
    )
    p.add_argument(
        "--permutations", type=int, default=1000, help="permutations of the MMD test (default 1000)"
    )
    p.add_argument("--seed", type=int, default=0, help="seed of every random choice (default 0)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar while embedding")
    p.add_argument(
        "--fail-on-drift",
        action="store_true",
        help="exit with status 1 when drift is detected (semantic or request lengths)",
    )
    p.set_defaults(handler=_drift)


def _drift(args: argparse.Namespace) -> int:
    from infersight.monitor.drift import (
        DetectorConfig,
        DriftDetector,
        DriftError,
        TestOptions,
        default_embedder,
        length_drift,
        read_lengths,
        read_window,
        render_html,
    )

    if not 0.0 < args.alpha < 1.0:
        raise CommandError(f"--alpha must be between 0 and 1, got {args.alpha}")
    if args.permutations < 1:
        raise CommandError(f"--permutations must be at least 1, got {args.permutations}")
    if args.model is not None and not Path(args.model).is_dir():
        raise CommandError(f"--model {args.model}: not a directory")
    if args.window_size is not None:
        return _plan_windows(args)
    if args.current is None:
        raise CommandError("give a CURRENT window to test, or --window-size N to plan one")
    report_path = Path(args.report) if args.report else None
    if report_path is not None and not report_path.parent.is_dir():
        raise CommandError(f"--report {args.report}: directory {report_path.parent} does not exist")
    try:
        reference = read_window(args.reference, "reference")
        current = read_window(args.current, "current")
        config = DetectorConfig(
            alpha=args.alpha, options=TestOptions(permutations=args.permutations, seed=args.seed)
        )
        embedder = default_embedder(args.model, backend=args.embedder, progress=not args.no_progress)
        report = DriftDetector(embedder, config).score(reference, current)
        lengths = length_drift(
            read_lengths(args.reference, reference.prompts, reference.responses),
            read_lengths(args.current, current.prompts, current.responses),
            alpha=args.alpha,
            min_reference=config.min_reference,
            min_current=config.min_current,
        )
        report = dataclasses.replace(report, lengths=lengths)
    except DriftError as exc:
        raise CommandError(str(exc)) from exc
    if report_path is not None:
        try:
            report_path.write_text(render_html(report), encoding="utf-8")
        except OSError as exc:
            raise CommandError(f"--report {args.report}: {exc.strerror or exc}") from exc
    if args.json:
        print(report.dumps())
    else:
        _print_verdict(report, report_path)
    drifted = report.drifted or (report.lengths is not None and report.lengths.drifted)
    return 1 if (args.fail_on_drift and drifted) else 0


def _plan_windows(args: argparse.Namespace) -> int:
    """`--window-size`: the reference's smallest detectable share at each window size."""
    import json

    from infersight.monitor.drift import (
        DetectorConfig,
        DriftDetector,
        DriftError,
        TestOptions,
        default_embedder,
        read_window,
    )

    if args.current is not None:
        raise CommandError("--window-size plans a window from the reference alone: drop CURRENT")
    bad = [n for n in args.window_size if n < 2]
    if bad:
        raise CommandError(f"--window-size must be at least 2, got {bad[0]}")
    try:
        reference = read_window(args.reference, "reference")
        config = DetectorConfig(
            alpha=args.alpha, options=TestOptions(permutations=args.permutations, seed=args.seed)
        )
        embedder = default_embedder(args.model, backend=args.embedder, progress=not args.no_progress)
        sizes = tuple(args.window_size)
        shares = DriftDetector(embedder, config).detectable_shares(reference, sizes)
    except DriftError as exc:
        raise CommandError(str(exc)) from exc
    if args.json:
        rows = [{"window": n, "detectable_share": s} for n, s in zip(sizes, shares, strict=True)]
        print(json.dumps({"n_reference": len(reference.prompts), "alpha": args.alpha, "windows": rows}))
        return 0
    print(
        f"reference of {len(reference.prompts)} texts, alpha={args.alpha:g}: the smallest share of "
        "new-topic texts (farther from the reference than its own texts are from one another) detected with 90% power"
    )
    for n, share in zip(sizes, shares, strict=True):
        shown = (
            "not detectable at this size"
            if share is None
            else f"{100 * share:.1f}% ({round(share * n)} texts)"
        )
        print(f"  window {n:>6}: {shown}")
    return 0


def _print_verdict(report: DriftReport, report_path: Path | None) -> None:
    out = sys.stdout
    head = "DRIFT" if report.drifted else "no drift"
    print(
        f"{head}: p={report.p_value:.3g} (Holm over {len(report.tests)} tests, alpha={report.threshold:g}), "
        f"effect {report.score:.3g} by {report.method}; {report.n_reference} reference vs "
        f"{report.n_current} current texts",
        file=out,
    )
    if report.detectable_share is not None:
        print(
            f"  detects with 90% power a new topic at {100 * report.detectable_share:.1f}% of this window "
            "or more (texts farther from the reference than its own)",
            file=out,
        )
    for note in report.notes:
        print(f"  note: {note}", file=out)
    for t in report.tests:
        mark = "DRIFT" if t.drifted else "ok"
        print(
            f"  {t.field:<9} {t.test:<15} effect {t.score:<10.3g} (floor {t.effect_floor:g})  "
            f"p={t.p_value:.3g}  adjusted={t.p_adjusted:.3g}  {mark}  [{t.method}]",
            file=out,
        )
    for e in report.explanations:
        n = e.novelty
        print(
            f"{e.field}: novelty rate {100 * n.rate:.1f}% (reference {100 * n.reference_rate:.1f}%)", file=out
        )
        for x in n.examples[:3]:
            print(f"  new: {x.text!r}  (nearest reference: {x.nearest_reference!r})", file=out)
        for w in e.appeared[:3]:
            print(f"  appeared: {w.text!r}", file=out)
        top = e.clusters[0] if e.clusters else None
        if top is not None and top.significant:
            print(
                f"  cluster {top.label!r}: {100 * top.reference_share:.1f}% -> {100 * top.current_share:.1f}%",
                file=out,
            )
    lengths = report.lengths
    if lengths is not None:
        head = "LENGTH DRIFT" if lengths.drifted else "lengths: no drift"
        by = f" by {lengths.decided_by}" if lengths.decided_by else ""
        print(
            f"{head}: p={lengths.p_value:.3g} ({lengths.correction}{by}; in {lengths.counted_by})", file=out
        )
        for s in lengths.summaries:
            if s.n:
                print(f"  {s.field:<7} {s.window:<9} n={s.n:<6} median {s.p50:g}  p95 {s.p95:g}  max {s.max}",
                      file=out)  # fmt: skip
        for note in lengths.notes:
            print(f"  note: {note}", file=out)
    if report_path is not None:
        print(f"report: {report_path}", file=out)


_DATASET_DOC = """`infersight dataset export`: a version's requests as JSONL for a fine-tuning or
validation set (prompt, answer, timestamps, version, relevance, novelty and witness flags).

    infersight dataset export --version mixtral_banking_fp32-v1.1 --kind novel out.jsonl
    infersight dataset export --version V --since 2h --kind collected --config infersight.yaml out.jsonl

Reads the service's database (the config file's, `--data-dir`'s SQLite, `--database-url` or
INFERSIGHT_DATABASE_URL) and applies the config's `redact` hook to every text. No matching
rows: an empty file, a one-line note, exit 0. Bad input: one line, exit 2.
"""


def _register_dataset(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("dataset", help="export incident data (requests of a version) as JSONL",
                       description=_DATASET_DOC, formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    e = actions.add_parser("export", help="write a version's requests as JSONL", description=_DATASET_DOC,
                           formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    e.add_argument("out", type=Path, metavar="OUT.jsonl", help="the file to write (mode 0600)")
    e.add_argument("--version", required=True, help="the model version whose requests to export")
    e.add_argument("--kind", help="drifted, novel, failed, snapshot or collected (default: every request)")
    e.add_argument("--since", help="only requests started since: ISO 8601 time or a duration (90m, 2h, 7d)")
    e.add_argument("--config", type=Path, help="the service's YAML config (database, redact hook)")
    e.add_argument("--data-dir", type=Path, help="the service's data directory (its SQLite database)")
    e.add_argument("--database-url", help="postgresql://... (or sqlite:///...) of the service")
    e.set_defaults(handler=_dataset_export)


def _dataset_export(args: argparse.Namespace) -> int:
    from infersight.monitor.dataset import (
        DatasetError,
        DatasetQuery,
        export_dataset,
        load_redactor,
        parse_since,
    )
    from infersight.monitor.service import ConfigInvalid, load_config
    from infersight.monitor.store import StoreError, connect, current_revision, head_revision, sqlite_url

    try:
        query = DatasetQuery(args.version, args.kind, parse_since(args.since) if args.since else None)
    except DatasetError as exc:
        raise CommandError(f"--{exc.field}: {exc}") from None
    try:
        cfg = load_config(args.config, dict(os.environ))
    except ConfigInvalid as exc:
        raise CommandError(str(exc)) from None
    if args.data_dir is not None:
        cfg = dataclasses.replace(cfg, data_dir=args.data_dir, database_url=None)
    url = args.database_url or cfg.database_url
    if url is None:
        db_file = Path(cfg.data_dir).expanduser().resolve() / "infersight.sqlite"
        if not db_file.is_file():
            raise CommandError(
                f"no infersight database at {db_file} (give --data-dir, --database-url or --config)"
            )
        url = sqlite_url(cfg.data_dir)
    if not args.out.parent.is_dir():
        raise CommandError(f"{args.out}: directory {args.out.parent} does not exist")
    try:
        redact = load_redactor(cfg.redact) if cfg.redact else None
        engine = connect(url)
        try:
            revision = current_revision(engine)
            if revision != head_revision():
                raise CommandError(f"the database is at schema {revision}, not {head_revision()}: "
                                   "start `infersight serve` on it once to migrate")  # fmt: skip
            result = export_dataset(engine, query, args.out, redact=redact)
        finally:
            engine.dispose()
    except DatasetError as exc:
        raise CommandError(str(exc)) from None
    except StoreError as exc:
        raise CommandError(str(exc)) from None
    except OSError as exc:
        raise CommandError(f"{args.out}: {exc.strerror or exc}") from None
    what = f"kind {query.kind}" if query.kind else "with text"
    since = f" since {query.since.isoformat()}" if query.since else ""
    if result.rows == 0:
        print(
            f"note: no requests of {query.version} {what}{since}; wrote an empty {args.out}", file=sys.stderr
        )
        return 0
    dropped = (
        f" ({result.redaction_failed} with text dropped: the redact hook failed)"
        if result.redaction_failed
        else ""
    )
    print(f"wrote {result.rows} requests of {query.version} {what}{since} to {args.out}{dropped}")
    return 0
