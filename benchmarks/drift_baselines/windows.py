"""The window file shared by every side of the drift benchmark (stdlib + numpy only).

`windows.npz` holds `ref_<i>` and `cur_<i>` float32 arrays and `drifted` (the truth per
draw); each baseline reads it and writes one JSON list of
`{"draw": i, "drift": bool, "p_value": float | null, "distance": float | null, "seconds": float}`.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np


def draws(path: str | Path, per_class: int | None = None) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
    """Every draw, or the first `per_class` drifted and the first `per_class` null ones
    (the file holds the drifted draws first, then as many null ones)."""
    data = np.load(path)
    n = int(data["n"])
    for i in range(n):
        if per_class is not None and not (i < per_class or n // 2 <= i < n // 2 + per_class):
            continue
        yield i, data[f"ref_{i}"], data[f"cur_{i}"]


def main(run: Callable[[np.ndarray, np.ndarray], dict[str, Any]]) -> None:
    """argv: WINDOWS.npz OUT.json [method options...]; env DRIFT_DRAWS_PER_CLASS limits the draws."""
    windows, out = sys.argv[1], sys.argv[2]
    limit = os.environ.get("DRIFT_DRAWS_PER_CLASS")
    results = []
    for i, ref, cur in draws(windows, int(limit) if limit else None):
        result = run(ref, cur)
        result["draw"] = i
        results.append(result)
    Path(out).write_text(json.dumps(results))
