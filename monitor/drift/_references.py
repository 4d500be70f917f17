"""Reference windows in the store: named, versioned, tied to a model version.

A reference is built from a file (`read_window`), from a time range of recorded traffic
(`traffic_window`) or from the first N requests after a deploy (`first_requests_after`),
then saved with `save_reference`; each save of a name adds version n+1. Functions take an
`Engine` (one transaction each) or a `Connection` (the caller's transaction).
"""

from __future__ import annotations

import datetime as dt
import hashlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
from infersight.monitor.store.tables import by_start, requests, started_in
from sqlalchemy import Connection, Engine, func, insert, select
from sqlalchemy.exc import IntegrityError

from ..store.tables import drift_reference_lengths, drift_reference_texts, drift_references
from ._lengths import RequestLengths
from ._windows import EmbeddedWindow, TextWindow
from .errors import ReferenceNotFound

_CANCELLED = "cancelled"  # the error_type of a request whose client hung up (monitor.records.CANCELLED)

__all__ = [
    "ReferenceInfo",
    "StoredReference",
    "first_requests_after",
    "list_references",
    "load_reference",
    "save_reference",
    "traffic_lengths",
    "traffic_window",
]


@dataclass(frozen=True)
class ReferenceInfo:
    id: int
    name: str
    version: int
    model_version: str
    source: str  # file, traffic, deploy
    source_detail: str | None
    created_at: dt.datetime
    embedder: str | None
    n_texts: int
    n_responses: int
    fingerprint: str

    def to_json(self) -> dict[str, object]:
        return {
            "id": self.id,
            "name": self.name,
            "version": self.version,
            "model_version": self.model_version,
            "source": self.source,
            "source_detail": self.source_detail,
            "created_at": self.created_at.isoformat(),
            "embedder": self.embedder,
            "n_texts": self.n_texts,
            "n_responses": self.n_responses,
        }


@dataclass(frozen=True, eq=False)
class StoredReference:
    info: ReferenceInfo
    window: TextWindow
    embedded: EmbeddedWindow | None  # None when no embeddings were stored
    lengths: RequestLengths | None = None  # token lengths of its requests; None when none were stored


@contextmanager
def _tx(bind: Engine | Connection) -> Iterator[Connection]:
    if isinstance(bind, Connection):
        yield bind
    else:
        with bind.begin() as conn:
            yield conn


def _fingerprint(window: TextWindow) -> str:
    h = hashlib.sha256()
    for i, prompt in enumerate(window.prompts):
        response = window.responses[i] if window.responses else None
        h.update(prompt.encode("utf-8", "surrogatepass") + b"\x00")
        h.update((response or "").encode("utf-8", "surrogatepass") + b"\x01")
    return h.hexdigest()


def save_reference(
    bind: Engine | Connection,
    name: str,
    window: TextWindow,
    *,
    model_version: str,
    source: str,
    source_detail: str | None = None,
    embedded: EmbeddedWindow | None = None,
    embedder: str | None = None,
    lengths: RequestLengths | None = None,
    now: dt.datetime | None = None,
) -> ReferenceInfo:
    """Store `window` as the next version of `name` (embeddings too when `embedded` is given,
    and the token lengths of its requests when `lengths` counted tokens)."""
    if not name.strip():
        raise ValueError("a reference needs a name")
    if source not in ("file", "traffic", "deploy"):
        raise ValueError(f"unknown reference source {source!r}: expected file, traffic or deploy")
    if embedded is not None and len(embedded.prompts) != len(window.prompts):
        raise ValueError("embedded window does not match the texts")
    created = now or dt.datetime.now(dt.UTC)
    responses = window.responses or (None,) * len(window.prompts)
    response_rows = _response_rows(embedded, responses)
    for attempt in range(3):
        try:
            with _tx(bind) as conn:
                version = (
                    conn.execute(
                        select(func.max(drift_references.c.version)).where(drift_references.c.name == name)
                    ).scalar_one_or_none()
                    or 0
                ) + 1
                inserted = conn.execute(
                    insert(drift_references).values(
                        name=name,
                        version=version,
                        model_version=model_version,
                        source=source,
                        source_detail=source_detail,
                        created_at=created,
                        embedder=embedder if embedded is not None else None,
                        dimension=int(embedded.prompt_embeddings.shape[1]) if embedded is not None else None,
                        n_texts=len(window.prompts),
                        n_responses=sum(r is not None for r in responses),
                        fingerprint=_fingerprint(window),
                    )
                )
                ref_id = int(inserted.inserted_primary_key[0])  # type: ignore[index]
                rows = [
                    {
                        "reference_id": ref_id,
                        "position": i,
                        "prompt": prompt,
                        "response": responses[i],
                        "prompt_embedding": _blob(embedded.prompt_embeddings[i])
                        if embedded is not None
                        else None,
                        "response_embedding": response_rows.get(i),
                    }
                    for i, prompt in enumerate(window.prompts)
                ]
                conn.execute(insert(drift_reference_texts), rows)
                length_rows = _length_rows(ref_id, lengths)
                if length_rows:
                    conn.execute(insert(drift_reference_lengths), length_rows)
            break
        except IntegrityError:
            if isinstance(bind, Connection) or attempt == 2:
                raise  # a concurrent save took the same version: retried twice on an engine
    return _info_by_id(bind, int(ref_id))


