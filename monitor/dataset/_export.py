"""Export a version's requests as JSONL, one object a line, ready for a fine-tuning or
validation set: the prompt and the answer (also as chat `messages`, after the system prompt a
recorded chat had, through the same `redact` hook), timestamps, version,
relevance, and what the drift reports said of the text (novel, witness, in a drifted window).

Kinds (None: every request of the version that kept its text):
- `drifted`: requests inside the window of a drift report that found drift;
- `novel`: requests whose prompt or answer a drift report listed as novel;
- `failed`: requests that ended in an error;
- `snapshot`: requests kept in an inference snapshot of the version;
- `collected`: requests kept by the `collect` action (copied, so they outlive retention).

And filling the collections the `collect` action opens: each keeps (copies into
`dataset_items`) the next `n` requests with text that started at or after it was opened
and match its kind. Run by the service's leader on the sample interval, and by an export of
kind `collected` before it reads. Idempotent: an item is keyed by (collection, request), so
two fills never keep a request twice, and a full collection is closed (`done_at`).

The errors of the export and of collection:

    DatasetError
    ├── UnknownKind          (.kind)   --kind is not one of KINDS
    ├── InvalidSince         (.value)  --since is neither ISO 8601 nor a duration such as 2h
    ├── InvalidVersion       (.value)  an empty or over-long version name
    └── RedactorInvalid      (.spec)   the configured `redact` hook cannot be imported or called

Each is also a `ValueError`: bad input, reported in one line (CLI exit 2, HTTP 422 naming
the field).
"""

from __future__ import annotations

import datetime as dt
import importlib
import json
import os
import re
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from infersight.monitor.sdk._config import prepare_text
from infersight.monitor.store.tables import (
    by_start,
    dataset_collections,
    dataset_items,
    drift_reports,
    requests,
    snapshots,
    started_in,
)
from sqlalchemy import Engine, and_, func, insert, or_, select, true, update
from sqlalchemy.exc import IntegrityError

__all__ = [
    "KINDS",
    "DatasetError",
    "DatasetQuery",
    "ExportResult",
    "InvalidSince",
    "InvalidVersion",
    "Redactor",
    "RedactorInvalid",
    "UnknownKind",
    "export_dataset",
    "fill_collections",
    "iter_dataset",
    "load_redactor",
    "parse_since",
]


class DatasetError(ValueError):
    field = "dataset"


class UnknownKind(DatasetError):
    field = "kind"

    def __init__(self, kind: str, valid: tuple[str, ...]) -> None:
        super().__init__(f"unknown kind {kind!r}; valid kinds: {', '.join(valid)}")
        self.kind = kind


class InvalidSince(DatasetError):
    field = "since"

    def __init__(self, value: str) -> None:
        super().__init__(
            f"since {value!r} is neither an ISO 8601 time (2026-12-01T10:00:00Z) nor a duration (90m, 2h, 7d)"
        )
        self.value = value


class InvalidVersion(DatasetError):
    field = "version"

    def __init__(self, value: str) -> None:
        super().__init__(f"version {value!r} must be 1 to 256 characters")
        self.value = value


class RedactorInvalid(DatasetError):
    field = "redact"

    def __init__(self, spec: str, reason: str) -> None:
        super().__init__(f"redact hook {spec!r}: {reason}")
        self.spec = spec


_COPIED = ("request_id", "model", "model_version", "started_at", "duration_s", "ttft_s", "prompt_tokens",
           "output_tokens", "error_type", "prompt", "response", "relevance", "system_prompt")  # fmt: skip


def fill_collections(engine: Engine, *, now: dt.datetime | None = None) -> int:
    """Copy what each open collection still lacks; the number of requests kept."""
    now = now or dt.datetime.now(dt.UTC)
    with engine.connect() as conn:
        open_ = conn.execute(select(dataset_collections).where(dataset_collections.c.done_at.is_(None))).all()
    return sum(_fill_one(engine, c, now) for c in open_)


def _fill_one(engine: Engine, c: Any, now: dt.datetime) -> int:
    cid: str = c.collection_id
    kept = select(dataset_items.c.request_id).where(dataset_items.c.collection_id == cid).scalar_subquery()
    cond = [
        *started_in(c.created_at),
        requests.c.prompt.is_not(None),
        requests.c.request_id.not_in(kept),
    ]
    kind = c.kind
    if kind == "version":
        cond.append(requests.c.model_version == c.model_version)
    elif kind == "failed":
        cond.append(requests.c.error_type.is_not(None))
    try:
        with engine.begin() as conn:
            have = conn.execute(
                select(func.count()).select_from(dataset_items).where(dataset_items.c.collection_id == cid)
            ).scalar_one()
            want = int(c.n) - int(have)
            rows = []
            if want > 0:
                q = select(*(requests.c[k] for k in _COPIED)).where(*cond).order_by(*by_start()).limit(want)
                rows = [{**r._asdict(), "collection_id": cid} for r in conn.execute(q)]
            if rows:
                conn.execute(insert(dataset_items), rows)
            total = int(have) + len(rows)
            conn.execute(
                update(dataset_collections)
                .where(dataset_collections.c.collection_id == cid)
                .values(collected=total, done_at=now if total >= int(c.n) else None)
            )
    except IntegrityError:  # a concurrent fill kept the same request first: the next fill goes on
        return 0
    return len(rows)


