"""`load`: a Hugging Face Mixtral checkpoint directory -> a ready `MoEModel`, or a typed error.

Order matters: config, files, names and shapes, NaN/Inf, tokenizer are all checked before a
single weight is read, so a bad checkpoint raises and leaves nothing half-built. Then
checkpoint.py's `build_state` reads the weights and network.py's `build` makes from them the
plain objects the forward reads: tensors used as stored stay views of the memory map.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from .checkpoint import Checkpoint, build_state, expected_tensors, stacked_experts
from .config import ModelConfig
from .errors import CheckpointNotFound, TokenizerInvalid, UnsupportedQuantization
from .model import MoEModel
from .native_step import step_for
from .network import build
from .paths import annotate, choose, settle
from .quant import QUANTIZERS, weight_format
from .quantized_store import read_stored, stored_parts

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
    A build that carries its quantized weights (`infersight models quantize`: quantized_store.py)
    serves them when `quantize` is its scheme, its head at the precision it was built with.
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
    template, special = _chat_template(directory)
    config = replace(config, eos_token_ids=_stop_ids(directory, config, tokenizer, special))

    chosen, kernels = choose(config, requested=engine_path, device=target, dtype=dtype, quantize=quantize)
    fmt = weight_format(quantize, dtype, target) if quantize is not None else None
    built = read_stored(directory) if fmt is not None else None
    stored = (
        stored_parts(directory, fmt, target)
        if fmt is not None and built and built.scheme == quantize
        else None
    )
    state = build_state(
        ckpt,
        config,
        device=target,
        dtype=dtype,
        quantizer=fmt.quantize if fmt else None,
        head_quantizer=fmt.quantize_head if fmt else None,
        stored=stored,
    )
    network = build(config, state, kernels=kernels, fmt=fmt)
    del state  # what the network did not keep (stacks replaced by blocked copies) is released
    step = step_for(network, kernels) if kernels is not None else None
    chosen = annotate(settle(chosen, network, step, quantize=quantize), step, dtype)
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
        chat_template=template,
        special_tokens=special,
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


_SPECIAL = ("bos_token", "eos_token", "unk_token", "pad_token")


def _json_object(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise TokenizerInvalid(str(path), f"cannot be read as JSON: {exc}") from exc
    if not isinstance(raw, dict):
        raise TokenizerInvalid(str(path), "must hold a JSON object")
    return raw


def _chat_template(directory: Path) -> tuple[str | None, dict[str, str]]:
    """The checkpoint's chat template, as transformers finds it (chat_template.jinja, else
    tokenizer_config.json's `chat_template`: a string, or a list whose "default" entry is
    used), and the special tokens a template may name."""
    raw = _json_object(directory / "tokenizer_config.json")
    special: dict[str, str] = {}
    for key in _SPECIAL:
        value = raw.get(key)
        value = value.get("content") if isinstance(value, dict) else value  # AddedToken's form
        if isinstance(value, str):
            special[key] = value
    jinja = directory / "chat_template.jinja"
    template: Any = jinja.read_text(encoding="utf-8") if jinja.is_file() else raw.get("chat_template")
    if isinstance(template, list):
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    if template is not None and not isinstance(template, str):
        raise TokenizerInvalid(str(directory / "tokenizer_config.json"), "chat_template must be a string")
    return template or None, special


def _stop_ids(
    directory: Path, config: ModelConfig, tokenizer: Tokenizer | None, special: dict[str, str]
) -> tuple[int, ...]:
    """config.json's eos ids, plus generation_config.json's (an instruct model's end-of-turn
    token, <|im_end|>, is often named only there), as transformers' generate stops. Not
    tokenizer_config.json's eos_token: generate does not stop at it either."""
    ids = list(config.eos_token_ids)
    generation = _json_object(directory / "generation_config.json").get("eos_token_id")
    for value in generation if isinstance(generation, list) else [generation]:
        if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < config.vocab_size:
            ids.append(value)
    return tuple(dict.fromkeys(ids))
