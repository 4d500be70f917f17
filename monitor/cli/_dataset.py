"""`infersight dataset export`: a version's requests as JSONL for a fine-tuning or
validation set (prompt, answer, timestamps, version, relevance, novelty and witness flags).

    infersight dataset export --version mixtral_banking_fp32-v1.1 --kind novel out.jsonl
    infersight dataset export --version V --since 2h --kind collected --config infersight.yaml out.jsonl

Reads the service's database (the config file's, `--data-dir`'s SQLite, `--database-url` or
INFERSIGHT_DATABASE_URL) and applies the config's `redact` hook to every text. No matching
rows: an empty file, a one-line note, exit 0. Bad input: one line, exit 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from pathlib import Path

from ._errors import CommandError

__all__ = ["register"]


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("dataset", help="export incident data (requests of a version) as JSONL",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    e = actions.add_parser("export", help="write a version's requests as JSONL", description=__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    e.add_argument("out", type=Path, metavar="OUT.jsonl", help="the file to write (mode 0600)")
    e.add_argument("--version", required=True, help="the model version whose requests to export")
    e.add_argument("--kind", help="drifted, novel, failed, snapshot or collected (default: every request)")
    e.add_argument("--since", help="only requests started since: ISO 8601 time or a duration (90m, 2h, 7d)")
    e.add_argument("--config", type=Path, help="the service's YAML config (database, redact hook)")
    e.add_argument("--data-dir", type=Path, help="the service's data directory (its SQLite database)")
    e.add_argument("--database-url", help="postgresql://... (or sqlite:///...) of the service")
    e.set_defaults(handler=_export)


def _export(args: argparse.Namespace) -> int:
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
