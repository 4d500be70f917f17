"""Fold a batch of raw observations into a series' histograms and sketches (numpy)."""

from __future__ import annotations

import numpy as np
from infersight.monitor.records import CANCELLED, CLIENT_ERROR, CLIENT_OUTCOMES, is_server_error

from ._series import MAX_ERROR_TYPES, Pending, Series
from ._window import LATENCY_METRICS

__all__ = ["fold_batch"]

_END, _PROMPT_TOKENS, _OUTPUT_TOKENS, _ERROR = 0, 5, 6, 7


def fold_batch(series: Series, batch: list[Pending], interval_s: float) -> None:
    if not batch:
        return
    cols = list(zip(*batch, strict=True))
    slot_ids = np.floor(np.asarray(cols[_END], dtype=float) / interval_s).astype(np.int64)
    error_col = cols[_ERROR]
    if error_col.count(None) == len(error_col):
        series.windows.fold_counts(slot_ids, np.zeros(len(batch), dtype=bool))
    else:  # only server errors count as errors; what the client caused is counted apart
        is_error = np.array([is_server_error(e) for e in error_col], dtype=bool)
        client_error = np.array([e == CLIENT_ERROR for e in error_col], dtype=bool)
        cancelled = np.array([e == CANCELLED for e in error_col], dtype=bool)
        _count_errors(series.errors, series.client_outcomes, error_col)
        series.windows.fold_counts(slot_ids, is_error, client_error, cancelled)
    for column, metric in enumerate(LATENCY_METRICS, start=1):
        values = np.asarray(cols[column], dtype=float)  # None -> nan
        present = ~np.isnan(values)
        if present.any():
            series.histograms[metric].fold(values[present])
            series.windows.fold_values(metric, slot_ids[present], values[present])
    for column, token_type in ((_PROMPT_TOKENS, "input"), (_OUTPUT_TOKENS, "output")):
        values = np.asarray(cols[column], dtype=float)
        present = ~np.isnan(values)
        if present.any():
            series.tokens[token_type].fold(values[present])


def _count_errors(errors: dict[str, int], client: dict[str, int], column: tuple[str | None, ...]) -> None:
    for error_type in column:
        if error_type is None:
            continue
        if error_type in CLIENT_OUTCOMES:
            client[error_type] = client.get(error_type, 0) + 1
            continue
        if error_type not in errors and len(errors) >= MAX_ERROR_TYPES:
            error_type = "other"
        errors[error_type] = errors.get(error_type, 0) + 1
