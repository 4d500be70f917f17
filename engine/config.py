"""ModelConfig: the Mixtral hyper-parameters the engine implements, read from config.json.

Accepts what transformers v4 writes (`rope_theta`, `rope_scaling: null`) and what v5 writes
(`rope_parameters: {rope_theta, rope_type: "default"}`). Anything that would change the maths
and that the engine does not implement is refused with `UnsupportedConfig` naming the field;
keys that only matter for training or for other libraries are ignored.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import CheckpointNotFound, UnsupportedConfig

__all__ = ["ModelConfig"]

# Keys that do not change inference maths (training knobs, bookkeeping, generation defaults).
_IGNORED = frozenset(
    {
        "architectures",
        "model_type",
        "transformers_version",
        "dtype",
        "torch_dtype",
        "initializer_range",
        "output_router_logits",
        "router_aux_loss_coef",
        "router_jitter_noise",  # only applied in training
        "attention_dropout",  # only applied in training
        "use_cache",
        "return_dict",
        "output_hidden_states",
        "output_attentions",
        "is_encoder_decoder",
        "tie_encoder_decoder",
        "chunk_size_feed_forward",
        "problem_type",
        "id2label",
        "label2id",
        "tokenizer_class",
        "prefix",
        "task_specific_params",
        "finetuning_task",
        "max_length",
    }
)


def _require(raw: dict[str, Any], key: str, kind: type, *, default: Any = None, positive: bool = True) -> Any:
    value = raw.get(key, default)
    if value is None:
        raise UnsupportedConfig(key, "is required")
    if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise UnsupportedConfig(key, f"must be an integer, got {value!r}")
    if kind is float:
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise UnsupportedConfig(key, f"must be a finite number, got {value!r}")
        value = float(value)
    if positive and value <= 0:
        raise UnsupportedConfig(key, f"must be > 0, got {value!r}")
    return value


def _token_ids(raw: dict[str, Any], key: str) -> tuple[int, ...]:
    value = raw.get(key)
    if value is None:
        return ()
    values = value if isinstance(value, list) else [value]
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values):
        raise UnsupportedConfig(key, f"must be a token id or a list of them, got {value!r}")
    return tuple(values)


def _rope_theta(raw: dict[str, Any]) -> float:
    params = raw.get("rope_parameters")
    scaling = raw.get("rope_scaling")
    if params is not None:
        if not isinstance(params, dict):
            raise UnsupportedConfig("rope_parameters", f"must be an object, got {params!r}")
        rope_type = params.get("rope_type", params.get("type", "default"))
        if rope_type != "default":
            raise UnsupportedConfig(
                "rope_parameters.rope_type", f"{rope_type!r} is not implemented (only 'default')"
            )
        extra = set(params) - {"rope_theta", "rope_type", "type"}
        if extra:
            raise UnsupportedConfig(f"rope_parameters.{sorted(extra)[0]}", "is not implemented")
        theta = params.get("rope_theta", raw.get("rope_theta"))
    else:
        theta = raw.get("rope_theta", 1e6)
    if scaling is not None:
        kind = scaling.get("rope_type", scaling.get("type")) if isinstance(scaling, dict) else scaling
        if kind != "default":
            raise UnsupportedConfig("rope_scaling", f"{kind!r} is not implemented (only plain RoPE)")
    return float(_require({"rope_theta": theta}, "rope_theta", float))


@dataclass(frozen=True, slots=True)
class ModelConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    num_local_experts: int
    num_experts_per_tok: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    sliding_window: int | None  # attention only looks this many tokens back; None: no limit
    tie_word_embeddings: bool
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]  # generation stops at any of these (the serving layer's job)
    pad_token_id: int | None
    checkpoint_dtype: str | None  # what config.json says the weights are stored in

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> ModelConfig:
        model_type = raw.get("model_type", "mixtral")
        if model_type != "mixtral":
            raise UnsupportedConfig("model_type", f"{model_type!r} is not a Mixtral checkpoint")
        act = raw.get("hidden_act", "silu")
        if act != "silu":
            raise UnsupportedConfig("hidden_act", f"{act!r} is not implemented (only 'silu')")
        for key in ("attention_bias", "mlp_bias"):
            if raw.get(key):
                raise UnsupportedConfig(key, "biases are not implemented in Mixtral layers")
        if raw.get("quantization_config") is not None:
            raise UnsupportedConfig("quantization_config", "pre-quantized checkpoints are not supported")
        prf = raw.get("partial_rotary_factor", 1.0)
        if prf != 1.0:
            raise UnsupportedConfig("partial_rotary_factor", f"{prf!r} is not implemented (only 1.0)")

        heads = _require(raw, "num_attention_heads", int)
        kv_heads = _require(raw, "num_key_value_heads", int, default=heads)
        if heads % kv_heads:
            raise UnsupportedConfig(
                "num_key_value_heads", f"{kv_heads} does not divide num_attention_heads={heads}"
            )
        hidden = _require(raw, "hidden_size", int)
        head_dim = raw.get("head_dim") or hidden // heads
        head_dim = _require({"head_dim": head_dim}, "head_dim", int)
        if head_dim % 2:
            raise UnsupportedConfig("head_dim", f"RoPE needs an even head_dim, got {head_dim}")
        experts = _require(raw, "num_local_experts", int)
        top_k = _require(raw, "num_experts_per_tok", int)
        if top_k > experts:
            raise UnsupportedConfig(
                "num_experts_per_tok", f"{top_k} is more than num_local_experts={experts}"
            )
        window = raw.get("sliding_window")
        if window is not None:
            window = _require(raw, "sliding_window", int)
        tie = raw.get("tie_word_embeddings", False)
        if not isinstance(tie, bool):
            raise UnsupportedConfig("tie_word_embeddings", f"must be true or false, got {tie!r}")

        known = _IGNORED | {f.name for f in cls.__dataclass_fields__.values()} | {
            "hidden_act", "attention_bias", "mlp_bias", "quantization_config", "partial_rotary_factor",
            "rope_parameters", "rope_scaling", "eos_token_id", "sliding_window",
        }  # fmt: skip
        for key in raw:
            if key not in known and not key.startswith("_"):
                raise UnsupportedConfig(key, "is not a field the engine understands")

        bos = _token_ids(raw, "bos_token_id")
        pad = _token_ids(raw, "pad_token_id")
        dtype = raw.get("dtype", raw.get("torch_dtype"))
        return cls(
            vocab_size=_require(raw, "vocab_size", int),
            hidden_size=hidden,
            intermediate_size=_require(raw, "intermediate_size", int),
            num_hidden_layers=_require(raw, "num_hidden_layers", int),
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            head_dim=head_dim,
            num_local_experts=experts,
            num_experts_per_tok=top_k,
            rms_norm_eps=_require(raw, "rms_norm_eps", float, default=1e-5),
            rope_theta=_rope_theta(raw),
            max_position_embeddings=_require(raw, "max_position_embeddings", int, default=4096 * 32),
            sliding_window=window,
            tie_word_embeddings=tie,
            bos_token_id=bos[0] if bos else None,
            eos_token_ids=_token_ids(raw, "eos_token_id"),
            pad_token_id=pad[0] if pad else None,
            checkpoint_dtype=dtype if isinstance(dtype, str) else None,
        )

    @classmethod
    def from_file(cls, path: str | Path) -> ModelConfig:
        path = Path(path)
        if not path.is_file():
            raise CheckpointNotFound(str(path), "config.json is missing")
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise UnsupportedConfig("config.json", f"cannot be read as JSON: {exc}") from exc
        if not isinstance(raw, dict):
            raise UnsupportedConfig("config.json", "must hold a JSON object")
        return cls.from_dict(raw)
