"""Micro-benchmark: the CPU lm head's candidate kernels at decode row counts.

The engine's eager CPU head (engine/projection.py, `head_projection`) runs MKL on a
column-major copy of the weight for one row and a oneDNN-blocked copy from 2 rows on; this
times the three candidates: MKL on the stored row-major [V, D] weight, MKL on the
column-major copy, and oneDNN's blocked layout (engine/projection.py). Timed in CPU time of the
calling thread, minimum of `--repeats`.

    .venv/bin/python benchmarks/engine_head_layout.py [--vocab 32000 --hidden 512 --threads 1]
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from infersight.engine import projection as projections


def fastest(fn: Callable[[], object], repeats: int) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        start = time.thread_time()
        fn()
        best = min(best, time.thread_time() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    from infersight.engine.native import cpu_model

    print(f"CPU: {cpu_model()}; {os.cpu_count()} logical CPUs", flush=True)
    torch.set_num_threads(args.threads)
    row_major = torch.randn(args.vocab, args.hidden) * 0.02
    column_major = row_major.t().contiguous().t()  # same [V, D] values, strides (1, V)
    blocked = projections.block(row_major) if projections.blockable(row_major) else None
    print("rows M   row-major ms   column-major ms   oneDNN blocked ms")
    for m in (1, 2, 3, 4, 6, 8, 12, 16, 32, 128):
        x = torch.randn(m, args.hidden)
        a = fastest(lambda x=x: F.linear(x, row_major), args.repeats) * 1e3
        b = fastest(lambda x=x: F.linear(x, column_major), args.repeats) * 1e3
        c = (
            f"{fastest(lambda x=x: projections.blocked_linear(x, blocked), args.repeats) * 1e3:17.2f}"
            if blocked is not None
            else f"{'-':>17s}"
        )
        print(f"{m:6d}   {a:12.2f}   {b:15.2f}   {c}")


if __name__ == "__main__":
    main()
