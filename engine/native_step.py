"""The native decode step: a whole decode step of a CPU fp32 model in one call into the C library.

Why: at batch 1 to 8 a decode step of a small MoE is mostly fixed cost, not matmul: the
eager forward runs dozens of small torch ops per layer (norms, RoPE, the cache write,
attention, routing's top-k and softmax, the expert dispatch), each a Python call and an
OpenMP fork-join. `infersight_decode_step` (engine/csrc/decode_step.c) runs the embedding
lookup, every layer (RMSNorm, QKV, RoPE, the KV-cache write, attention over each row's own
prefix, the output projection and residual, RMSNorm, router, top-k and softmax, the chosen
experts' SwiGLU weighted into the residual), the final norm and the lm head inside one
OpenMP parallel region whose phases are separated only by work-sharing barriers.

It reads the model's own tensors by pointer: the norms' weights, the embedding, the RoPE
table, the caller's KV cache, and the projections as the model holds them: fp32 models the
packed copies the native path already made (`NativeProjection`, made by network.py's
`build`, also used by prefill), int8 weight-only models the engine's own
int8 [N, K] rows and per-row scales (quant.py), with the bf16 embedding and KV cache of
those models. Copies: the router weight packed, for int8 the norms and scales in fp32, and,
where the library has int8-activation loops (AVX512-VNNI, or AVX2), packed copies of the quantised projections made here
once (int8: `pack_int8`, read with int8 activations; int4: native_int4.py's `pack_int4`,
its only layout; they add the model's quantised bytes again while the model is loaded).
A prompt can go through the same step as rows of one slot at consecutive positions
(`prefill`: every row's keys and values are written before any row attends, so the causal
mask comes from the positions), where paths.py measured that faster than the eager forward
for its length; block prefill and the full forward stay on the per-op path, with the same
cache layout.

Exactness: fp32 runs the same operations as the eager path in another summation order
(rounding-level differences); tests/test_engine_exact.py holds the native path, decode
included, to transformers' logits and greedy tokens. int8 computes its activations in fp32
where the eager int8 path rounds them to bf16 at every op, or (`act8`, VNNI or AVX2) quantises them
to int8 per 64-column block as llama.cpp's q8_0 does; tests/test_engine_int8.py holds all
three to the same tolerances against fp32. int4 always quantises its activations so;
tests/test_engine_int4.py holds it to the eager int4 decode and both to fp32.
"""

from __future__ import annotations

import ctypes
import logging
import math

import torch

from .errors import CacheCapacityExceeded, InvalidInput
from .native import HugePageArena, NativeKernels, NativeProjection, pack
from .native_int4 import Sources, pack_int4, plain_nibbles, scales_mins
from .network import KVCache, Layer, MoEFeedForward, RopeTable, Transformer
from .projection import Fp8Projection, Int4Projection, Int8Projection

__all__ = ["NativeStep", "step_for"]

log = logging.getLogger("infersight.engine")

_SIZES = ("D", "H", "Hkv", "hd", "I", "E", "topk", "V", "layers", "window")
_POINTERS = ("embed", "attn_norm", "wqkv", "wo", "ffn_norm", "gate", "w13", "w2", "norm", "head")
_SCALES = ("wqkv_s", "wo_s", "w13_s", "w2_s", "head_s")
_PACKED = ("wqkv", "wo", "w13", "w2", "head")  # int8 activations read these packed (`pack_int8`)


class StepModel(ctypes.Structure):
    """`infersight_model` of engine/csrc/infersight.h: the sizes, then pointers to weights or to arrays of them."""

    _fields_ = [
        *((name, ctypes.c_int64) for name in _SIZES),
        ("eps", ctypes.c_float),
        ("scale", ctypes.c_float),
        *((name, ctypes.c_void_p) for name in _POINTERS),
        ("quantized", ctypes.c_int64),
        *((name, ctypes.c_void_p) for name in _SCALES),
        ("act8", ctypes.c_int64),
        *((name + "_p", ctypes.c_void_p) for name in _PACKED),
        *((name + "_ps", ctypes.c_void_p) for name in _PACKED),
        ("head_quantized", ctypes.c_int64),
        ("int4_group", ctypes.c_int64),
        ("fp8_packed", ctypes.c_int64),
    ]


