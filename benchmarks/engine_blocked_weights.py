"""Micro-benchmark: one fp32 weight [N, K] times 1-8 rows on CPU, MKL against oneDNN's blocked layout.

Sixteen distinct weights are used in turn, so (as in decoding a model larger than the cache)
each call streams its weight from memory. Wall clock, microseconds per call (median of
rounds); run it on a quiet machine.

    .venv/bin/python benchmarks/engine_blocked_weights.py [--threads 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

import torch
from infersight.engine import projection as projections

WEIGHTS = 16


def per_call_us(fn: Callable[[int], object], calls: int, rounds: int = 5) -> float:
    for i in range(WEIGHTS):
        fn(i)
    samples = []
    for _ in range(rounds):
        start = time.perf_counter()
        for i in range(calls):
            fn(i % WEIGHTS)
        samples.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(samples)


def row_costs(
    x: torch.Tensor,
    plain: list[torch.Tensor],
    column: list[torch.Tensor],
    blocked: list[torch.Tensor],
    calls: int,
) -> dict[str, float]:
    """us per call of x times each weight, by path."""
    return {
        "MKL, x @ W.t() (stored)": per_call_us(lambda i: torch.mm(x, plain[i].t()), calls),
        "MKL, column-major copy": per_call_us(lambda i: torch.mm(x, column[i]), calls),
        "oneDNN, blocked": per_call_us(lambda i: projections.blocked_linear(x, blocked[i]), calls),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--calls", type=int, default=160)
    args = parser.parse_args()
    from infersight.engine.native import cpu_model

    print(f"CPU: {cpu_model()}; {os.cpu_count()} logical CPUs", flush=True)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, {args.threads} threads, {WEIGHTS} weights alternated, us per call")
    for n, k in ((2048, 512), (512, 1024), (1024, 256)):
        plain = [torch.randn(n, k) for _ in range(WEIGHTS)]
        column = [w.t().contiguous() for w in plain]
        blocked = [projections.block(w) for w in plain]
        rows_list = (1, 2, 3, 4, 8)
        table: dict[str, list[float]] = {
            "MKL, x @ W.t() (stored)": [],
            "MKL, column-major copy": [],
            "oneDNN, blocked": [],
        }
        for rows in rows_list:
            for name, us in row_costs(torch.randn(rows, k), plain, column, blocked, args.calls).items():
                table[name].append(us)
        print(f"\n[N, K] = [{n}, {k}]  rows " + "".join(f"{r:>7d}" for r in rows_list))
        for name, cells in table.items():
            print(f"{name:<30}" + "".join(f"{c:7.0f}" for c in cells))


if __name__ == "__main__":
    main()