KINDS = ("drifted", "novel", "failed", "snapshot", "collected")
Redactor = Callable[[str], str]
_UNLIMITED = 1 << 62  # the export keeps whole texts: only the redact hook applies
_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")
_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_since(value: str, *, now: dt.datetime | None = None) -> dt.datetime:
    """An ISO 8601 time (naive means UTC) or a duration back from `now` (`90m`, `2h`, `7d`)."""
    text = value.strip()
    m = _DURATION.fullmatch(text)
    if m:
        now = now or dt.datetime.now(dt.UTC)
        try:  # `99999999999d` reaches past year 1: a bad value, not a server error
            return now - dt.timedelta(seconds=float(m.group(1)) * _SECONDS[m.group(2)])
        except (OverflowError, ValueError):
            raise InvalidSince(value) from None
    try:
        t = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise InvalidSince(value) from None
    try:  # 0001-01-01T00:00:00+01:00 has no UTC time
        return t.replace(tzinfo=dt.UTC) if t.tzinfo is None else t.astimezone(dt.UTC)
    except OverflowError:
        raise InvalidSince(value) from None


def load_redactor(spec: str) -> Redactor:
    """The hook named `package.module:function` (the SDK's `redact`: `(str) -> str`)."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise RedactorInvalid(spec, "must be 'package.module:function'")
    try:
        obj: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as exc:
        raise RedactorInvalid(spec, f"{type(exc).__name__}: {exc}") from exc
    if not callable(obj):
        raise RedactorInvalid(spec, "is not callable")
    hook: Redactor = obj
    return hook


@dataclass(frozen=True)
class DatasetQuery:
    version: str
    kind: str | None = None  # None: every request of the version with its text
    since: dt.datetime | None = None

    def __post_init__(self) -> None:
        if not 0 < len(self.version) <= 256:
            raise InvalidVersion(self.version)
        if self.kind is not None and self.kind not in KINDS:
            raise UnknownKind(self.kind, KINDS)


@dataclass(frozen=True)
class ExportResult:
    path: Path
    rows: int
    redaction_failed: int  # texts the redact hook refused (dropped, never written unredacted)
    query: DatasetQuery = field(repr=False)


@dataclass
class _DriftMarks:
    """What the version's drift reports said: drifted windows, novel and witness texts."""

    windows: list[tuple[dt.datetime | None, dt.datetime | None]] = field(default_factory=list)
    novelty: dict[str, float] = field(default_factory=dict)  # text -> distance to the reference
    witness: set[str] = field(default_factory=set)  # texts with the highest witness ("appeared")

    def in_drifted_window(self, t: dt.datetime) -> bool:
        return any((a is None or a <= t) and (b is None or t <= b) for a, b in self.windows)


def _time(value: Any) -> dt.datetime | None:
    if not value:
        return None
    t = dt.datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    return t.replace(tzinfo=dt.UTC) if t.tzinfo is None else t


def _aware(t: dt.datetime) -> dt.datetime:
    return t.replace(tzinfo=dt.UTC) if t.tzinfo is None else t


def _drift_marks(engine: Engine, version: str, since: dt.datetime | None) -> _DriftMarks:
    marks = _DriftMarks()
    q = select(drift_reports.c.drifted, drift_reports.c.content).where(
        drift_reports.c.model_version == version
    )
    if since is not None:  # a report made before `since` is about earlier requests
        q = q.where(drift_reports.c.created_at >= since)
    with engine.connect() as conn:
        rows = conn.execute(q).all()
    for row in rows:
        content = json.loads(row.content)
        if row.drifted:
            window = content.get("window") or {}
            marks.windows.append((_time(window.get("since")), _time(window.get("until"))))
        for expl in (content.get("explanation") or {}).values():
            if not expl:
                continue
            for ex in (expl.get("novelty") or {}).get("examples") or ():
                text = ex.get("text")
                if isinstance(text, str):
                    marks.novelty[text] = max(float(ex.get("distance") or 0.0), marks.novelty.get(text, 0.0))
            marks.witness.update(
                a["text"] for a in expl.get("appeared") or () if isinstance(a.get("text"), str)
            )
    return marks


def _snapshot_request_ids(engine: Engine, version: str) -> set[str]:
    with engine.connect() as conn:
        rows = conn.execute(select(snapshots.c.content).where(snapshots.c.model_version == version)).all()
    return {str(r["request_id"]) for row in rows for r in json.loads(row.content).get("requests") or ()}


