"""Alibi Detect's MMDDrift on the benchmark windows. Runs in its own venv (.bench/alibi).

    .bench/alibi/bin/python benchmarks/drift_baselines/alibi_mmd.py WINDOWS.npz OUT.json [PERMUTATIONS]

Alibi's defaults otherwise: PyTorch backend, Gaussian RBF kernel with the bandwidth from
its median heuristic on reference and current together, p-value from permutations of the
pooled kernel matrix.
"""

from __future__ import annotations

import sys
import time
from typing import Any

import numpy as np
from alibi_detect.cd import MMDDrift
from windows import main

PERMUTATIONS = int(sys.argv[3]) if len(sys.argv) > 3 else 100


def run(ref: np.ndarray, cur: np.ndarray) -> dict[str, Any]:
    start = time.perf_counter()
    detector = MMDDrift(ref, backend="pytorch", p_val=0.05, n_permutations=PERMUTATIONS, device="cpu")
    out = detector.predict(cur)["data"]
    seconds = time.perf_counter() - start
    return {
        "drift": bool(out["is_drift"]),
        "p_value": float(out["p_val"]),
        "distance": float(out["distance"]),
        "seconds": seconds,
    }


if __name__ == "__main__":
    import torch

    torch.set_num_threads(2)
    np.random.seed(0)
    main(run)
