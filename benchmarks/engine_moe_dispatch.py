"""Micro-benchmark: ways to run the routed experts of one MoE layer on CPU.

Each call gets a fresh random routing (so, as in decoding, the experts read differ from call
to call) and is timed in CPU time of the calling thread (robust on a shared machine).

    .venv/bin/python benchmarks/engine_moe_dispatch.py [--threads 1]

Paths: `blocked` (a host loop over the active experts on oneDNN-blocked weights, the engine's
CPU fp32 path), `grouped` (torch._grouped_mm on the stacked weights, the engine's path for bf16
and on CUDA), `gather`
(gpt-fast's w[expert_indices] per (token, k) pair, then batched matmuls), `loop` (the same
host loop as `blocked` on the plain weights, MKL each), and the int8 loop used by
quantize="int8".
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

Route = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # xs [S, D] sorted, expert ids [S], ends [E]


def grouped(w13: torch.Tensor, w2: torch.Tensor) -> Callable[[Route], torch.Tensor]:
    def run(r: Route) -> torch.Tensor:
        h = torch._grouped_mm(r[0], w13.transpose(-2, -1), offs=r[2])
        g, u = h.chunk(2, dim=-1)
        return torch._grouped_mm(F.silu(g) * u, w2.transpose(-2, -1), offs=r[2])

    return run


def gather(w13: torch.Tensor, w2: torch.Tensor) -> Callable[[Route], torch.Tensor]:
    def run(r: Route) -> torch.Tensor:
        h = torch.bmm(w13[r[1]], r[0].unsqueeze(-1)).squeeze(-1)
        g, u = h.chunk(2, dim=-1)
        return torch.bmm(w2[r[1]], (F.silu(g) * u).unsqueeze(-1)).squeeze(-1)

    return run


def host_loop(w13: torch.Tensor, w2: torch.Tensor, kind: str) -> Callable[[Route], torch.Tensor]:
    """The engine's `ExpertLoop` (a host loop over the experts that got tokens) on per-expert
    projections of `kind`: "dense" (MKL, `x @ W.t()`), "blocked" (oneDNN) or "int8"."""
    from infersight.engine.network import ExpertLoop
    from infersight.engine.projection import BlockedProjection, DenseProjection, Int8Projection
    from infersight.engine.quant import int8_rows

    def projection(w: torch.Tensor) -> DenseProjection | BlockedProjection | Int8Projection:
        if kind == "int8":
            q = int8_rows(w, torch.bfloat16)
            return Int8Projection(q["weight"], q["scales"])
        return BlockedProjection(w) if kind == "blocked" else DenseProjection(w)

    experts = ExpertLoop(
        tuple((projection(a), projection(b)) for a, b in zip(w13, w2, strict=True)), w2.shape[1]
    )
    if kind == "int8":  # int8 runs with bf16 activations (quant.py)
        return lambda r: experts(r[0].bfloat16(), r[1], r[2])
    return lambda r: experts(*r)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--calls", type=int, default=24)
    args = parser.parse_args()
    from infersight.engine.native import cpu_model

    print(f"CPU: {cpu_model()}; {os.cpu_count()} logical CPUs", flush=True)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    E, top_k = 8, 2
    for D, inter in ((256, 512), (512, 1024)):
        w13, w2 = torch.randn(E, 2 * inter, D) * 0.02, torch.randn(E, D, inter) * 0.02
        paths = {
            "blocked": host_loop(w13, w2, "blocked"),
            "grouped": grouped(w13, w2),
            "gather": gather(w13, w2),
            "loop": host_loop(w13, w2, "dense"),
            "bf16 grouped": grouped(w13.bfloat16(), w2.bfloat16()),
            "int8 loop": host_loop(w13, w2, "int8"),
        }
        for tokens in (1, 8, 64):
            routes: list[Route] = []
            for _ in range(args.calls):
                ids = torch.stack([torch.randperm(E)[:top_k] for _ in range(tokens)]).view(-1).sort().values
                ends = torch.searchsorted(ids, torch.arange(E), right=True, out_int32=True)
                routes.append((torch.randn(tokens * top_k, D), ids, ends))
            cells = []
            for name, run in paths.items():
                rs = [(r[0].bfloat16(), r[1], r[2]) for r in routes] if name == "bf16 grouped" else routes
                run(rs[0])
                samples = []
                for r in rs:
                    start = time.thread_time()
                    run(r)
                    samples.append(time.thread_time() - start)
                cells.append(f"{name} {statistics.median(samples) * 1e3:7.3f}")
            print(f"D={D} I={inter} tokens={tokens:3d}  " + "  ".join(cells) + "  (ms, median)")


if __name__ == "__main__":
    main()
