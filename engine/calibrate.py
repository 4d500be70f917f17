"""`quantize_checkpoint`: an int4 build of a Mixtral checkpoint, GPTQ-calibrated or rounded to nearest.

GPTQ needs each projection's input Hessian (gptq.py) on realistic inputs, which depend on
every layer below it. The model is run layer by layer over the calibration texts: the hidden
states entering layer l (one [T, D] per text: the only activations held, one layer's worth)
go through the layer in full precision while the Hessians of its projections accumulate
(QKV from the normed input, the output projection from the attention output, each expert's
w1|w3 and w2 from the tokens the router sends it, weighted by nothing: GPTQ's loss is per
token); the layer's projections are quantized; then the same states go through the quantized
layer to become layer l + 1's inputs, so each layer is calibrated on what the quantized model
below it really produces (Frantar et al.'s sequential scheme).

An expert the router sent fewer than `min_expert_tokens` tokens has no Hessian worth the name:
it is rounded to nearest, and counted (`QuantizeReport.rtn_experts`, logged). The output head
is int8 per row unless `head="int4"` (then GPTQ on the final normed states, or RTN). The
router gate, norms and embedding stay full precision, as in every engine quantization.

The forward here is the Mixtral layer written plainly in fp32 (transformers' maths: RMSNorm,
RoPE by rotate-half, causal SDPA with grouped KV heads, top-k softmax routing, SwiGLU), read
straight from the checkpoint's memory map one layer at a time.
"""

from __future__ import annotations

import json
import logging
import shutil
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from .checkpoint import SINGLE, Checkpoint, expected_tensors, stacked_experts
from .config import ModelConfig
from .errors import CalibrationInvalid, UnsupportedQuantization
from .gptq import Hessian, Int4Rows, gptq_int4, rtn_int4
from .network import inverse_frequencies
from .quant import INT4_GROUPS, int8_rows
from .quantized_store import META, TENSORS, StoredQuantization

__all__ = ["METHODS", "QuantizeReport", "calibration_texts", "quantize_checkpoint"]

log = logging.getLogger("infersight.engine")

METHODS = ("gptq", "rtn")
HEADS = ("int8", "int4")


@dataclass(frozen=True, slots=True)
class QuantizeReport:
    """What a build did: its record (written as quantization.json) and where it lies."""

    record: StoredQuantization
    directory: Path
    projections: int  # projections quantized (the head included)


