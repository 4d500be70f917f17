"""Checkpoints that carry their own quantized weights: what `models quantize` writes and `load` reads.

A build made offline (GPTQ, or round-to-nearest with the head kept at int8) cannot be
re-made at load from full-precision weights: GPTQ's rounding choices depend on calibration
data the loader does not have. So the build's directory holds, beside a normal checkpoint
(config.json, tokenizer, `model.safetensors` with the quantized projections' dequantized
values: what the build computes, loadable in fp32 too):

- `quantization.json`: how it was made (`StoredQuantization`), and
- `quantized.safetensors`: per projection, under the engine's own names (checkpoint.py's
  `build_state` names, e.g. `layers.0.attention.wqkv`, `layers.0.moe.experts.w13`,
  `output`), the tensors quant.py's quantizers make in the plain layout: int4 `weight`
  (nibbles, low first) with `scales_zeros` fp32, int8 `weight` with `scales` fp32 (the head).

`load(quantize=scheme)` with the scheme the file names takes these tensors instead of
quantizing (`stored_parts`), converted to the layout the load chose (torch's packed int4
bytes, the activation dtype's scales); every int4 path then serves them as it serves its own.
The registry hashes both safetensors files and records `quantization.json` in the version.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from .errors import CheckpointCorrupt
from .native_int4 import scales_mins
from .quant import WeightFormat

__all__ = ["META", "TENSORS", "StoredQuantization", "read_stored", "stored_parts"]

META = "quantization.json"
TENSORS = "quantized.safetensors"


@dataclass(frozen=True, slots=True)
class StoredQuantization:
    """What `quantization.json` says about a build."""

    scheme: str  # the `quantize=` it loads with: "int4"
    method: str  # "gptq" or "rtn"
    group_size: int
    head: str  # the output head's scheme ("int8" or "int4"); a tied embedding's head likewise
    act_order: bool = False
    percdamp: float = 0.01
    samples: int = 0  # calibration texts used
    tokens: int = 0  # calibration tokens seen by each layer
    rtn_experts: int = 0  # experts the router sent too few tokens to, rounded to nearest instead
    source: str | None = None  # the registered version it was made from

    def to_json(self) -> dict[str, object]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: object, *, path: Path) -> StoredQuantization:
        try:
            assert isinstance(data, dict)
            return cls(**data)
        except (AssertionError, TypeError) as exc:
            raise CheckpointCorrupt(str(path), f"not a quantization record: {exc}") from exc


def read_stored(directory: Path) -> StoredQuantization | None:
    """The build's record, or None for a plain checkpoint."""
    path = directory / META
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise CheckpointCorrupt(str(path), f"unreadable: {exc}") from exc
    if not (directory / TENSORS).is_file():
        raise CheckpointCorrupt(str(directory / TENSORS), f"missing, though {META} names a quantized build")
    return StoredQuantization.from_json(data, path=path)


def _packed_int4(weight: torch.Tensor) -> torch.Tensor:
    """Plain nibbles uint8 [..., N, K/2] -> torch's packed int4 CPU bytes, matrix by matrix."""
    *lead, n, half = weight.shape
    flat = weight.reshape(-1, n, half)
    q = torch.stack([flat & 15, flat >> 4], dim=-1).reshape(-1, n, 2 * half).to(torch.int32)
    out = torch.stack([torch._convert_weight_to_int4pack_for_cpu(m, 1) for m in q.unbind(0)])
    return out.reshape(*lead, n, -1)


def stored_parts(
    directory: Path, fmt: WeightFormat, device: torch.device
) -> dict[str, dict[str, torch.Tensor]]:
    """Engine name -> the tensors its projection holds, in the layout `fmt` serves."""
    from safetensors.torch import load_file

    try:
        flat = load_file(str(directory / TENSORS))
    except Exception as exc:  # safetensors raises its own error types from Rust
        raise CheckpointCorrupt(str(directory / TENSORS), f"not a readable safetensors file: {exc}") from exc
    parts: dict[str, dict[str, torch.Tensor]] = {}
    for key, t in flat.items():
        name, _, part = key.rpartition(".")
        # a copy: the file's tensors sit at any offset of its buffer, and torch's int8 and int4
        # CPU kernels crash on weights that are not aligned as its allocator aligns them
        parts.setdefault(name, {})[part] = t.clone()
    out: dict[str, dict[str, torch.Tensor]] = {}
    for name, p in parts.items():
        if "scales_zeros" in p:
            w = p["weight"]
            if fmt.packs(w.shape[-2]):
                w = _packed_int4(w)
            out[name] = {
                "weight": w.to(device),
                "scales_zeros": p["scales_zeros"].to(device, fmt.dtype),
                # the native step's fp16 scales and mins, from the file's fp32 (the activation
                # dtype's bf16 above would round a llama.cpp import's fp16 scales again)
                "scales_mins": scales_mins(p["scales_zeros"]).to(device),
            }
        elif "scales" in p:
            out[name] = {"weight": p["weight"].to(device), "scales": p["scales"].to(device, fmt.dtype)}
        else:
            raise CheckpointCorrupt(str(directory / TENSORS), f"{name}: neither scales nor scales_zeros")
    return out
