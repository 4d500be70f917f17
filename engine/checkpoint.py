"""A checkpoint directory's safetensors files: found, memory-mapped, their headers checked.

`Checkpoint.open` reads only headers (names, shapes, dtypes); `tensor(key)` returns a tensor
that is a view of the file's private memory map (no copy, nothing read until touched).

Hugging Face Mixtral tensor names, and how they become the engine's fused parameters.

transformers (v4, and v5.24 still) saves one tensor per expert projection:
`model.layers.N.block_sparse_moe.experts.E.w1|w2|w3.weight`. The engine keeps them stacked
(`w13` [E, 2I, D], `w2` [E, D, I]) and fuses q/k/v into one `wqkv`. Those fused tensors are
the only copies made while loading: each is written once, straight from the memory map into
its final place (dtype conversion folded into the same copy). Every other tensor is the map
itself when device and dtype already match.

transformers v5's in-memory layout (`model.layers.N.mlp.gate.weight`,
`mlp.experts.gate_up_proj` [E, 2I, D], `mlp.experts.down_proj` [E, D, I]) is accepted too:
there the experts are already stacked and are assigned without a copy.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open

from .config import ModelConfig
from .errors import CheckpointCorrupt, CheckpointMismatch, CheckpointNotFound, NonFiniteWeights

__all__ = ["Checkpoint", "TensorInfo", "build_state", "expected_tensors", "stacked_experts"]


SINGLE = "model.safetensors"
INDEX = "model.safetensors.index.json"
FLOAT_DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}
_CHUNK = 1 << 24  # elements checked for NaN/Inf at a time: bounds the temporary mask


@dataclass(frozen=True, slots=True)
class TensorInfo:
    key: str
    file: str
    shape: tuple[int, ...]
    dtype: str  # safetensors' name: F32, BF16, ...


class Checkpoint:
    def __init__(self, directory: Path, handles: Mapping[str, Any], infos: Mapping[str, TensorInfo]) -> None:
        self.directory = directory
        self._handles = dict(handles)
        self.infos = dict(infos)

    @classmethod
    def open(cls, directory: str | Path) -> Checkpoint:
        directory = Path(directory)
        if not directory.is_dir():
            raise CheckpointNotFound(str(directory), "is not a directory")
        index = directory / INDEX
        if index.is_file():
            files = _shards(index)
        elif (directory / SINGLE).is_file():
            files = {SINGLE: []}
        elif any(directory.glob("model-*.safetensors")):
            raise CheckpointNotFound(str(index), "sharded weights without their index file")
        else:
            found = ", ".join(sorted(p.name for p in directory.iterdir())) or "nothing"
            raise CheckpointNotFound(
                str(directory / SINGLE), f"no safetensors weights (found: {found}); only safetensors is read"
            )
        handles: dict[str, Any] = {}
        infos: dict[str, TensorInfo] = {}
        for name, listed in files.items():
            path = directory / name
            if not path.is_file():
                example = f", e.g. {listed[0]!r}" if listed else ""
                raise CheckpointNotFound(
                    str(path), f"shard named by {INDEX} for {len(listed)} tensor(s){example} is missing"
                )
            try:
                handle = safe_open(str(path), framework="pt")
                keys = list(handle.keys())
                for key in keys:
                    view = handle.get_slice(key)
                    if key in infos:
                        raise CheckpointMismatch(key, f"stored twice, in {infos[key].file} and {name}")
                    infos[key] = TensorInfo(key, name, tuple(view.get_shape()), view.get_dtype())
            except SafetensorError as exc:
                raise CheckpointCorrupt(str(path), f"not a readable safetensors file: {exc}") from exc
            absent = sorted(set(listed) - set(keys))
            if absent:
                raise CheckpointMismatch(absent[0], f"{INDEX} places it in {name}, which does not hold it")
            handles[name] = handle
        return cls(directory, handles, infos)

    def check(self, expected: Mapping[str, tuple[int, ...]], optional: Iterable[str] = ()) -> None:
        """Raise `CheckpointMismatch` for a missing, unexpected, mis-shaped or non-float tensor."""
        optional = set(optional)
        for key, shape in expected.items():
            info = self.infos.get(key)
            if info is None:
                raise CheckpointMismatch(key, f"missing (expected shape {list(shape)})")
            if info.shape != tuple(shape):
                raise CheckpointMismatch(key, f"shape {list(info.shape)}, expected {list(shape)}")
            if info.dtype not in FLOAT_DTYPES:
                raise CheckpointMismatch(key, f"dtype {info.dtype}, expected one of {sorted(FLOAT_DTYPES)}")
        for key in sorted(self.infos):
            if key not in expected and key not in optional:
                raise CheckpointMismatch(key, f"unexpected tensor in {self.infos[key].file}")

    def tensor(self, key: str) -> torch.Tensor:
        return self._handles[self.infos[key].file].get_tensor(key)

    def check_finite(self, keys: Iterable[str]) -> None:
        """Raise `NonFiniteWeights` naming the first tensor holding NaN or Inf."""
        for key in keys:
            flat = self.tensor(key).reshape(-1)
            for start in range(0, flat.numel(), _CHUNK):
                if not bool(torch.isfinite(flat[start : start + _CHUNK]).all()):
                    raise NonFiniteWeights(key, int((~torch.isfinite(flat)).sum()))


def _shards(index: Path) -> dict[str, list[str]]:
    try:
        raw = json.loads(index.read_text(encoding="utf-8"))
        weight_map = raw["weight_map"]
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            raise TypeError("weight_map must map tensor names to file names")
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as exc:
        raise CheckpointCorrupt(str(index), f"not a valid index: {exc!r}") from exc
    files: dict[str, list[str]] = {}
    for key, name in weight_map.items():
        if Path(name).name != name:
            raise CheckpointCorrupt(str(index), f"shard name {name!r} for {key!r} is not a plain file name")
        files.setdefault(name, []).append(key)
    return files


Shape = tuple[int, ...]
# Turns one stored row-major weight [..., N, K] into the entries its projection holds, e.g.
# {"weight": int8, "scales": ...} for int8; None keeps the full-precision weight.
Quantizer = Callable[[torch.Tensor], dict[str, torch.Tensor]]


def stacked_experts(keys: Collection[str]) -> bool:
    """Whether a checkpoint stores its experts stacked (v5 layout) rather than one per tensor."""
    return "model.layers.0.mlp.experts.gate_up_proj" in keys


def expected_tensors(c: ModelConfig, *, stacked: bool = False) -> tuple[dict[str, Shape], set[str]]:
    """Checkpoint key -> shape for every required tensor, and the keys that may be present."""
    D, inter, E, hd = c.hidden_size, c.intermediate_size, c.num_local_experts, c.head_dim
    H, Hkv = c.num_attention_heads, c.num_key_value_heads
    expected: dict[str, Shape] = {"model.embed_tokens.weight": (c.vocab_size, D), "model.norm.weight": (D,)}
    optional: set[str] = set()
    if c.tie_word_embeddings:
        optional.add("lm_head.weight")  # some exporters store the tied copy anyway; it is ignored
    else:
        expected["lm_head.weight"] = (c.vocab_size, D)
    for n in range(c.num_hidden_layers):
        p = f"model.layers.{n}."
        expected |= {
            p + "self_attn.q_proj.weight": (H * hd, D),
            p + "self_attn.k_proj.weight": (Hkv * hd, D),
            p + "self_attn.v_proj.weight": (Hkv * hd, D),
            p + "self_attn.o_proj.weight": (D, H * hd),
            p + "input_layernorm.weight": (D,),
            p + "post_attention_layernorm.weight": (D,),
        }
        if stacked:
            expected |= {
                p + "mlp.gate.weight": (E, D),
                p + "mlp.experts.gate_up_proj": (E, 2 * inter, D),
                p + "mlp.experts.down_proj": (E, D, inter),
            }
            continue
        expected[p + "block_sparse_moe.gate.weight"] = (E, D)
        for e in range(E):
            q = f"{p}block_sparse_moe.experts.{e}."
            expected |= {
                q + "w1.weight": (inter, D),
                q + "w3.weight": (inter, D),
                q + "w2.weight": (D, inter),
            }
    return expected, optional


def _fused(
    ckpt: Checkpoint, groups: list[list[str]], device: torch.device, dtype: torch.dtype
) -> torch.Tensor:
    """Stack groups of row-concatenated tensors into one new [G, sum(rows), K] tensor: one copy."""
    first = ckpt.infos[groups[0][0]].shape
    rows = sum(ckpt.infos[k].shape[0] for k in groups[0])
    out = torch.empty((len(groups), rows, first[1]), dtype=dtype, device=device)
    for g, keys in enumerate(groups):
        start = 0
        for key in keys:
            src = ckpt.tensor(key)
            out[g, start : start + src.shape[0]].copy_(src)
            start += src.shape[0]
    return out


def _aligned(t: torch.Tensor, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """`t` itself if usable as is (device, dtype, 16-byte aligned for _grouped_mm), else one copy."""
    if (t.device, t.dtype) == (device, dtype) and t.data_ptr() % 16 == 0:
        return t
    out = torch.empty(t.shape, dtype=dtype, device=device)
    return out.copy_(t)


def build_state(
    ckpt: Checkpoint,
    c: ModelConfig,
    *,
    device: torch.device,
    dtype: torch.dtype,
    quantizer: Quantizer | None = None,
    head_quantizer: Quantizer | None = None,
    stored: Mapping[str, dict[str, torch.Tensor]] | None = None,
) -> dict[str, torch.Tensor]:
    """The engine's state dict (the names network.py's `build` reads) from a checked
    checkpoint. Tied embeddings in full precision: the head is the embedding tensor itself.
    `stored`: projections already quantized (quantized_store.py), by engine name, taken as
    they are instead of being quantized here. `head_quantizer`: the output head's, where the
    scheme keeps it at another precision (default: `quantizer`)."""
    stored = stored or {}
    stacked = stacked_experts(ckpt.infos)

    def experts(moe: str) -> dict[str, Callable[[torch.dtype], torch.Tensor]]:
        """w13 and w2, each a function of the dtype wanted: stacked once, or as stored."""
        if stacked:
            return {
                "w13": lambda dt: _aligned(ckpt.tensor(moe + "experts.gate_up_proj"), device, dt),
                "w2": lambda dt: _aligned(ckpt.tensor(moe + "experts.down_proj"), device, dt),
            }
        x, ids = moe + "experts.", range(c.num_local_experts)
        w13 = [[f"{x}{e}.w1.weight", f"{x}{e}.w3.weight"] for e in ids]
        w2 = [[f"{x}{e}.w2.weight"] for e in ids]
        return {
            "w13": lambda dt: _fused(ckpt, w13, device, dt),
            "w2": lambda dt: _fused(ckpt, w2, device, dt),
        }

    def plain(key: str) -> torch.Tensor:
        t = ckpt.tensor(key)
        return t if (t.device, t.dtype) == (device, dtype) else t.to(device=device, dtype=dtype)

    def linear(name: str, keys: list[str], how: Quantizer | None = quantizer) -> dict[str, torch.Tensor]:
        if how is not None and name in stored:
            return {f"{name}.{k}": v for k, v in stored[name].items()}
        if how is None:
            w = plain(keys[0]) if len(keys) == 1 else _fused(ckpt, [keys], device, dtype)[0]
            return {f"{name}.weight": w}
        parts = how(_fused(ckpt, [keys], device, torch.float32)[0])
        return {f"{name}.{k}": v for k, v in parts.items()}

    state: dict[str, torch.Tensor] = {
        "tok_embeddings.weight": plain("model.embed_tokens.weight"),
        "norm.weight": plain("model.norm.weight"),
    }
    if c.tie_word_embeddings and quantizer is None:
        state["output.weight"] = state["tok_embeddings.weight"]  # one tensor, as in the checkpoint
    else:
        state |= linear(
            "output",
            ["model.embed_tokens.weight" if c.tie_word_embeddings else "lm_head.weight"],
            head_quantizer or quantizer,
        )
    for n in range(c.num_hidden_layers):
        p, m = f"model.layers.{n}.", f"layers.{n}."
        a = p + "self_attn."
        state |= linear(m + "attention.wqkv", [a + "q_proj.weight", a + "k_proj.weight", a + "v_proj.weight"])
        state |= linear(m + "attention.wo", [a + "o_proj.weight"])
        state[m + "attention_norm.weight"] = plain(p + "input_layernorm.weight")
        state[m + "ffn_norm.weight"] = plain(p + "post_attention_layernorm.weight")
        moe = p + ("mlp." if stacked else "block_sparse_moe.")
        state[m + "moe.gate.weight"] = ckpt.tensor(moe + "gate.weight").to(
            device=device, dtype=torch.float32 if quantizer is not None else dtype
        )
        for name, make in experts(moe).items():
            if quantizer is None:
                state[f"{m}moe.experts.{name}"] = make(dtype)
            elif f"{m}moe.experts.{name}" in stored:
                state |= {
                    f"{m}moe.experts.{name}_{k}": v for k, v in stored[f"{m}moe.experts.{name}"].items()
                }
            else:
                state |= {f"{m}moe.experts.{name}_{k}": v for k, v in quantizer(make(torch.float32)).items()}
    return state