Weights = tuple[torch.Tensor, torch.Tensor | None]
"""A projection as the C step reads it: packed fp32 (no scales), int8 [N, K] and fp32 scales
[N], fp8 the same with its e4m3 bytes (dtype uint8), or int4 packed (native_int4.py; its
scales inside) with an empty scales tensor."""

PREFILL_CHUNK = 64  # prompt tokens per native step in `prefill`: the weights are read once per chunk
_INT4 = torch.empty(0, dtype=torch.uint8)  # the scales of an int4 `Weights`: inside the packed blocks


class _Int4Packer:
    """Packs a model's int4 projections (native_int4.py), from the fp16 scales and mins a build
    carries (`Int4Projection.exact`) or from the scales and zeros quant.py made, and keeps the
    group size of those whose K is a multiple of 64: the C step takes one (`int4_group`);
    other K are grouped by 32 always."""

    def __init__(self, arena: HugePageArena | None = None) -> None:
        self.arena = arena  # where the packed blocks go (huge pages: native.py)
        self.sources: Sources = {}  # torch's packed layouts, per shape, while this model is packed
        self.seen: set[int] = set()

    def pack(self, p: Int4Projection, *, halves: bool = False) -> torch.Tensor:
        """p's packed blocks; with `halves` (w1 | w3) the first half's blocks, then the second's."""
        k = 2 * p.weight.shape[-1]
        q = plain_nibbles(p.weight, k, p.packed, self.sources)
        mins = p.exact if p.exact is not None else scales_mins(p.scales_zeros)
        i = q.shape[0] // 2
        cuts = [(0, i), (i, q.shape[0])] if halves else [(0, q.shape[0])]
        parts = [pack_int4(q[a:b], mins[:, a:b]) for a, b in cuts]
        if k % 64 == 0:
            self.seen.update(g for _, g in parts)
        blocks = [b for b, _ in parts]
        if self.arena is None:
            return torch.cat(blocks)
        out = self.arena.empty((sum(b.shape[0] for b in blocks), *blocks[0].shape[1:]), blocks[0].dtype)
        return torch.cat(blocks, out=out)

    @property
    def group(self) -> int:
        if len(self.seen) > 1:
            raise ValueError(f"int4 groups of {sorted(self.seen)} in one model: the native step takes one")
        return next(iter(self.seen), 64)


def _weights(p: object, int4: _Int4Packer) -> Weights | None:
    if isinstance(p, NativeProjection):
        return p.packed, None
    if isinstance(p, Int8Projection):
        return p.weight.contiguous(), p.scales.float().contiguous()
    if isinstance(p, Fp8Projection):  # the same bytes, read as e4m3 by the C side (`quantized` 3)
        return p.weight.contiguous().view(torch.uint8), p.scales.float().contiguous()
    if isinstance(p, Int4Projection):
        return int4.pack(p), _INT4
    return None


def _experts(moe: MoEFeedForward, int4_ok: bool, int4: _Int4Packer) -> list[tuple[Weights, Weights]] | None:
    if isinstance(moe.loop.pairs[0][0], Int4Projection):  # w1 | w3 packed as w1's blocks, then w3's
        if not int4_ok:
            return None
        out: list[tuple[Weights, Weights]] = []
        for w13, w2 in moe.loop.pairs:
            assert isinstance(w13, Int4Projection) and isinstance(w2, Int4Projection)
            out.append(((int4.pack(w13, halves=True), _INT4), (int4.pack(w2), _INT4)))
        return out
    pairs = [(_weights(a, int4), _weights(b, int4)) for a, b in moe.loop.pairs]
    return None if any(a is None or b is None for a, b in pairs) else pairs  # type: ignore[return-value]


