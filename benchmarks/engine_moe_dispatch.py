"""Micro-benchmark: ways to run the routed experts of one MoE layer on CPU.

Each call gets a fresh random routing (so, as in decoding, the experts read differ from call
to call) and is timed in CPU time of the calling thread (robust on a shared machine).

    .venv/bin/python benchmarks/engine_moe_dispatch.py [--threads 1]

Paths: `blocked` (a host loop over the active experts on oneDNN-blocked weights, the engine's
CPU fp32 path), `grouped` (torch._grouped_mm on the stacked weights, the engine's path for bf16
and on CUDA), `gather`
(gpt-fast's w[expert_indices] per (token, k) pair, then batched matmuls), `loop` (a Python
loop over the active experts, F.linear each), and the int8 twins used by quantize="int8".
"""

from __future__ import annotations

import argparse
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


def loop(w13: torch.Tensor, w2: torch.Tensor) -> Callable[[Route], torch.Tensor]:
    def run(r: Route) -> torch.Tensor:
        out, start = torch.empty_like(r[0]), 0
        for e, end in enumerate(r[2].tolist()):
            if end > start:
                g, u = F.linear(r[0][start:end], w13[e]).chunk(2, dim=-1)
                out[start:end] = F.linear(F.silu(g) * u, w2[e])
            start = end
        return out

    return run


def blocked(w13: torch.Tensor, w2: torch.Tensor) -> Callable[[Route], torch.Tensor]:
    from infersight.engine import onednn

    b13, b2 = [onednn.block(w) for w in w13], [onednn.block(w) for w in w2]

    def run(r: Route) -> torch.Tensor:
        out, start = torch.empty_like(r[0]), 0
        for e, end in enumerate(r[2].tolist()):
            if end > start:
                g, u = onednn.linear(r[0][start:end], b13[e]).chunk(2, dim=-1)
                out[start:end] = onednn.linear(F.silu(g) * u, b2[e])
            start = end
        return out

    return run


def int8_loop(w13: torch.Tensor, w2: torch.Tensor) -> Callable[[Route], torch.Tensor]:
    from infersight.engine.quant import Int8Experts, int8_rows

    E, two_i, D = w13.shape
    experts = Int8Experts(E, D, two_i // 2, torch.bfloat16)
    for name, w in (("w13", w13), ("w2", w2)):
        q = int8_rows(w, torch.bfloat16)
        setattr(experts, f"{name}_weight", q["weight"])
        setattr(experts, f"{name}_scales", q["scales"])
    experts.bind()
    return lambda r: experts(r[0].bfloat16(), r[1], r[2])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--calls", type=int, default=24)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    E, top_k = 8, 2
    for D, inter in ((256, 512), (512, 1024)):
        w13, w2 = torch.randn(E, 2 * inter, D) * 0.02, torch.randn(E, D, inter) * 0.02
        paths = {
            "blocked": blocked(w13, w2),
            "grouped": grouped(w13, w2),
            "gather": gather(w13, w2),
            "loop": loop(w13, w2),
            "bf16 grouped": grouped(w13.bfloat16(), w2.bfloat16()),
            "int8 loop": int8_loop(w13, w2),
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
