"""`load`: a Hugging Face Mixtral checkpoint directory -> a ready `MoEModel`, or a typed error.

Order matters: config, files, names and shapes, NaN/Inf, tokenizer are all checked before a
single weight is assigned, so a bad checkpoint raises and leaves nothing half-built. The
network is built on the meta device and receives its tensors with
`load_state_dict(assign=True)`: tensors used as stored stay views of the memory map.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import nn

from .checkpoint import Checkpoint, build_state, expected_tensors, stacked_experts
from .config import ModelConfig
from .errors import CheckpointNotFound, TokenizerInvalid, UnsupportedQuantization
from .model import MoEModel
from .native_step import step_for
from .network import Block, Transformer, grouped_mm_supported
from .paths import choose, settle
from .quant import QUANTIZERS, Int4Experts, Int4Linear, Int8Experts, Int8Linear, WeightFormat, weight_format

if TYPE_CHECKING:
    from tokenizers import Tokenizer

__all__ = ["load"]


def load(
    path: str | Path,
    *,
    quantize: str | None = None,
    device: str | torch.device | None = None,
    dtype: torch.dtype | None = None,
    engine_path: str = "auto",
) -> MoEModel:
    """Load a Mixtral checkpoint directory (config.json, safetensors weights, tokenizer.json).

    device: default CUDA when available, else CPU. dtype (activations and unquantized
    weights): default fp32 on CPU, bf16 elsewhere; with `quantize="int8"` or `"int4"` on CPU,
    bf16, because the int8 CPU kernel is only fast with bf16 activations (int4: see quant.py).
    engine_path: "auto" (the faster of the eager and native paths on this machine, measured
    once and cached: paths.py), "eager" or "native"; `model.engine_path` says which it runs and why.
    """
    if quantize is not None and quantize not in QUANTIZERS:
        raise UnsupportedQuantization(quantize, tuple(QUANTIZERS))
    directory = Path(path)
    if not directory.is_dir():
        raise CheckpointNotFound(str(directory), "is not a directory")
    target = torch.device(device) if device is not None else _default_device()
    if dtype is None:
        dtype = torch.float32 if target.type == "cpu" and quantize is None else torch.bfloat16

    config = ModelConfig.from_file(directory / "config.json")
    ckpt = Checkpoint.open(directory)
    expected, optional = expected_tensors(config, stacked=stacked_experts(ckpt.infos))
    ckpt.check(expected, optional)
    ckpt.check_finite(expected)
    tokenizer = _tokenizer(directory)

    chosen, kernels = choose(config, requested=engine_path, device=target, dtype=dtype, quantize=quantize)
    grouped = grouped_mm_supported(config.hidden_size, config.intermediate_size, dtype, target)
    fmt = weight_format(quantize, dtype, target) if quantize is not None else None
    quantizer = fmt.quantize if fmt is not None else None
    column_major_head = target.type == "cpu" and quantizer is None  # see layout.HEAD_LAYOUT
    state = build_state(
        ckpt, config, device=target, dtype=dtype, quantizer=quantizer, column_major_head=column_major_head
    )
    with torch.device("meta"):
        network = Transformer(config, grouped_experts=grouped)
        if fmt is not None:
            quantize_network(network, fmt)
    network.load_state_dict(state, strict=True, assign=True)
    if config.tie_word_embeddings and quantize is None and not column_major_head:
        network.output.weight = network.tok_embeddings.weight  # one tensor, as in the checkpoint
    network.init_buffers(target, kernels)
    step = step_for(network, kernels) if kernels is not None else None
    chosen = settle(chosen, network, step, quantize=quantize)
    return MoEModel(
        network,
        config,
        tokenizer=tokenizer,
        quantize=quantize,
        device=target,
        dtype=dtype,
        path=directory,
        engine_path=chosen,
        native_step=step if chosen.name == "native" else None,
    )


def _default_device() -> torch.device:
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


def _tokenizer(directory: Path) -> Tokenizer | None:
    path = directory / "tokenizer.json"
    if not path.is_file():
        return None
    from tokenizers import Tokenizer

    try:
        return Tokenizer.from_file(str(path))
    except Exception as exc:  # tokenizers raises bare Exception subclasses from Rust
        raise TokenizerInvalid(str(path), f"cannot be read by tokenizers: {exc}") from exc


def quantize_network(network: Transformer, fmt: WeightFormat) -> None:
    """Swap the modules of a (meta-device) network for their quantized twins, in place: its lm
    head, each block's attention projections and experts."""
    assert fmt.scheme in QUANTIZERS
    c = network.config

    def linear(old: nn.Module) -> Int8Linear | Int4Linear:
        assert isinstance(old, nn.Linear)
        if fmt.scheme == "int4":
            return Int4Linear(old.in_features, old.out_features, fmt)
        return Int8Linear(old.in_features, old.out_features, fmt.dtype)

    network.output = linear(network.output)
    for block in network.layers:
        assert isinstance(block, Block)
        block.attention.wqkv = linear(block.attention.wqkv)
        block.attention.wo = linear(block.attention.wo)
        sizes = (c.num_local_experts, c.hidden_size, c.intermediate_size)
        block.moe.experts = (
            Int4Experts(*sizes, fmt) if fmt.scheme == "int4" else Int8Experts(*sizes, fmt.dtype)
        )
