"""The window file shared by every side of the drift benchmark (stdlib + numpy only).

`windows.npz` holds `ref_<i>` and `cur_<i>` float32 arrays and `drifted` (the truth per
draw); each baseline reads it and writes one JSON list of
`{"draw": i, "drift": bool, "p_value": float | null, "distance": float | null, "seconds": float}`.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np


def draws(path: str | Path) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
    data = np.load(path)
    n = int(data["n"])
    for i in range(n):
        yield i, data[f"ref_{i}"], data[f"cur_{i}"]


def main(run: Callable[[np.ndarray, np.ndarray], dict[str, Any]]) -> None:
    windows, out = sys.argv[1], sys.argv[2]
    results = []
    for i, ref, cur in draws(windows):
        result = run(ref, cur)
        result["draw"] = i
        results.append(result)
    Path(out).write_text(json.dumps(results))