def _subnormal(w: torch.Tensor | None) -> bool:
    """Whether e4m3 bytes hold a subnormal code (exponent 0, mantissa not): the packed fp8 loop
    of the AVX512-BF16 build reads those as 0 (engine/csrc/fp8.c), so such weights take the
    row-major loop."""
    return w is not None and bool((((w & 0x78) == 0) & ((w & 7) != 0)).any())


def pack_int8(w: torch.Tensor, scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """int8 [N, K] and scales [N] -> the C side's packed layout (engine/csrc/int8.c, `p8_block`) and
    the scales zero-padded to whole 16-column blocks: per block of 16 rows, per 64 columns of K,
    [16 k-quads][16 rows][4 k] int8 and then the block's 16 row sums over those 64 columns (int32)."""
    n, k = w.shape
    nb, ng = -(-n // 16), -(-k // 64)
    padded = torch.zeros(nb * 16, ng * 64, dtype=torch.int8)
    padded[:n, :k] = w
    groups = padded.view(nb, 16, ng, 16, 4)  # [block, row, group, k-quad, k]
    quads = groups.permute(0, 2, 3, 1, 4).reshape(nb, ng, 1024)
    sums = groups.view(nb, 16, ng, 64).sum(-1, dtype=torch.int32).permute(0, 2, 1).contiguous()
    packed = torch.cat([quads, sums.view(torch.int8).view(nb, ng, 64)], dim=-1)
    s = torch.zeros(nb * 16, dtype=torch.float32)
    s[:n] = scales.float()
    return packed.contiguous(), s


def _pack_w13(w: torch.Tensor, scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w1 | w3 rows [2I, K] packed as w1's blocks, then w3's (their blocks line up for any I)."""
    i = w.shape[0] // 2
    (a, sa), (b, sb) = pack_int8(w[:i], scales[:i]), pack_int8(w[i:], scales[i:])
    return torch.cat([a, b]), torch.cat([sa, sb])


def pack_fp8(w: torch.Tensor) -> torch.Tensor:
    """e4m3 bytes [N, K] -> the packed fp8 loop's layout (engine/csrc/fp8.c, `f8_block`): rows padded
    to whole 16-row blocks and K to whole 64 columns with zero bytes (the value 0); per quad of 4
    rows, per 64 columns, the 4 rows' 64 bytes. A block's quads follow each other, so the loop
    reads each block as one stream."""
    n, k = w.shape
    nb, ng = -(-n // 16), -(-k // 64)
    padded = torch.zeros(nb * 16, ng * 64, dtype=torch.uint8)
    padded[:n, :k] = w
    return padded.view(nb * 4, 4, ng, 64).permute(0, 2, 1, 3).contiguous()  # [quad, chunk, row, 64]


def _pack_fp8_w13(w: torch.Tensor) -> torch.Tensor:
    """w1 | w3 rows [2I, K] packed as w1's blocks, then w3's (the step's block indices)."""
    i = w.shape[0] // 2
    return torch.cat([pack_fp8(w[:i]), pack_fp8(w[i:])])


def step_for(network: Transformer, kernels: NativeKernels) -> NativeStep | None:
    """The native step over a CPU network: fp32 on the native path's packed weights
    (`build(..., kernels=)`), or int8 or int4 weight-only (bf16 activations; int4 only
    where the library has int8-activation loops) on packed copies of its own tensors. None for
    anything else (other dtypes, other devices), and, with one log line, where packing a
    quantised model's weights fails (a torch whose int4 layout this cannot read)."""
    try:
        return _step_for(network, kernels)
    except (RuntimeError, ValueError) as exc:
        log.warning("engine: no native step for this model (%s); decoding on the eager path", exc)
        return None


def _step_for(network: Transformer, kernels: NativeKernels) -> NativeStep | None:
    embeddings = network.embeddings
    if embeddings.device.type != "cpu" or embeddings.dtype not in (torch.float32, torch.bfloat16):
        return None
    # int4 models: the body's projections say it (an int4 build's head may be int8)
    int4 = isinstance(network.layers[0].attention.wqkv, Int4Projection)
    if (int4 or isinstance(network.head, Int4Projection)) and not kernels.int8_dot:
        return None
    packer = _Int4Packer(kernels.arena)
    head = _weights(network.head, packer)
    if head is None:
        return None
    layers = []
    for block in network.layers:
        qkv, wo = _weights(block.attention.wqkv, packer), _weights(block.attention.wo, packer)
        experts = _experts(block.moe, int4, packer)
        if qkv is None or wo is None or experts is None:
            return None
        layers.append((block, qkv, wo, experts))
    quantized = head[1] is not None

    def kind(w: Weights) -> str:
        if w[1] is None:
            return "fp32"
        return "int4" if w[1] is _INT4 else "fp8" if w[0].dtype == torch.uint8 else "int8"

    kinds = {kind(w) for _, qkv, wo, experts in layers for w in (qkv, wo, *(x for e in experts for x in e))}
    want = torch.bfloat16 if quantized else torch.float32
    # an int4 build's head kept at int8 (read with the int8 activations too); fp8's always is
    int8_head = kinds in ({"int4"}, {"fp8"}) and kind(head) == "int8"
    if (kinds != {kind(head)} and not int8_head) or embeddings.dtype != want:
        return None
    return NativeStep(network, kernels, head, layers, int4_group=packer.group)


class NativeStep:
    """`step(cache, slots, ids, positions)` -> fp32 logits [B, V]: the decode step of
    `MoEModel.decode`, one C call. Holds references to every tensor the C side reads. Made by
    `step_for`."""

    def __init__(
        self,
        network: Transformer,
        kernels: NativeKernels,
        head: Weights,
        layers: list[tuple[Layer, Weights, Weights, list[tuple[Weights, Weights]]]],
        *,
        int4_group: int = 64,
    ) -> None:
        c = network.config
        quantized, int4 = head[1] is not None, layers[0][1][1] is _INT4
        fp8 = quantized and not int4 and layers[0][1][0].dtype == torch.uint8
        # the head kept at int8: an int4 build's (int8 activations), an fp8 model's (its rows)
        int8_head = (int4 or fp8) and head[1] is not _INT4 and head[0].dtype == torch.int8
        self.kernels = kernels
        # int8 models compute in bf16 on the eager path; here activations are fp32, RoPE too
        self.rope = RopeTable(network.rope.inv_freq, torch.float32) if quantized else network.rope
        keep: list[object] = []  # every tensor and array the struct points into

        def array(tensors: list[torch.Tensor | None]) -> int:
            if any(t is None for t in tensors):
                return 0
            arr = (ctypes.c_void_p * len(tensors))(*(t.data_ptr() for t in tensors if t is not None))
            keep.extend((arr, *tensors))
            return ctypes.addressof(arr)

        def fp32(t: torch.Tensor) -> torch.Tensor:
            return t.float().contiguous()

        def resident(t: torch.Tensor) -> torch.Tensor:
            """A copy the step alone reads, moved into the kernels' huge-page arena (native.py)."""
            out = kernels.arena.empty(tuple(t.shape), t.dtype)
            out.copy_(t)
            return out

        columns: dict[str, list[torch.Tensor | None]] = {
            k: []
            for k in (
                "attn_norm",
                "ffn_norm",
                "gate",
                "wqkv",
                "wqkv_s",
                "wo",
                "wo_s",
                "w13",
                "w13_s",
                "w2",
                "w2_s",
            )
        }
        for block, qkv, wo, experts in layers:
            columns["attn_norm"].append(fp32(block.attention_norm))
            columns["ffn_norm"].append(fp32(block.ffn_norm))
            columns["gate"].append(pack(fp32(block.moe.gate)))
            for name, (w, scales) in (("wqkv", qkv), ("wo", wo)):
                columns[name].append(w)
                columns[name + "_s"].append(scales)
            for up, down in experts:
                for name, (w, scales) in (("w13", up), ("w2", down)):
                    columns[name].append(w)
                    columns[name + "_s"].append(scales)
        head_p: torch.Tensor | None = None
        head_ps: torch.Tensor | None = None
        if int4:  # the packed blocks hold the scales; `_p` (what int8 activations read) the same
            for name in _PACKED[:4]:
                columns[name + "_s"] = [None]
                columns[name + "_p"] = columns[name]
            head_p = head[0]
            if int8_head:
                assert head[1] is not None
                head_p, head_ps = (resident(t) for t in pack_int8(head[0], head[1]))
                keep.extend((head_p, head_ps))
        elif quantized and kernels.int8_dot and not fp8:  # int8 activations: packed copies, made here
            for name in _PACKED[:4]:
                packer = _pack_w13 if name == "w13" else pack_int8
                pairs = [packer(w, sc) for w, sc in zip(columns[name], columns[name + "_s"], strict=True)]  # type: ignore[arg-type]
                columns[name + "_p"] = [resident(p) for p, _ in pairs]
                columns[name + "_ps"] = [resident(p) for _, p in pairs]
            assert head[1] is not None
            head_p, head_ps = (resident(t) for t in pack_int8(head[0], head[1]))
            keep.extend((head_p, head_ps))
        # fp8 on builds with the packed loop (AVX2: fp32 activations; AVX512-BF16: bf16 ones), over
        # the bytes packed for it (one stream a block; the row-major rows cost a loop much of its
        # speed on some CPUs), where no byte is a subnormal code; the int8 head packed for the
        # int8 loops
        fp8_packed = (
            fp8
            and kernels.fp8_packed
            and not any(_subnormal(w) for name in ("wqkv", "wo", "w13", "w2") for w in columns[name])
            and (int8_head or not _subnormal(head[0]))
        )
        if fp8_packed:
            for name in _PACKED[:4]:
                pack_bytes = _pack_fp8_w13 if name == "w13" else pack_fp8
                columns[name + "_p"] = [resident(pack_bytes(w)) for w in columns[name] if w is not None]
            if not int8_head:
                head_p = resident(pack_fp8(head[0]))
                keep.append(head_p)
        if fp8 and int8_head and kernels.int8_dot:
            assert head[1] is not None
            head_p, head_ps = (resident(t) for t in pack_int8(head[0], head[1]))
            keep.extend((head_p, head_ps))
        embed, norm = network.embeddings.contiguous(), fp32(network.norm)
        keep.extend((embed, norm, *head))
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
            norm=norm.data_ptr(),
            head=head[0].data_ptr(),
            head_s=head[1].data_ptr() if quantized and head[1] is not _INT4 else 0,  # type: ignore[union-attr]
            head_p=head_p.data_ptr() if head_p is not None else 0,
            head_ps=head_ps.data_ptr() if head_ps is not None else 0,
            quantized=2 if int4 else 3 if fp8 else int(quantized),
            head_quantized=1 if int8_head else 0,
            int4_group=int4_group,
            fp8_packed=int(fp8_packed),
            **{name: array(tensors) for name, tensors in columns.items()},
        )
        self._keep, self._address = keep, ctypes.addressof(self.model)
        self.quantized, self.int4, self.fp8 = quantized, int4, fp8
        self._cache_dtype = torch.bfloat16 if quantized else torch.float32
        self._cache_shape = (c.num_hidden_layers, c.num_key_value_heads, c.head_dim)
        self._scratch: dict[tuple[int, int], torch.Tensor] = {}  # (rows, threads) -> buffer
        # (prompt tokens, eager / native prefill time) as paths.py measured them; () when not measured
        self.prefill_speedups: tuple[tuple[int, float], ...] = ()

    @property
    def act8(self) -> bool:
        """int8 models: whether activations are quantised to int8 per 64-column block (VNNI's
        dpbusd, AVX2's vpmaddubsw) rather than the weights dequantised to fp32 in registers.
        paths.settle measures both."""
        return bool(self.model.act8)

    @act8.setter
    def act8(self, on: bool) -> None:
        self.model.act8 = int(on and self.quantized and not self.fp8 and self.kernels.int8_dot)

    def __call__(
        self,
        cache: KVCache,
        slots: torch.Tensor,
        ids: torch.Tensor,
        positions: torch.Tensor,
        *,
        last_only: bool = False,
    ) -> torch.Tensor:
        """ids, slots, positions [B] int64 on the CPU, slots distinct -> fp32 logits [B, V]
        (with `last_only`, [1, V]: the last row's). `prefill` passes rows of one slot. The C
        step checks every row's token id, slot and position before it writes anything
        (InvalidInput, CacheCapacityExceeded), so a decode step costs no torch reductions."""
        k = cache.k
        if k.dtype != self._cache_dtype or (k.shape[0], k.shape[2], k.shape[4]) != self._cache_shape:
            raise InvalidInput(
                f"a KV cache of {k.dtype} {list(k.shape)} is not this model's (new_cache makes one)"
            )
        B = ids.shape[0]
        threads = torch.get_num_threads()
        scratch = self._scratch.get((B, threads))
        if scratch is None:
            size = self.kernels.step_scratch(self._address, B, threads)
            scratch = self._scratch[(B, threads)] = torch.empty(size, dtype=torch.float32)
        # views of rows 0..: the table's start, as long as the cache (positions < its length)
        cos, sin = self.rope.lookup(positions, cache.max_seq_len, 0)
        logits = torch.empty((1 if last_only else B, self.model.V), dtype=torch.float32)
        ids, slots, positions = ids.contiguous(), slots.contiguous(), positions.contiguous()
        bad = self.kernels.step(
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
            int(last_only),
        )
        if bad >= 0:
            what, row = divmod(bad, B)
            if what == 0:
                raise InvalidInput(f"token ids must lie in [0, {self.model.V}), got {int(ids[row])}")
            if what == 1:
                raise CacheCapacityExceeded(
                    f"slots must lie in [0, {cache.max_batch}), got {int(slots[row])}"
                )
            raise CacheCapacityExceeded(
                f"positions must lie in [0, {cache.max_seq_len}), got {int(positions[row])}"
            )
        return logits

    def prefills(self, tokens: int) -> bool:
        """Whether `prefill` beats the eager forward for a prompt of `tokens` tokens: the ratio
        paths.py measured at the nearer of its prompt lengths (`prefill_speedups`), or yes
        where nothing was measured (a requested native path)."""
        if not self.prefill_speedups:
            return True
        _, ratio = min(self.prefill_speedups, key=lambda s: abs(math.log(s[0] / max(tokens, 1))))
        return ratio > 1.0

    def prefill(self, cache: KVCache, slot: int, ids: torch.Tensor) -> torch.Tensor:
        """A prompt ids [T] (int64, CPU) into cache slot `slot` from position 0 -> fp32 logits [V]
        of its last token: the step over the prompt's tokens as rows of one slot, in chunks of
        PREFILL_CHUNK (each chunk's rows attend to the chunks before it through the cache)."""
        return self.prefill_rows(cache, slot, ids, 0, ids.shape[0])

    def prefill_rows(
        self, cache: KVCache, slot: int, ids: torch.Tensor, begin: int, end: int
    ) -> torch.Tensor:
        """Positions begin..end-1 of prompt ids [T] into slot `slot`, whose positions before
        `begin` already hold the prompt's keys and values -> fp32 logits [V] of position end-1.
        Chunks of PREFILL_CHUNK from `begin`, so a span is computed the same way wherever the
        positions before it came from (the prefix cache's exactness rests on that)."""
        logits = None
        for start in range(begin, end, PREFILL_CHUNK):
            n = min(PREFILL_CHUNK, end - start)
            slots = torch.full((n,), slot, dtype=torch.long)
            positions = torch.arange(start, start + n)
            logits = self(cache, slots, ids[start : start + n], positions, last_only=True)
        assert logits is not None, "an empty prompt (MoEModel refuses those)"
        return logits[0]