def _length_rows(ref_id: int, lengths: RequestLengths | None) -> list[dict[str, Any]]:
    """One row per position; prompt and output counts are independent samples, paired by position."""
    if lengths is None or lengths.counted_by != "tokens":
        return []
    p, o = lengths.prompt_tokens, lengths.output_tokens
    return [
        {
            "reference_id": ref_id,
            "position": i,
            "prompt_tokens": int(p[i]) if i < p.size else None,
            "output_tokens": int(o[i]) if i < o.size else None,
        }
        for i in range(max(p.size, o.size))
    ]


def _response_rows(embedded: EmbeddedWindow | None, responses: tuple[str | None, ...]) -> dict[int, bytes]:
    if embedded is None:
        return {}
    positions = [i for i, r in enumerate(responses) if r is not None]
    return {i: _blob(embedded.response_embeddings[j]) for j, i in enumerate(positions)}


def _blob(row: np.ndarray) -> bytes:
    return np.asarray(row, dtype="<f4").tobytes()


def _info(row: object) -> ReferenceInfo:
    m = row._mapping  # type: ignore[attr-defined]
    return ReferenceInfo(
        id=m["id"],
        name=m["name"],
        version=m["version"],
        model_version=m["model_version"],
        source=m["source"],
        source_detail=m["source_detail"],
        created_at=m["created_at"],
        embedder=m["embedder"],
        n_texts=m["n_texts"],
        n_responses=m["n_responses"],
        fingerprint=m["fingerprint"],
    )


def _info_by_id(bind: Engine | Connection, ref_id: int) -> ReferenceInfo:
    with _tx(bind) as conn:
        row = conn.execute(select(drift_references).where(drift_references.c.id == ref_id)).one()
    return _info(row)


def list_references(
    bind: Engine | Connection, *, model_version: str | None = None
) -> tuple[ReferenceInfo, ...]:
    """Every stored reference version, newest first."""
    query = select(drift_references).order_by(
        drift_references.c.created_at.desc(), drift_references.c.id.desc()
    )
    if model_version is not None:
        query = query.where(drift_references.c.model_version == model_version)
    with _tx(bind) as conn:
        return tuple(_info(r) for r in conn.execute(query))


def load_reference(
    bind: Engine | Connection,
    name: str | None = None,
    *,
    version: int | None = None,
    model_version: str | None = None,
    embedder: str | None = None,
) -> StoredReference:
    """The newest version of `name` (or exactly `version`), optionally restricted to a model
    version; `name=None` takes the newest reference of `model_version`. Stored embeddings
    come back only when they were made by `embedder` (or when `embedder` is None)."""
    query = select(drift_references).order_by(drift_references.c.version.desc(), drift_references.c.id.desc())
    if name is not None:
        query = query.where(drift_references.c.name == name)
    if version is not None:
        query = query.where(drift_references.c.version == version)
    if model_version is not None:
        query = query.where(drift_references.c.model_version == model_version)
    if name is None and model_version is None:
        raise ValueError("load_reference needs a name or a model_version")
    with _tx(bind) as conn:
        row = conn.execute(query.limit(1)).first()
        if row is None:
            what = " ".join(
                part
                for part in (
                    f"named {name!r}" if name else "",
                    f"version {version}" if version is not None else "",
                    f"for model version {model_version!r}" if model_version else "",
                )
                if part
            )
            raise ReferenceNotFound(what)
        info = _info(row)
        texts = conn.execute(
            select(drift_reference_texts)
            .where(drift_reference_texts.c.reference_id == info.id)
            .order_by(drift_reference_texts.c.position)
        ).all()
        counts = conn.execute(
            select(drift_reference_lengths.c.prompt_tokens, drift_reference_lengths.c.output_tokens)
            .where(drift_reference_lengths.c.reference_id == info.id)
            .order_by(drift_reference_lengths.c.position)
        ).all()
    lengths = (
        RequestLengths.of([c.prompt_tokens for c in counts], [c.output_tokens for c in counts], "tokens")
        if counts
        else None
    )
    prompts = tuple(t.prompt for t in texts)
    responses = tuple(t.response for t in texts)
    window = TextWindow(
        prompts, responses if any(r is not None for r in responses) else (), f"{info.name} v{info.version}"
    )
    embedded = None
    usable = info.embedder is not None and (embedder is None or embedder == info.embedder)
    if usable and texts and all(t.prompt_embedding is not None for t in texts):
        pe = np.stack([np.frombuffer(t.prompt_embedding, dtype="<f4") for t in texts]).astype(np.float32)
        with_resp = [t for t in texts if t.response is not None and t.response_embedding is not None]
        if with_resp:
            re = np.stack([np.frombuffer(t.response_embedding, dtype="<f4") for t in with_resp]).astype(
                np.float32
            )
            rows = [
                i for i, t in enumerate(texts) if t.response is not None and t.response_embedding is not None
            ]
            rel = np.einsum("ij,ij->i", pe[rows], re).astype(np.float32)
        else:
            re = np.zeros((0, pe.shape[1]), np.float32)
            rel = np.zeros(0, np.float32)
        embedded = EmbeddedWindow(prompts, pe, tuple(t.response for t in with_resp), re, rel)
    return StoredReference(info, window, embedded, lengths)