def calibration_texts(path: Path, *, limit: int | None = None) -> list[str]:
    """The texts of a JSONL calibration file: each object's `prompt`, followed by its
    `response` (or `answer`, as `infersight dataset export` names it) when there is one.
    Lines that are not objects with a non-empty string prompt are skipped; none left is an
    error."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise CalibrationInvalid(f"calibration file {path}: cannot be read ({exc})") from exc
    texts: list[str] = []
    for line in lines:
        try:
            item = json.loads(line)
        except ValueError:
            continue
        prompt = item.get("prompt") if isinstance(item, dict) else None
        if not isinstance(prompt, str) or not prompt.strip():
            continue
        response = item.get("response", item.get("answer"))
        texts.append(prompt + ("\n" + response if isinstance(response, str) and response else ""))
        if limit is not None and len(texts) >= limit:
            break
    if not texts:
        raise CalibrationInvalid(
            f"calibration file {path} has no usable prompt (JSONL objects with a non-empty 'prompt' string)"
        )
    return texts


def _tokens(directory: Path, texts: list[str], max_tokens: int) -> list[torch.Tensor]:
    path = directory / "tokenizer.json"
    if not path.is_file():
        raise CalibrationInvalid(f"{directory} has no tokenizer.json: GPTQ calibration tokenizes its texts")
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(path))
    out = [torch.tensor(e.ids[:max_tokens], dtype=torch.long) for e in tokenizer.encode_batch(texts)]
    out = [ids for ids in out if ids.numel() > 0]
    if not out:
        raise CalibrationInvalid("no calibration text tokenizes to at least one token")
    return out


class _Weights:
    """One layer's full-precision weights from the checkpoint (either expert layout)."""

    def __init__(self, ckpt: Checkpoint, c: ModelConfig, n: int) -> None:
        p = f"model.layers.{n}."
        self.stacked = stacked_experts(ckpt.infos)
        self.prefix, self.c, self.ckpt = p, c, ckpt
        a = p + "self_attn."
        t = ckpt.tensor
        self.keys_qkv = [a + "q_proj.weight", a + "k_proj.weight", a + "v_proj.weight"]
        self.key_o = a + "o_proj.weight"
        self.wqkv = torch.cat([t(k).float() for k in self.keys_qkv])
        self.wo = t(self.key_o).float()
        self.attn_norm = t(p + "input_layernorm.weight").float()
        self.ffn_norm = t(p + "post_attention_layernorm.weight").float()
        moe = p + ("mlp." if self.stacked else "block_sparse_moe.")
        self.gate = t(moe + "gate.weight").float()
        E = c.num_local_experts
        if self.stacked:
            self.w13 = t(moe + "experts.gate_up_proj").float().clone()
            self.w2 = t(moe + "experts.down_proj").float().clone()
        else:
            x = moe + "experts."
            self.w13 = torch.stack(
                [torch.cat([t(f"{x}{e}.w1.weight"), t(f"{x}{e}.w3.weight")]).float() for e in range(E)]
            )
            self.w2 = torch.stack([t(f"{x}{e}.w2.weight").float() for e in range(E)])

    def checkpoint_tensors(self) -> dict[str, torch.Tensor]:
        """The (now dequantized) projections under the checkpoint's own names."""
        c, p = self.c, self.prefix
        H, Hkv, hd = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        q, k, v = self.wqkv.split([H * hd, Hkv * hd, Hkv * hd])
        out = dict(zip(self.keys_qkv, (q, k, v), strict=True)) | {self.key_o: self.wo}
        if self.stacked:
            return out | {p + "mlp.experts.gate_up_proj": self.w13, p + "mlp.experts.down_proj": self.w2}
        inter = c.intermediate_size
        for e in range(c.num_local_experts):
            x = f"{p}block_sparse_moe.experts.{e}."
            out |= {x + "w1.weight": self.w13[e, :inter], x + "w3.weight": self.w13[e, inter:]}
            out[x + "w2.weight"] = self.w2[e]
        return out


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    a, b = x.chunk(2, dim=-1)
    return torch.cat([-b, a], dim=-1)


class _Hessians:
    """One layer's accumulators: QKV, output projection, and per expert w1|w3 and w2."""

    def __init__(self, c: ModelConfig) -> None:
        D, inter, E = c.hidden_size, c.intermediate_size, c.num_local_experts
        self.qkv, self.o = Hessian(D), Hessian(c.num_attention_heads * c.head_dim)
        self.w13 = [Hessian(D) for _ in range(E)]
        self.w2 = [Hessian(inter) for _ in range(E)]


def _layer(
    x: torch.Tensor, w: _Weights, c: ModelConfig, cos: torch.Tensor, sin: torch.Tensor, hs: _Hessians | None
) -> torch.Tensor:
    """One text's hidden states x [T, D] through layer `w` -> [T, D]; Hessians into `hs`."""
    T = x.shape[0]
    H, Hkv, hd = c.num_attention_heads, c.num_key_value_heads, c.head_dim
    xn = _rms(x, w.attn_norm, c.rms_norm_eps)
    qkv = (xn @ w.wqkv.t()).view(T, H + 2 * Hkv, hd)
    qk = qkv[:, : H + Hkv] * cos[:T, None] + _rotate_half(qkv[:, : H + Hkv]) * sin[:T, None]
    q, k, v = qk[:, :H], qk[:, H:], qkv[:, H + Hkv :]
    y = (
        F.scaled_dot_product_attention(
            q.transpose(0, 1)[None],
            k.transpose(0, 1)[None],
            v.transpose(0, 1)[None],
            is_causal=True,
            enable_gqa=True,
        )[0]
        .transpose(0, 1)
        .reshape(T, H * hd)
    )  # [T, H hd]
    h = x + y @ w.wo.t()
    hn = _rms(h, w.ffn_norm, c.rms_norm_eps)
    top, chosen = torch.topk(hn @ w.gate.t(), c.num_experts_per_tok, dim=-1)  # [T, k]
    weights = torch.softmax(top, dim=-1)
    out = h.clone()
    inter = c.intermediate_size
    for e in chosen.unique().tolist():
        rows, slot = (chosen == e).nonzero(as_tuple=True)
        xe = hn[rows]
        g = xe @ w.w13[e].t()
        act = F.silu(g[:, :inter]) * g[:, inter:]
        if hs is not None:
            hs.w13[e].add(xe)
            hs.w2[e].add(act)
        out.index_add_(0, rows, (act @ w.w2[e].t()) * weights[rows, slot, None])
    if hs is not None:
        hs.qkv.add(xn)
        hs.o.add(y)
    return out


