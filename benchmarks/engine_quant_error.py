"""How far int8 and int4 move the engine's next-token distributions from fp32, on real text.

Text: Banking77 test questions (bundled in infersight.monitor.data), tokenized with the demo
model's WordPiece tokenizer (all-MiniLM-L6-v2's). Models, loaded in fp32, int8 and int4:
- `demo`: the demo checkpoint (`infersight models init-demo`), whose logits follow the
  prompt's words, so its distributions are peaked the way a trained model's are;
- `medium`: the engine_vs_llamacpp medium config (hidden 512, intermediate 1024, 4 layers,
  vocab 32000, 8 experts top-2), random weights at transformers' initializer_range 0.02.
For every position of every question: KL(fp32 || quantized) of the next-token
distribution, and whether the argmax agrees. Reported: mean KL (nats), its 95th
percentile, top-1 agreement; for the quantized models' full forward (`logits`, the eager
per-op path) and as served (`served`: the first token prefilled, then one decode step per
token, on the path the load chose: on most CPUs the native step, with int8 activations
where it measured them faster). The reference is the fp32 model's full forward.

    .venv/bin/python benchmarks/engine_quant_error.py [--questions 200]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import statistics
import tempfile
from pathlib import Path
from typing import Any

import torch


def _kl_rows(reference: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    """KL(reference || other) per row of logits [N, V] -> [N]."""
    p, q = reference.float().log_softmax(-1), other.float().log_softmax(-1)
    return (p.exp() * (p - q)).sum(-1)


def _served(model: Any, ids: torch.Tensor) -> torch.Tensor:
    """Logits [T, V] of a prompt [1, T] as a server computes them: prefill, then decode steps."""
    cache = model.new_cache(max_batch=1, max_seq_len=ids.shape[1])
    rows = [model.prefill(cache, 0, ids[0, :1])]
    for t in range(1, ids.shape[1]):
        rows.append(model.decode(cache, torch.tensor([0]), ids[0, t : t + 1], torch.tensor([t]))[0])
    return torch.stack(rows)


def _demo_checkpoint(root: Path) -> Path:
    from infersight.engine import Registry
    from infersight.monitor.cli import main

    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["models", "init-demo", str(root / "registry")]) == 0
    return Registry(root / "registry").get("mixtral_banking_fp32-v1.0").path


def _medium_checkpoint(root: Path) -> Path:
    from transformers import MixtralConfig, MixtralForCausalLM

    torch.manual_seed(0)
    config = MixtralConfig(
        hidden_size=512, intermediate_size=1024, num_hidden_layers=4, num_attention_heads=8,
        num_key_value_heads=2, vocab_size=32000, num_local_experts=8, num_experts_per_tok=2,
        max_position_embeddings=4096,
    )  # fmt: skip
    MixtralForCausalLM(config).save_pretrained(root / "medium")
    return root / "medium"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--questions", type=int, default=200, help="Banking77 test questions used")
    args = parser.parse_args()
    from infersight.engine.native import cpu_model

    print(f"CPU: {cpu_model()}; {os.cpu_count()} logical CPUs", flush=True)

    from infersight.engine import load
    from infersight.monitor.data import banking77

    torch.set_num_threads(1)  # accuracy, not speed: one thread is not slowed by a shared machine
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        demo = _demo_checkpoint(root)
        checkpoints = {"demo": demo, "medium": _medium_checkpoint(root)}
        tokenizer = load(demo, device="cpu").tokenizer
        assert tokenizer is not None
        texts = [u.text for u in banking77("test")][: args.questions]
        prompts = [torch.tensor([tokenizer.encode(t).ids]) for t in texts]
        print(f"{len(prompts)} Banking77 questions, {sum(p.shape[1] for p in prompts)} positions")
        print("| model | quant | computed by | mean KL vs fp32 (nats) | p95 KL | top-1 agreement |")
        print("|---|---|---|---|---|---|")
        for name, path in checkpoints.items():
            fp32 = load(path, device="cpu")
            reference = [fp32.logits(p)[0] for p in prompts]
            for quant in ("int8", "int4"):
                model = load(path, device="cpu", quantize=quant)
                step = model.native_step
                served = f"served: {model.engine_path.name}" + (
                    " (int8 activations)" if step and step.act8 else ""
                )
                for way in ("forward", served):
                    kls, agree, total = [], 0, 0
                    for ids, ref in zip(prompts, reference, strict=True):
                        got = model.logits(ids)[0] if way == "forward" else _served(model, ids)
                        kls.extend(_kl_rows(ref, got).tolist())
                        agree += int((ref.argmax(-1) == got.argmax(-1)).sum())
                        total += ref.shape[0]
                    p95 = statistics.quantiles(kls, n=20)[-1]
                    print(
                        f"| {name} | {quant} | {way} | {statistics.fmean(kls):.2e} | {p95:.2e} | {agree / total:.3f} |"
                    )


if __name__ == "__main__":
    main()
