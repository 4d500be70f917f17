"""Write a GGUF from a transformers Mixtral the way llama.cpp's convert_hf_to_gguf.py does.

Its tensor names (`blk.N.attn_q.weight`, `blk.N.ffn_gate_exps.weight` with the experts
stacked, `ffn_gate_inp` for the router, `output.weight` only when the head is not tied), its
Q/K row permutation for RoPE (`LlamaModel.permute(weights, n_head, n_head_kv)`, K with the
KV head count), its metadata keys (`mixtral.block_count`, `mixtral.rope.freq_base`, ...),
norms kept F32 and 2-D weights in the chosen type (its `--outtype f32|q8_0`; q4_0 and q4_1 as
llama-quantize's `Q4_0`/`Q4_1` leave every 2-D weight), and a small byte-level BPE vocabulary
under `tokenizer.ggml.*`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np


def permute(w: np.ndarray, n_head: int, n_head_kv: int | None) -> np.ndarray:
    """convert_hf_to_gguf.py's LlamaModel.permute, verbatim in effect."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def byte_vocab(size: int) -> tuple[list[str], list[str], list[int]]:
    """tokens, merges and token types: the 256 byte symbols, merged letter pairs, <|endoftext|>."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    tokens = list(bytes_to_unicode().values())
    merges = []
    letters = "etaoinshrdlucmfwypvbgkqjxz"
    for a in letters:
        for b in letters:
            if len(tokens) >= size - 1:
                break
            merges.append(f"{a} {b}")
            tokens.append(a + b)
    tokens.append("<|endoftext|>")
    types = [1] * (len(tokens) - 1) + [3]
    return tokens, merges, types


def write_gguf(model: Any, path: Path, *, outtype: str = "f32", arch: str = "mixtral",
               tokens: list[str] | None = None, chat_template: str | None = None) -> Path:  # fmt: skip
    import gguf

    c = model.config
    types = gguf.GGMLQuantizationType
    qtype = {"f32": types.F32, "q8_0": types.Q8_0, "q4_0": types.Q4_0, "q4_1": types.Q4_1}[outtype]
    w = gguf.GGUFWriter(path, arch)
    w.add_name("tiny mixtral")
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_block_count(c.num_hidden_layers)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_rope_freq_base(c.rope_parameters["rope_theta"])
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_expert_count(c.num_local_experts)
    w.add_expert_used_count(c.num_experts_per_tok)
    w.add_file_type(
        getattr(gguf.LlamaFileType, "ALL_F32" if outtype == "f32" else f"MOSTLY_{outtype.upper()}")
    )
    w.add_vocab_size(c.vocab_size)
    w.add_rope_dimension_count(c.head_dim)
    vocab, merges, types = byte_vocab(c.vocab_size)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt2")
    w.add_token_list(tokens if tokens is not None else vocab)
    w.add_token_merges(merges)
    w.add_token_types(types if tokens is None else [1] * len(tokens))
    w.add_eos_token_id(len(vocab) - 1)
    w.add_bos_token_id(len(vocab) - 1)
    if chat_template is not None:
        w.add_chat_template(chat_template)

    def put(name: str, t: Any) -> None:
        data = t.detach().float().numpy()
        if data.ndim >= 2 and qtype != gguf.GGMLQuantizationType.F32:
            w.add_tensor(name, gguf.quants.quantize(data, qtype), raw_dtype=qtype)
        else:
            w.add_tensor(name, data)

    sd = model.state_dict()
    H, Hkv, inter = c.num_attention_heads, c.num_key_value_heads, c.intermediate_size
    put("token_embd.weight", sd["model.embed_tokens.weight"])
    put("output_norm.weight", sd["model.norm.weight"])
    if not c.tie_word_embeddings:
        put("output.weight", sd["lm_head.weight"])
    for n in range(c.num_hidden_layers):
        p, b = f"model.layers.{n}.", f"blk.{n}."
        import torch

        put(b + "attn_q.weight", torch.from_numpy(permute(sd[p + "self_attn.q_proj.weight"].numpy(), H, H)))
        put(b + "attn_k.weight", torch.from_numpy(permute(sd[p + "self_attn.k_proj.weight"].numpy(), H, Hkv)))
        put(b + "attn_v.weight", sd[p + "self_attn.v_proj.weight"])
        put(b + "attn_output.weight", sd[p + "self_attn.o_proj.weight"])
        put(b + "attn_norm.weight", sd[p + "input_layernorm.weight"])
        put(b + "ffn_norm.weight", sd[p + "post_attention_layernorm.weight"])
        put(b + "ffn_gate_inp.weight", sd[p + "mlp.gate.weight"])
        gate_up = sd[p + "mlp.experts.gate_up_proj"]  # [E, 2I, D]: w1 (gate) rows, then w3 (up)
        put(b + "ffn_gate_exps.weight", gate_up[:, :inter])
        put(b + "ffn_up_exps.weight", gate_up[:, inter:])
        put(b + "ffn_down_exps.weight", sd[p + "mlp.experts.down_proj"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def tiny_mixtral(seed: int = 0) -> Any:
    import torch
    from transformers import MixtralConfig, MixtralForCausalLM

    torch.manual_seed(seed)
    config = MixtralConfig(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_local_experts=4,
                           num_experts_per_tok=2, max_position_embeddings=256, rope_theta=10000.0,
                           tie_word_embeddings=False)  # fmt: skip
    return MixtralForCausalLM(config).eval()