def _check_groups(c: ModelConfig, group: int, head: str) -> None:
    rows = {
        "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size,
        "attention width (heads x head_dim)": c.num_attention_heads * c.head_dim,
    }
    for what, k in rows.items():
        if k % group:
            raise UnsupportedQuantization(
                "int4", ("int4",), reason=f"group size {group} does not divide the {what}, {k}"
            )


def quantize_checkpoint(
    source: Path,
    target: Path,
    *,
    method: str,
    texts: Iterable[str] = (),
    group_size: int = 64,
    head: str = "int8",
    act_order: bool = False,
    percdamp: float = 0.01,
    max_tokens: int = 256,
    min_expert_tokens: int = 16,
    source_version: str | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> QuantizeReport:
    """Write an int4 build of the checkpoint `source` into the new directory `target`.

    method "gptq" calibrates on `texts` (calibration_texts); "rtn" rounds to nearest and
    reads none. Every argument is checked before any weight is read. `progress(done, total)`
    is called as layers finish (of num_hidden_layers + 1: the head last)."""
    if method not in METHODS:
        raise UnsupportedQuantization(
            method, METHODS, reason=f"unknown method; choose one of {', '.join(METHODS)}"
        )
    if group_size not in INT4_GROUPS:
        raise UnsupportedQuantization(
            "int4",
            ("int4",),
            reason=f"group size {group_size} is not one of {', '.join(map(str, INT4_GROUPS))}",
        )
    if head not in HEADS:
        raise UnsupportedQuantization(head, HEADS, reason=f"the head is kept at {' or '.join(HEADS)}")
    c = ModelConfig.from_file(source / "config.json")
    _check_groups(c, group_size, head)
    ckpt = Checkpoint.open(source)
    expected, optional = expected_tensors(c, stacked=stacked_experts(ckpt.infos))
    ckpt.check(expected, optional)
    texts = list(texts)
    samples = (
        _tokens(source, texts, min(max_tokens, c.sliding_window or max_tokens)) if method == "gptq" else []
    )
    if any(int(ids.max()) >= c.vocab_size for ids in samples):
        raise CalibrationInvalid(f"the tokenizer gives ids beyond the model's vocabulary of {c.vocab_size}")
    if target.exists():
        raise FileExistsError(f"{target} already exists")

    freqs = inverse_frequencies(c.head_dim, c.rope_theta)
    longest = max((ids.numel() for ids in samples), default=1)
    angles = torch.outer(torch.arange(longest, dtype=torch.float32), freqs)
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)
    embed = ckpt.tensor("model.embed_tokens.weight").float()
    states = [embed[ids] for ids in samples]  # one layer's activations: what enters the next layer
    total = c.num_hidden_layers + 1
    quantized: dict[str, torch.Tensor] = {}
    tensors: dict[str, torch.Tensor] = {}
    rtn_experts, count = 0, 0

    def put(name: str, rows: Int4Rows | dict[str, torch.Tensor]) -> None:
        parts = rows.layout() if isinstance(rows, Int4Rows) else rows
        quantized.update({f"{name}.{k}": v for k, v in parts.items()})

    def quantize(w: torch.Tensor, hessian: Hessian | None) -> Int4Rows:
        nonlocal count
        count += 1
        if hessian is None:
            return rtn_int4(w, group_size)
        return gptq_int4(w, hessian.value(), group_size, percdamp=percdamp, act_order=act_order)

    target.mkdir(parents=True)
    try:
        for n in range(c.num_hidden_layers):
            w = _Weights(ckpt, c, n)
            hs = _Hessians(c) if samples else None
            if hs is not None:
                for x in states:
                    _layer(x, w, c, cos, sin, hs)
            m = f"layers.{n}."
            rows = quantize(w.wqkv, hs.qkv if hs else None)
            put(m + "attention.wqkv", rows)
            w.wqkv = rows.dequantize()
            rows = quantize(w.wo, hs.o if hs else None)
            put(m + "attention.wo", rows)
            w.wo = rows.dequantize()
            stacks: dict[str, list[dict[str, torch.Tensor]]] = {"w13": [], "w2": []}
            for e in range(c.num_local_experts):
                few = hs is not None and hs.w13[e].count < min_expert_tokens
                rtn_experts += int(few)
                for name, stack, hessians in (
                    ("w13", w.w13, hs.w13 if hs else None),
                    ("w2", w.w2, hs.w2 if hs else None),
                ):
                    rows = quantize(stack[e], None if hessians is None or few else hessians[e])
                    stacks[name].append(rows.layout())
                    stack[e] = rows.dequantize()
            for name, parts in stacks.items():
                put(f"{m}moe.experts.{name}", {k: torch.stack([p[k] for p in parts]) for k in parts[0]})
            tensors |= w.checkpoint_tensors()
            states = [_layer(x, w, c, cos, sin, None) for x in states]
            if progress is not None:
                progress(n + 1, total)
        head_key = "model.embed_tokens.weight" if c.tie_word_embeddings else "lm_head.weight"
        w_head = ckpt.tensor(head_key).float()
        if head == "int8":
            head8 = int8_rows(w_head, torch.float32)
            put("output", head8)
            count += 1
            w_head = head8["weight"].float() * head8["scales"][:, None]
        else:
            final = Hessian(c.hidden_size) if samples else None
            norm = ckpt.tensor("model.norm.weight").float()
            for x in states if final is not None else ():
                final.add(_rms(x, norm, c.rms_norm_eps))  # type: ignore[union-attr]
            rows = quantize(w_head, final)
            put("output", rows)
            w_head = rows.dequantize()
        if progress is not None:
            progress(total, total)
        if rtn_experts:
            log.warning(
                "quantize: %d expert(s) got fewer than %d calibration tokens and were rounded to nearest",
                rtn_experts,
                min_expert_tokens,
            )
        record = StoredQuantization(
            scheme="int4",
            method=method,
            group_size=group_size,
            head=head,
            act_order=act_order,
            percdamp=percdamp,
            samples=len(samples),
            tokens=sum(ids.numel() for ids in samples),
            rtn_experts=rtn_experts,
            source=source_version,
        )
        _write(source, target, ckpt, tensors, quantized, record, head_key, w_head, c)
    except BaseException:
        shutil.rmtree(target, ignore_errors=True)
        raise
    return QuantizeReport(record, target, count)


def _write(
    source: Path,
    target: Path,
    ckpt: Checkpoint,
    tensors: dict[str, torch.Tensor],
    quantized: dict[str, torch.Tensor],
    record: StoredQuantization,
    head_key: str,
    w_head: torch.Tensor,
    c: ModelConfig,
) -> None:
    from safetensors.torch import save_file

    for path in source.iterdir():  # config, tokenizer, generation config: everything but the weights
        if (
            path.is_file()
            and not path.name.endswith(".safetensors")
            and path.name not in (META, "model.safetensors.index.json")
        ):
            shutil.copy2(path, target / path.name)
    full = {k: ckpt.tensor(k) for k in ckpt.infos if k not in tensors} | tensors
    if not c.tie_word_embeddings:
        full[head_key] = w_head  # a tied head is the embedding: the build's int8 copy is in TENSORS only
    save_file({k: v.contiguous() for k, v in full.items()}, str(target / SINGLE), {"format": "pt"})
    save_file({k: v.contiguous() for k, v in quantized.items()}, str(target / TENSORS), {"format": "pt"})
    (target / META).write_text(json.dumps(record.to_json(), indent=2, sort_keys=True) + "\n")
