"""Evidently's embedding drift on the benchmark windows. Runs in its own venv (.bench/evidently).

    .bench/evidently/bin/python benchmarks/drift_baselines/evidently_embeddings.py WINDOWS.npz OUT.json METHOD

METHOD is `model` (its default for EmbeddingsDriftMetric: a classifier's ROC AUC, with a
bootstrap threshold when the reference has under 1000 rows) or `mmd` (MMD² against a
fixed threshold). Detection uses the drift method exactly as EmbeddingsDriftMetric calls
it; `report_seconds` also times the whole metric in a Report (which computes a t-SNE for
its plot) on the first draw only (it takes about a minute).
"""

from __future__ import annotations

import sys
import time
from typing import Any

import numpy as np
import pandas as pd
from evidently.legacy.metrics import EmbeddingsDriftMetric
from evidently.legacy.metrics.data_drift.embedding_drift_methods import mmd, model
from evidently.legacy.pipeline.column_mapping import ColumnMapping
from evidently.legacy.report import Report
from windows import main

METHOD = sys.argv[3] if len(sys.argv) > 3 else "model"
_done = 0


def _frames(ref: np.ndarray, cur: np.ndarray) -> tuple[pd.DataFrame, pd.DataFrame, list[str]]:
    columns = [f"e{i}" for i in range(ref.shape[1])]
    return pd.DataFrame(ref, columns=columns), pd.DataFrame(cur, columns=columns), columns


def run(ref: np.ndarray, cur: np.ndarray) -> dict[str, Any]:
    global _done
    ref_df, cur_df, columns = _frames(ref, cur)
    method = model(bootstrap=ref.shape[0] < 1000) if METHOD == "model" else mmd()
    start = time.perf_counter()
    score, drifted, _ = method(cur_df, ref_df)
    seconds = time.perf_counter() - start
    result: dict[str, Any] = {
        "drift": bool(drifted),
        "p_value": None,
        "distance": float(score),
        "seconds": seconds,
    }
    if _done < 1:
        start = time.perf_counter()
        report = Report(metrics=[EmbeddingsDriftMetric("emb", drift_method=method)])
        report.run(
            reference_data=ref_df,
            current_data=cur_df,
            column_mapping=ColumnMapping(embeddings={"emb": columns}),
        )
        report.as_dict()
        result["report_seconds"] = time.perf_counter() - start
    _done += 1
    return result


if __name__ == "__main__":
    main(run)
