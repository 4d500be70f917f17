"""Decode tokens/s: infersight.engine against transformers' MixtralForCausalLM.generate.

On CPU the engine runs twice in fp32: on the eager path and on the native one (paths.py;
`load` picks between them by measuring, here both are forced to compare them).

Both sides run the same random weights (written by transformers' save_pretrained), in the
same process, alternating run by run; each figure is the median over repeats. Decode time is
isolated as time(generate N+1 tokens) - time(generate 1 token), so prefill is not counted.

    .venv/bin/python benchmarks/engine_decode.py                 # CPU, fp32 (+ int8, int4, fp8 at batch 1)
    .venv/bin/python benchmarks/engine_decode.py --device cuda   # GPU, bf16
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

CONFIGS: dict[str, dict[str, Any]] = {
    "small": {
        "hidden_size": 256,
        "intermediate_size": 512,
        "num_hidden_layers": 2,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "vocab_size": 4096,
    },
    "medium": {
        "hidden_size": 512,
        "intermediate_size": 1024,
        "num_hidden_layers": 4,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "vocab_size": 32000,
    },
    # an intermediate size that is not a power of two (nor a multiple of 64)
    "odd": {
        "hidden_size": 512,
        "intermediate_size": 1408,
        "num_hidden_layers": 4,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "vocab_size": 32000,
    },
}
COMMON = {
    "num_local_experts": 8,
    "num_experts_per_tok": 2,
    "max_position_embeddings": 4096,
    "eos_token_id": None,
}
# (config, batch, target ratio engine/transformers) from the issue
CASES = [
    ("small", 1, 2.0),
    ("small", 8, None),
    ("medium", 1, 1.3),
    ("medium", 8, 1.5),
    ("odd", 1, 1.5),
    ("odd", 8, 1.5),
]


def weight_bytes_per_step(name: str, batch: int, bytes_per_weight: float = 4.0) -> float:
    """Weight bytes one decode step must read: attention, the experts the batch routes to
    (expected number under uniform routing), and the lm head."""
    c = CONFIGS[name] | COMMON
    D, inter, E, k = (
        c["hidden_size"],
        c["intermediate_size"],
        c["num_local_experts"],
        c["num_experts_per_tok"],
    )
    hd = D // c["num_attention_heads"]
    attention = D * hd * (2 * c["num_attention_heads"] + 2 * c["num_key_value_heads"])
    experts = E * (1 - ((E - k) / E) ** batch) * 3 * D * inter
    per_layer = attention + experts + E * D  # + router
    return bytes_per_weight * (c["num_hidden_layers"] * per_layer + c["vocab_size"] * D)


def read_bandwidth(device: torch.device, dtype: torch.dtype) -> float:
    """Bytes/s at which one matrix-vector product streams a 256 MiB weight (median of 5): the
    speed of the memory floor, measured with the very kind of op that decoding is made of."""
    weight = torch.randn(1 << 16, 1024, device=device).to(dtype)
    x = torch.randn(1, 1024, device=device, dtype=dtype)
    torch.nn.functional.linear(x, weight)
    samples = [_timed(lambda: torch.nn.functional.linear(x, weight), device) for _ in range(5)]
    return weight.numel() * weight.element_size() / statistics.median(samples)


@dataclass(frozen=True)
class Row:
    config: str
    batch: int
    side: str
    tokens_per_s: float
    ratio: float | None  # against transformers (int8: against the engine's fp32; int4, fp8: its int8)
    target: float | None


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


CLOCKS: dict[str, Callable[[], float]] = {"wall": time.perf_counter, "cpu": time.process_time}
clock = time.perf_counter


def _timed(fn: Callable[[], object], device: torch.device) -> float:
    _sync(device)
    start = clock()
    fn()
    _sync(device)
    return clock() - start


def _decode_rate(run: Callable[[int], object], batch: int, new: int, device: torch.device) -> float:
    """Tokens/s of decode alone: (N+1 tokens) minus (1 token) removes prefill and set-up."""
    full = _timed(lambda: run(new + 1), device)
    first = _timed(lambda: run(1), device)
    return batch * new / max(full - first, 1e-9)


def bench_case(
    name: str,
    batch: int,
    *,
    device: torch.device,
    dtype: torch.dtype,
    prompt: int,
    new: int,
    repeats: int,
    int8: bool,
) -> dict[str, float]:
    from infersight.engine import load
    from transformers import MixtralConfig, MixtralForCausalLM

    torch.manual_seed(0)
    config = MixtralConfig(**CONFIGS[name], **COMMON)
    reference = MixtralForCausalLM(config).eval()
    with tempfile.TemporaryDirectory() as tmp:
        reference.save_pretrained(tmp)
        engine = load(tmp, device=device, dtype=dtype, engine_path="eager")
        native = load(tmp, device=device, dtype=dtype, engine_path="native") if device.type == "cpu" else None
        quantized = {
            q: load(tmp, device=device, quantize=q) for q in (("int8", "int4", "fp8") if int8 else ())
        }
        reference = reference.to(device=device, dtype=dtype)
        ids = torch.randint(0, config.vocab_size, (batch, prompt), device=device)
        mask = torch.ones_like(ids)

        def hf(n: int) -> object:
            with torch.inference_mode():
                return reference.generate(
                    ids,
                    attention_mask=mask,
                    max_new_tokens=n,
                    min_new_tokens=n,
                    do_sample=False,
                    pad_token_id=0,
                )

        sides: dict[str, Callable[[int], object]] = {
            "transformers": hf,
            "engine": lambda n: engine.generate(ids, n),
        }
        if native is not None:
            sides["engine native"] = lambda n: native.generate(ids, n)
        for q, model in quantized.items():
            sides[f"engine {q}"] = lambda n, model=model: model.generate(ids, n)
        for run in sides.values():  # warm-up: allocator, kernels, lazy init
            run(4)
        rates: dict[str, list[float]] = {side: [] for side in sides}
        for _ in range(repeats):  # alternate the sides, repeat by repeat
            for side, run in sides.items():
                rates[side].append(_decode_rate(run, batch, new, device))
    return {side: statistics.median(values) for side, values in rates.items()}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--prompt", type=int, default=16, help="prompt tokens per row")
    parser.add_argument("--new", type=int, default=64, help="decode steps timed")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--only", choices=sorted(CONFIGS), help="run one config only")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    parser.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's choice)")
    parser.add_argument(
        "--clock",
        choices=sorted(CLOCKS),
        default="wall",
        help="wall: elapsed time (quiet machine); cpu: this process's CPU time, which other "
        "processes on a shared machine do not inflate (use with --threads 1, CPU only)",
    )
    args = parser.parse_args()
    from infersight.engine.native import cpu_model

    print(f"CPU: {cpu_model()}; {os.cpu_count()} logical CPUs", flush=True)
    global clock
    clock = CLOCKS[args.clock]
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    dtype = torch.float32 if device.type == "cpu" else torch.bfloat16

    bandwidth = read_bandwidth(device, dtype)
    print(
        f"matrix-vector streaming: {bandwidth / 1e9:.1f} GB/s ({args.clock} clock); floor = weight bytes / that"
    )
    rows: list[Row] = []
    for name, batch, target in CASES:
        if args.only and name != args.only:
            continue
        int8 = batch == 1  # int8 and int4 beside fp32
        rates = bench_case(
            name,
            batch,
            device=device,
            dtype=dtype,
            prompt=args.prompt,
            new=args.new,
            repeats=args.repeats,
            int8=int8,
        )
        hf, eng = rates["transformers"], rates["engine"]
        rows.append(Row(name, batch, "transformers", hf, None, None))
        rows.append(Row(name, batch, "engine", eng, eng / hf, target))
        if "engine native" in rates:
            rows.append(
                Row(name, batch, "engine native", rates["engine native"], rates["engine native"] / hf, target)
            )
        if "engine int8" in rates:
            q8, q4 = rates["engine int8"], rates["engine int4"]
            rows.append(Row(name, batch, "engine int8", q8, q8 / eng, 1.5))
            rows.append(Row(name, batch, "engine int4", q4, q4 / q8, 1.2))
            if "engine fp8" in rates:  # the bytes int8 reads, decoded as e4m3
                rows.append(
                    Row(name, batch, "engine fp8", rates["engine fp8"], rates["engine fp8"] / q8, 0.9)
                )
        for row in rows[-len(rates) :]:
            ratio = f"{row.ratio:5.2f}x" if row.ratio is not None else "      "
            goal = f"(target >= {row.target}x)" if row.target is not None else ""
            wbytes = weight_bytes_per_step(
                name,
                batch,
                {"engine int8": 1.0, "engine int4": 0.5, "engine fp8": 1.0}.get(
                    row.side, float(dtype.itemsize)
                ),
            )
            floor = batch * bandwidth / wbytes  # tok/s if reading the weights were all it took
            print(
                f"{row.config:7s} batch {row.batch}  {row.side:13s} {row.tokens_per_s:9.1f} tok/s  {ratio} "
                f"{goal:20s} {row.tokens_per_s / floor:4.0%} of the floor ({floor:.0f} tok/s)"
            )

    print(
        f"\nmachine: {platform.machine()}, {torch.get_num_threads()} threads, torch {torch.__version__}, "
        f"device {device}, dtype {dtype}; prompt {args.prompt}, {args.new} decode steps, median of {args.repeats}, "
        f"{args.clock} clock"
    )
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in rows], indent=2))


if __name__ == "__main__":
    main()
