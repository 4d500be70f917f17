"""Decode step time of the native library's builds, side by side on one model in one process.

The sides: every packaged ISA level this CPU runs (engine/isa.py; the engine loads the first),
a `-march=native` build of the same C ($INFERSIGHT_ENGINE_MARCH's) where there is a compiler,
and any library named with --extra NAME=PATH (say an older build, to compare before and
after a change of the C: the library must export the same entry points). Each side decodes
the same model (fp32, int8 with int8 activations where the library has those loops, int4)
from the same cache, alternating side by side round by round; per side the median over
rounds of the step time, measured on the thread's CPU clock (one thread: other processes on
a shared machine do not inflate it). Ratios are against the level the engine picks.

    .venv/bin/python benchmarks/native_levels.py                      # medium, batch 1 and 8
    .venv/bin/python benchmarks/native_levels.py --extra old=/path/to/infersight_native_x.so
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

MEDIUM = {  # benchmarks/engine_decode.py's "medium"
    "hidden_size": 512,
    "intermediate_size": 1024,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "vocab_size": 32000,
    "num_local_experts": 8,
    "num_experts_per_tok": 2,
    "max_position_embeddings": 4096,
}


def _sides(extra: list[str]) -> dict[str, object]:
    from infersight.engine import isa, native

    sides: dict[str, object] = {}
    for level in isa.supported(isa.cpu_flags()):
        path = native.LIBRARY_DIR / level.library
        if path.is_file():
            sides[level.name] = native.NativeKernels(path, level.name)
    if native.compiler() and not os.environ.get("NO_MARCH"):
        with tempfile.TemporaryDirectory() as tmp:  # the library stays loaded once built
            sides["march=native"] = native.build(Path(tmp), cpu=native.cpu_model(), march="native")[0]
    for item in extra:
        name, _, path = item.partition("=")
        sides[name] = native.NativeKernels(Path(path), name)
    return sides


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=16, help="decode steps timed per side and round")
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--quantize", default="fp32,int8,int4", help="the model kinds, of fp32,int8,int4")
    parser.add_argument("--extra", action="append", default=[], metavar="NAME=PATH")
    args = parser.parse_args()
    from infersight.engine import load, native, native_step
    from transformers import MixtralConfig, MixtralForCausalLM

    torch.set_num_threads(args.threads)
    print(f"CPU: {native.cpu_model()}; {os.cpu_count()} logical CPUs; {args.threads} thread(s)", flush=True)
    sides = _sides(args.extra)
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        MixtralForCausalLM(MixtralConfig(**MEDIUM)).eval().save_pretrained(tmp)
        for quantize in [None if q == "fp32" else q for q in args.quantize.split(",")]:
            model = load(tmp, device="cpu", quantize=quantize, engine_path="native")
            steps = {}
            for name, kernels in sides.items():
                step = native_step.step_for(model.network, kernels)  # type: ignore[arg-type]
                if step is not None:
                    step.act8 = True  # int8: int8 activations where the library has the loops
                    steps[name] = step
            for batch in map(int, args.batches.split(",")):
                cache = model.new_cache(max_batch=batch, max_seq_len=64)
                ids = torch.randint(0, MEDIUM["vocab_size"], (batch, 32))
                slots = torch.arange(batch)
                for row in range(batch):
                    model.prefill(cache, row, ids[row])
                times: dict[str, list[float]] = {name: [] for name in steps}
                for _ in range(args.rounds):
                    for name, step in steps.items():  # alternate the sides, round by round
                        step(cache, slots, ids[:, 0], torch.full((batch,), 32))  # warm
                        start = time.thread_time()
                        for t in range(args.steps):
                            step(cache, slots, ids[:, t % 32], torch.full((batch,), 32 + t))
                        times[name].append((time.thread_time() - start) / args.steps)
                medians = {name: statistics.median(v) for name, v in times.items()}
                base = medians[next(iter(medians))]
                for name, t in medians.items():
                    print(
                        f"{quantize or 'fp32':5} batch {batch}  {name:15} {t * 1e3:8.3f} ms/step"
                        f"  {base / t:5.2f}x (against {next(iter(medians))})",
                        flush=True,
                    )


if __name__ == "__main__":
    main()