def traffic_window(
    bind: Engine | Connection,
    *,
    model_version: str | None,
    since: dt.datetime,
    until: dt.datetime,
    limit: int | None = None,
    model: str | None = None,
) -> TextWindow:
    """Sampled requests with a prompt whose `started_at` is in `[since, until)`, oldest first
    (the newest `limit` of them when `limit` is given)."""
    r = requests.c
    query = select(r.prompt, r.response, r.started_at, r.id).where(
        r.prompt.is_not(None), *started_in(since, until)
    )
    if model_version is not None:
        query = query.where(r.model_version == model_version)
    if model is not None:
        query = query.where(r.model == model)
    if limit is not None:
        query = query.order_by(*by_start(newest_first=True)).limit(limit)
    with _tx(bind) as conn:
        rows = list(conn.execute(query))
    rows.sort(key=lambda row: (row.started_at, row.id))
    source = f"requests {since.isoformat()} .. {until.isoformat()}"
    return _window(rows, source)


def traffic_lengths(
    bind: Engine | Connection,
    *,
    model_version: str,
    since: dt.datetime,
    until: dt.datetime,
    limit: int = 20_000,
    model: str | None = None,
) -> RequestLengths:
    """Token lengths of every recorded request of `model_version` that started in
    `[since, until)` (the newest `limit`), sampled text or not. The answer of a request whose
    client hung up (`cancelled`) was cut short by the client: its prompt counts, its output not."""
    r = requests.c
    query = (
        select(r.prompt_tokens, r.output_tokens, r.error_type)
        .where(
            r.model_version == model_version,
            *started_in(since, until),
            (r.prompt_tokens.is_not(None)) | (r.output_tokens.is_not(None)),
        )
        .order_by(*by_start(newest_first=True))
        .limit(limit)
    )
    if model is not None:
        query = query.where(r.model == model)
    with _tx(bind) as conn:
        rows = list(conn.execute(query))
    outputs = [None if row.error_type == _CANCELLED else row.output_tokens for row in rows]
    return RequestLengths.of([row.prompt_tokens for row in rows], outputs, "tokens")


def first_requests_after(
    bind: Engine | Connection, *, model_version: str, after: dt.datetime, n: int
) -> TextWindow:
    """The first `n` sampled requests (with a prompt) of `model_version` from `after` on."""
    r = requests.c
    query = (
        select(r.prompt, r.response, r.started_at, r.id)
        .where(r.prompt.is_not(None), r.model_version == model_version, *started_in(after))
        .order_by(*by_start())
        .limit(n)
    )
    with _tx(bind) as conn:
        rows = list(conn.execute(query))
    return _window(rows, f"first {n} requests of {model_version} after {after.isoformat()}")


def _window(rows: list[Any], source: str) -> TextWindow:
    prompts = [row.prompt for row in rows if row.prompt and row.prompt.strip()]
    responses = [row.response for row in rows if row.prompt and row.prompt.strip()]
    has_any = any(r is not None for r in responses)
    return TextWindow(tuple(prompts), tuple(responses) if has_any else (), source)