def _rows(engine: Engine, query: DatasetQuery, marks: _DriftMarks) -> Iterator[Any]:
    table = dataset_items if query.kind == "collected" else requests
    cond = [table.c.model_version == query.version, table.c.prompt.is_not(None)]
    if query.since is not None:
        cond += [table.c.started_at >= query.since] if table is dataset_items else started_in(query.since)
    if query.kind == "failed":
        cond.append(table.c.error_type.is_not(None))
    elif query.kind == "drifted":
        if not marks.windows:
            return
        windows = []
        for a, b in marks.windows:
            if table is dataset_items:
                bounds = [table.c.started_at >= a] if a is not None else []
                bounds += [table.c.started_at <= b] if b is not None else []
            else:
                bounds = started_in(a, b, until_inclusive=True)
            windows.append(and_(*bounds) if bounds else true())
        cond.append(or_(*windows))
    elif query.kind == "novel":
        texts = list(marks.novelty)
        if not texts:
            return
        cond.append(or_(table.c.prompt.in_(texts), table.c.response.in_(texts)))
    order = (table.c.started_at,) if table is dataset_items else (table.c.started_bucket, table.c.started_at)
    q = select(table).where(*cond).order_by(*order, table.c.request_id)
    with engine.connect() as conn:
        yield from conn.execution_options(yield_per=500).execute(q)


def iter_dataset(
    engine: Engine, query: DatasetQuery, *, redact: Redactor | None = None
) -> Iterator[dict[str, Any]]:
    """The export's objects in time order. A text the hook fails on is dropped (None), and
    the object says `"redaction_failed": true`; a prompt so dropped drops the object's text."""
    if query.kind == "collected":
        fill_collections(engine)  # what arrived since the service's last fill
    marks = _drift_marks(engine, query.version, query.since)
    in_snapshot = _snapshot_request_ids(engine, query.version)
    for r in _rows(engine, query, marks):
        if query.kind == "snapshot" and r.request_id not in in_snapshot:
            continue
        started = _aware(r.started_at)
        novelty = max(marks.novelty.get(r.prompt, 0.0), marks.novelty.get(r.response or "", 0.0))
        prompt, why_p = prepare_text(
            r.prompt, max_text_chars=_UNLIMITED, max_payload_chars=_UNLIMITED, redact=redact
        )
        answer, why_a = (None, None) if r.response is None else prepare_text(
            r.response, max_text_chars=_UNLIMITED, max_payload_chars=_UNLIMITED, redact=redact
        )  # fmt: skip
        system, why_s = (None, None) if r.system_prompt is None else prepare_text(
            r.system_prompt, max_text_chars=_UNLIMITED, max_payload_chars=_UNLIMITED, redact=redact
        )  # fmt: skip
        failed = "redaction_failed" in (why_p, why_a, why_s)
        messages = None
        if prompt is not None and answer is not None:
            messages = [{"role": "user", "content": prompt}, {"role": "assistant", "content": answer}]
            if system is not None:
                messages.insert(0, {"role": "system", "content": system})
        yield {
            "request_id": r.request_id,
            "model": r.model,
            "model_version": r.model_version,
            "started_at": started.isoformat().replace("+00:00", "Z"),
            "finished_at": (started + dt.timedelta(seconds=r.duration_s)).isoformat().replace("+00:00", "Z"),
            "duration_s": r.duration_s,
            "ttft_s": r.ttft_s,
            "prompt_tokens": r.prompt_tokens,
            "output_tokens": r.output_tokens,
            "error_type": r.error_type,
            "system_prompt": None if prompt is None else system,  # a chat's system messages
            "prompt": prompt,
            "answer": None if prompt is None else answer,
            "messages": messages,
            "relevance": r.relevance,
            "novel": r.prompt in marks.novelty or (r.response or "") in marks.novelty,
            "novelty": novelty if novelty > 0 else None,
            "witness": r.prompt in marks.witness or (r.response or "") in marks.witness,
            "drifted_window": marks.in_drifted_window(started),
            "in_snapshot": r.request_id in in_snapshot,
            "redaction_failed": failed,
        }


def export_dataset(
    engine: Engine, query: DatasetQuery, out: str | Path, *, redact: Redactor | None = None
) -> ExportResult:
    """Write `out` (JSONL, mode 0600: it holds user text) atomically; no rows: an empty file."""
    path = Path(out)
    rows = failed = 0
    # a new name beside the target, created O_EXCL|O_NOFOLLOW with mode 0600 (mkstemp): a
    # symlink or an open file planted at a fixed `OUT.tmp` can neither redirect nor expose it
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    tmp = Path(name)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            for obj in iter_dataset(engine, query, redact=redact):
                f.write(json.dumps(obj, ensure_ascii=False) + "\n")
                rows += 1
                failed += obj["redaction_failed"]
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    return ExportResult(path, rows, failed, query)
