"""Incident data: export a version's requests as JSONL (prompt, answer, timings, relevance,
novelty and witness flags from the drift reports), and the collections the `collect`
action opens, filled with the next N matching requests by `fill_collections`.

    infersight dataset export --version V [--since T] [--kind drifted|novel|failed|snapshot|collected] OUT.jsonl
    GET /api/v1/dataset?version=V&kind=...&since=...   (bearer token; JSONL)

Text passes through the service's `redact` hook (the SDK's hook: `(str) -> str`; a hook that
fails drops the text) before it leaves the store. The other errors (`InvalidSince`,
`InvalidVersion`, `UnknownKind`) derive from `DatasetError` and stay in `_export`.
"""

from __future__ import annotations

from infersight.monitor.extras import require_extra as _require_extra

_require_extra("infersight.monitor.dataset", "service")  # one line when the extra is missing

from ._export import (
    DatasetError,
    DatasetQuery,
    ExportResult,
    RedactorInvalid,
    export_dataset,
    fill_collections,
    iter_dataset,
    load_redactor,
    parse_since,
)

__all__ = [
    "DatasetError",
    "DatasetQuery",
    "ExportResult",
    "RedactorInvalid",
    "export_dataset",
    "fill_collections",
    "iter_dataset",
    "load_redactor",
    "parse_since",
]
