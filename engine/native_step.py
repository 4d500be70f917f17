"""The native decode step: a whole decode step of a CPU fp32 model in one call into the C library.

Why: at batch 1 to 8 a decode step of a small MoE is mostly fixed cost, not matmul: the
eager forward runs dozens of small torch ops per layer (norms, RoPE, the cache write,
attention, routing's top-k and softmax, the expert dispatch), each a Python call and an
OpenMP fork-join. `infersight_decode_step` (native.py's C source) runs the embedding
lookup, every layer (RMSNorm, QKV, RoPE, the KV-cache write, attention over each row's own
prefix, the output projection and residual, RMSNorm, router, top-k and softmax, the chosen
experts' SwiGLU weighted into the residual), the final norm and the lm head inside one
OpenMP parallel region whose phases are separated only by work-sharing barriers.

It reads the model's own tensors by pointer: the packed weights the native path already
made (`NativeProjection`, bound by `Transformer.init_buffers`), the norms' weights, the
embedding, the RoPE table and the caller's KV cache; the only copy it makes is the router
weight packed (experts x hidden floats per layer). Prefill and the full forward stay on the
per-op path; both write and read the same cache layout.

Exactness: the same operations in fp32 as the eager path, in a different summation order
(rounding-level differences); tests/test_engine_exact.py holds the native path, decode
included, to transformers' logits and greedy tokens.
"""

from __future__ import annotations

import ctypes

import torch

from .native import NativeKernels, NativeProjection, pack
from .network import Block, BlockedExperts, KVCache, Transformer

__all__ = ["NativeStep", "step_for"]

_SIZES = ("D", "H", "Hkv", "hd", "I", "E", "topk", "V", "layers", "window")
_POINTERS = ("embed", "attn_norm", "wqkv", "wo", "ffn_norm", "gate", "w13", "w2", "norm", "head")


class StepModel(ctypes.Structure):
    """`infersight_model` of the C source: the sizes, then pointers to weights or to arrays of them."""

    _fields_ = [
        *((name, ctypes.c_int64) for name in _SIZES),
        ("eps", ctypes.c_float),
        ("scale", ctypes.c_float),
        *((name, ctypes.c_void_p) for name in _POINTERS),
    ]


def step_for(network: Transformer, kernels: NativeKernels) -> NativeStep | None:
    """The native step over a network bound on the native path (`init_buffers(..., kernels)`);
    None when some weight is not on the native kernels (another dtype or device)."""
    assert network.bound is not None and network.rope is not None, "init_buffers() first"
    if network.bound.embeddings.dtype != torch.float32 or network.bound.embeddings.device.type != "cpu":
        return None
    if not isinstance(network.bound.head, NativeProjection):
        return None
    for block in network.layers:
        assert isinstance(block, Block)
        if not isinstance(block.moe.experts, BlockedExperts) or block.attention.bound is None:
            return None
        wqkv, wo = block.attention.bound
        pairs = block.moe.experts.loop.pairs
        if not all(isinstance(p, NativeProjection) for p in (wqkv, wo, *(q for pair in pairs for q in pair))):
            return None
    return NativeStep(network, kernels)


class NativeStep:
    """`step(cache, slots, ids, positions, kv_len)` -> fp32 logits [B, V]: the decode step of
    `MoEModel.decode`, one C call. Holds references to every tensor the C side reads."""

    def __init__(self, network: Transformer, kernels: NativeKernels) -> None:
        c, bound = network.config, network.bound
        assert bound is not None and network.rope is not None and isinstance(bound.head, NativeProjection)
        self.kernels, self.rope = kernels, network.rope
        keep: list[object] = []  # every tensor and array the struct points into

        def array(tensors: list[torch.Tensor]) -> int:
            arr = (ctypes.c_void_p * len(tensors))(*(t.data_ptr() for t in tensors))
            keep.extend((arr, *tensors))
            return ctypes.addressof(arr)

        norms1, qkv, wo, norms2, gates, w13, w2 = [], [], [], [], [], [], []
        for block in network.layers:
            assert isinstance(block, Block) and isinstance(block.moe.experts, BlockedExperts)
            assert block.attention.bound is not None
            a, o = block.attention.bound
            assert isinstance(a, NativeProjection) and isinstance(o, NativeProjection)
            norms1.append(block.attention_norm.weight.contiguous())
            norms2.append(block.ffn_norm.weight.contiguous())
            qkv.append(a.packed)
            wo.append(o.packed)
            gates.append(pack(block.moe.gate.weight.float()))
            for up, down in block.moe.experts.loop.pairs:
                assert isinstance(up, NativeProjection) and isinstance(down, NativeProjection)
                w13.append(up.packed)
                w2.append(down.packed)
        embed, norm = bound.embeddings.contiguous(), bound.norm.contiguous()
        keep.extend((embed, norm, bound.head.packed))
        self.model = StepModel(
            D=c.hidden_size,
            H=c.num_attention_heads,
            Hkv=c.num_key_value_heads,
            hd=c.head_dim,
            I=c.intermediate_size,
            E=c.num_local_experts,
            topk=c.num_experts_per_tok,
            V=c.vocab_size,
            layers=c.num_hidden_layers,
            window=c.sliding_window or 0,
            eps=c.rms_norm_eps,
            scale=c.head_dim**-0.5,
            embed=embed.data_ptr(),
            attn_norm=array(norms1),
            wqkv=array(qkv),
            wo=array(wo),
            ffn_norm=array(norms2),
            gate=array(gates),
            w13=array(w13),
            w2=array(w2),
            norm=norm.data_ptr(),
            head=bound.head.packed.data_ptr(),
        )
        self._keep, self._address = keep, ctypes.addressof(self.model)
        self._scratch: dict[tuple[int, int], torch.Tensor] = {}  # (rows, threads) -> buffer

    def __call__(
        self, cache: KVCache, slots: torch.Tensor, ids: torch.Tensor, positions: torch.Tensor, kv_len: int
    ) -> torch.Tensor:
        """ids, slots, positions [B] int64 on the CPU, every position < kv_len <= the cache's
        length, slots distinct and in range (MoEModel checks) -> fp32 logits [B, V]."""
        B = ids.shape[0]
        threads = torch.get_num_threads()
        scratch = self._scratch.get((B, threads))
        if scratch is None:
            size = self.kernels.step_scratch(self._address, B, threads)
            scratch = self._scratch[(B, threads)] = torch.empty(size, dtype=torch.float32)
        cos, sin = self.rope.lookup(positions, kv_len, 0)  # views of rows 0..: the whole table's start
        logits = torch.empty((B, self.model.V), dtype=torch.float32)
        ids, slots, positions = ids.contiguous(), slots.contiguous(), positions.contiguous()
        self.kernels.step(
            self._address,
            B,
            ids.data_ptr(),
            slots.data_ptr(),
            positions.data_ptr(),
            cache.k.data_ptr(),
            cache.v.data_ptr(),
            cache.max_batch,
            cache.max_seq_len,
            cos.data_ptr(),
            sin.data_ptr(),
            logits.data_ptr(),
            scratch.data_ptr(),
            threads,
        )
        return logits
