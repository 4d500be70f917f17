"""Weight-only quantization: int8 per output channel, int4 per group of a row; router in full precision.

The router gate stays full precision (a flipped expert choice costs far more than a rounded
weight). Each weight row n is stored as round(w[n] / s[n]) in int8 with s[n] = max|w[n]| / 127.

On CPU the matmul is `torch._weight_int8pack_mm`, which is fast only with bf16 activations
(with fp32 activations it is slower than fp32 `F.linear`; docs/benchmarks/engine.md),
so `load` runs int8 models with bf16 activations on CPU. The kernel crashes (SIGSEGV,
torch 2.13) when the reduction size is not a multiple of 16 and refuses empty inputs; those
cases, and other devices, dequantize on the fly instead.

Experts: the sorted (token, k) groups are contiguous, so each active expert is one
`_weight_int8pack_mm` on its slice (the loop runs over active groups only, at most tokens*k,
and reading their sizes is free on CPU). Dequantizing the active experts into a bf16
`_grouped_mm` is slower: the conversion costs more than the matmul it feeds, and reading a
quarter of the bytes is what wins at decode sizes (benchmarks/engine_moe_dispatch.py; the
figures are in docs/benchmarks/engine.md).

int4 (`quantize="int4"`, group-wise, asymmetric): each run of G consecutive weights of a row
(G = 64, or 32 when the row length is not a multiple of 64) is stored as 4-bit q in 0..15 with
w ~ (q - 8) * scale + zero, two per byte, and scales/zeros [K/G, N, 2] in the activation
dtype, the layout of torch's CPU kernel `_weight_int4pack_mm_for_cpu`. That kernel wants its
own packed byte order (made by `_convert_weight_to_int4pack_for_cpu`, and only for N a
multiple of 16); the other path unpacks plain nibbles (low nibble first) and runs a dense
matmul. Which of the two a model uses on CPU is measured once per CPU model, torch version
and activation dtype, at the first int4 load, and cached on disk (`int4_choice`).

fp8 (`quantize="fp8"`, weight-only): the rows of int8 (scale s[n] = max|w[n]| / 448, e4m3's
largest finite value) and one float8 e4m3 byte per weight, stored as torch.float8_e4m3fn,
rounded to nearest even by torch's own conversion, without subnormals (`fp8_rows`). It reads
the bytes int8 reads; what it buys is a floating grid: fine near zero, where most weights lie,
coarse at the row's extremes. The output head stays int8 (`WeightFormat.quantize_head`), the
same bytes on a grid its logits lose less on. The eager CPU path dequantizes per call; the native step decodes
the bytes in registers (engine/csrc/int8.c: to fp32, or bit for bit as bf16 against bf16
activations on CPUs with AVX512-BF16); on CUDA devices with fp8 tensor cores `fp8_matmul`
runs `fp8_scaled_matmul`: `torch._scaled_mm` with the activations cast to e4m3 per row.
"""

from __future__ import annotations

import json
import logging
import math
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from .errors import UnsupportedQuantization
from .native import cpu_model

__all__ = [
    "QUANTIZERS",
    "Int4Choice",
    "WeightFormat",
    "choice_key",
    "cpu_model",
    "fp8_dequantize",
    "fp8_matmul",
    "fp8_rows",
    "fp8_scaled_matmul",
    "int4_choice",
    "int4_dequantize",
    "int4_group_size",
    "int4_groups",
    "int4_matmul",
    "int8_rows",
    "weight_format",
]

log = logging.getLogger(__name__)


def int8_rows(w: torch.Tensor, scale_dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """w [..., N, K] -> {"weight": int8 [..., N, K], "scales": [..., N] in `scale_dtype`}."""
    w = w.float()
    scales = (w.abs().amax(dim=-1) / 127.0).clamp_min(torch.finfo(torch.float32).tiny)
    q = torch.round(w / scales.unsqueeze(-1)).clamp_(-127, 127).to(torch.int8)
    return {"weight": q, "scales": scales.to(scale_dtype)}


FP8_MAX = 448.0  # the largest finite float8 e4m3fn value


FP8_MIN_NORMAL = 2.0**-6  # e4m3's smallest normal value


def fp8_rows(w: torch.Tensor, scale_dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """w [..., N, K] -> {"weight": float8_e4m3fn [..., N, K], "scales": [..., N] in `scale_dtype`}.

    No subnormal codes: a value under the smallest normal one (2^-6 of the scale, 2^-15 of the
    row's largest) becomes 0 or +-2^-6, whichever is nearer, so that the native step's bf16
    loop, which reads codes as bf16 bit patterns, reads every byte exactly."""
    w = w.float()
    scales = (w.abs().amax(dim=-1) / FP8_MAX).clamp_min(torch.finfo(torch.float32).tiny)
    v = (w / scales.unsqueeze(-1)).clamp_(-FP8_MAX, FP8_MAX)
    small = v.abs() < FP8_MIN_NORMAL
    v = torch.where(small, torch.where(v.abs() < FP8_MIN_NORMAL / 2, 0.0, v.sign() * FP8_MIN_NORMAL), v)
    return {"weight": v.to(torch.float8_e4m3fn), "scales": scales.to(scale_dtype)}


def fp8_dequantize(weight: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """float8 weight [..., N, K] and scales [..., N] -> dense [..., N, K] in `dtype`."""
    return (weight.float() * scales.float().unsqueeze(-1)).to(dtype)


def _scaled_mm_ok(x: torch.Tensor) -> bool:
    """CUDA with fp8 tensor cores (compute capability 8.9: Ada, 9.0: Hopper, and later)."""
    return (
        x.device.type == "cuda"
        and hasattr(torch, "_scaled_mm")
        and torch.cuda.get_device_capability(x.device) >= (8, 9)
        and x.shape[0] > 0
        and x.shape[1] % 16 == 0
    )


def fp8_matmul(x: torch.Tensor, weight: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """x [M, K] @ dequant(weight [N, K] e4m3, scales [N]).T -> [M, N] in x's dtype: on fp8
    tensor cores `fp8_scaled_matmul`; elsewhere the weight is dequantized into x's dtype."""
    if _scaled_mm_ok(x) and weight.shape[0] % 16 == 0:
        return fp8_scaled_matmul(x, weight, scales)
    return F.linear(x, weight.to(x.dtype)) * scales.to(x.dtype)


def fp8_scaled_matmul(
    x: torch.Tensor, weight: torch.Tensor, scales: torch.Tensor, out_dtype: torch.dtype | None = None
) -> torch.Tensor:
    """`torch._scaled_mm` with row-wise scaling: the activations cast to e4m3 with a scale per
    row, the weight's per-channel scales as the column scales. The product is that of the
    e4m3 activations and weights, accumulated in fp32 and rounded once to `out_dtype`
    (default: x's dtype when bf16 or fp16, else bf16, what the fp8 kernels write)."""
    xs = (x.float().abs().amax(dim=1, keepdim=True) / FP8_MAX).clamp_min(1e-12)  # [M, 1]
    xq = (x.float() / xs).clamp_(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    if out_dtype is None:
        out_dtype = x.dtype if x.dtype in (torch.bfloat16, torch.float16) else torch.bfloat16
    return torch._scaled_mm(
        xq,
        weight.t(),  # column-major [K, N], what the kernel wants for its second operand
        scale_a=xs,
        scale_b=scales.float().view(1, -1),
        out_dtype=out_dtype,
    ).to(x.dtype)


INT4_GROUPS = (64, 32)  # preferred group sizes, largest first; both are kernel sizes


def int4_group_size(k: int) -> int:
    for g in INT4_GROUPS:
        if k % g == 0:
            return g
    raise UnsupportedQuantization(
        "int4",
        tuple(QUANTIZERS),
        reason=f"int4 needs hidden and intermediate sizes that are multiples of 32, got {k}",
    )


def int4_groups(w: torch.Tensor, scale_dtype: torch.dtype, *, packed: bool) -> dict[str, torch.Tensor]:
    """w [..., N, K] -> {"weight": uint8 [..., N, K/2], "scales_zeros": [..., K/G, N, 2]}.

    Per group of G weights: scale = (max - min) / 15, q = round((w - min) / scale) in 0..15,
    so w ~ (q - 8) * scale + zero with zero = min + 8 * scale (the kernel's convention).
    `packed`: the bytes in `_weight_int4pack_mm_for_cpu`'s order, else plain nibbles."""
    *lead, n, k = w.shape
    g = int4_group_size(k)
    groups = w.float().reshape(*lead, n, k // g, g)
    lo, hi = groups.amin(dim=-1), groups.amax(dim=-1)  # [..., N, K/G]
    scales = ((hi - lo) / 15.0).clamp_min(torch.finfo(torch.float32).tiny)
    q = torch.round((groups - lo.unsqueeze(-1)) / scales.unsqueeze(-1)).clamp_(0, 15).to(torch.uint8)
    q = q.reshape(*lead, n, k)
    if packed:
        flat = q.reshape(-1, n, k).to(torch.int32)
        weight = torch.stack([torch._convert_weight_to_int4pack_for_cpu(m, 1) for m in flat.unbind(0)])
        weight = weight.reshape(*lead, n, k // 2)
    else:
        weight = q[..., 0::2] | (q[..., 1::2] << 4)
    zeros = lo + 8.0 * scales
    scales_zeros = torch.stack([scales, zeros], dim=-1).transpose(-3, -2)  # [..., K/G, N, 2]
    return {"weight": weight.contiguous(), "scales_zeros": scales_zeros.to(scale_dtype).contiguous()}


def int4_dequantize(weight: torch.Tensor, scales_zeros: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Plain-nibble weight [N, K/2] and scales_zeros [K/G, N, 2] -> dense [N, K] in `dtype`."""
    n, half = weight.shape
    groups = scales_zeros.shape[0]
    q = torch.stack([weight & 15, weight >> 4], dim=-1).view(n, groups, 2 * half // groups)
    sz = scales_zeros.transpose(0, 1).to(dtype)  # [N, K/G, 2]
    return ((q.to(dtype) - 8) * sz[..., :1] + sz[..., 1:]).view(n, 2 * half)


def int4_matmul(
    x: torch.Tensor, weight: torch.Tensor, scales_zeros: torch.Tensor, packed: bool
) -> torch.Tensor:
    """x [M, K] @ dequant(weight, scales_zeros).T -> [M, N] in x's dtype."""
    if packed:
        k = x.shape[1]
        return torch._weight_int4pack_mm_for_cpu(
            x.contiguous(), weight, k // scales_zeros.shape[0], scales_zeros
        )
    return F.linear(x, int4_dequantize(weight, scales_zeros, x.dtype))


# scheme -> (weight [..., N, K], activation dtype) -> the tensors its projections hold; the
# names `load(quantize=)` accepts. int4 takes `packed=` too (see `WeightFormat`).
QUANTIZERS: dict[str, Callable[..., dict[str, torch.Tensor]]] = {
    "int8": int8_rows,
    "int4": int4_groups,
    "fp8": fp8_rows,
}


@dataclass(frozen=True, slots=True)
class Int4Choice:
    """Which int4 path a CPU model runs, and what the measurement that chose it found."""

    packed: bool  # torch's packed int4 kernel (True) or unpack + dense matmul
    packed_us: float  # median us per call at one row, the probe shape below
    dequant_us: float
    measured_s: float  # time the measurement took when it was made
    cached: bool  # read from the on-disk cache rather than measured in this process


_PROBE = (4096, 1024)  # (N, K): a decode-sized projection, 2 MiB in int4 (streamed, not cached)
_CHOICES: dict[str, Int4Choice] = {}  # per process: the file is read at most once per key


def _cache_file() -> Path:
    root = os.environ.get("INFERSIGHT_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "infersight"
    )
    return Path(root) / "kernel_choices.json"


def _measure_int4(dtype: torch.dtype, budget_s: float = 2.0) -> Int4Choice:
    """Median time of each path at one row (batch-1 decode), alternated call by call: 3 warm-up
    rounds, then up to 20 measured ones within `budget_s` (a loaded machine gets fewer)."""
    started = time.perf_counter()
    n, k = _PROBE
    w = torch.randn(n, k, generator=torch.Generator().manual_seed(0)) * 0.02
    plain = int4_groups(w, dtype, packed=False)
    x = torch.randn(1, k).to(dtype)
    try:  # a torch build without the packed kernel, or one refusing this dtype: unpack + dense
        packed = int4_groups(w, dtype, packed=True)
        int4_matmul(x, packed["weight"], packed["scales_zeros"], True)
    except (RuntimeError, AttributeError, NotImplementedError) as exc:
        log.info("int4: torch's packed CPU kernel is unavailable (%s); using unpack + dense", exc)
        return Int4Choice(False, math.inf, 0.0, time.perf_counter() - started, False)
    times: dict[bool, list[float]] = {True: [], False: []}
    for i in range(23):
        for is_packed, parts in ((True, packed), (False, plain)):
            t = time.perf_counter()
            int4_matmul(x, parts["weight"], parts["scales_zeros"], is_packed)
            if i >= 3:  # the first calls warm the caches and the kernels
                times[is_packed].append(time.perf_counter() - t)
        if i >= 5 and time.perf_counter() - started > budget_s:
            break
    packed_us, dequant_us = (statistics.median(times[p]) * 1e6 for p in (True, False))
    return Int4Choice(packed_us <= dequant_us, packed_us, dequant_us, time.perf_counter() - started, False)


def choice_key(dtype: torch.dtype) -> str:
    return f"int4|{cpu_model()}|torch {torch.__version__}|{dtype}"


def int4_choice(dtype: torch.dtype) -> Int4Choice:
    """The int4 CPU path for this CPU model, torch version and activation dtype: measured at
    the first int4 load and cached in `$INFERSIGHT_CACHE_DIR` (default ~/.cache/infersight);
    an unreadable or unwritable cache only means measuring again."""
    key = choice_key(dtype)
    if key in _CHOICES:
        return _CHOICES[key]
    path = _cache_file()
    try:
        stored = json.loads(path.read_text())
        choice = Int4Choice(**(stored[key] | {"cached": True}))
    except (OSError, ValueError, KeyError, TypeError):
        stored = None
        choice = _measure_int4(dtype)
        log.info(
            "int4 kernel for %s: %s (packed %.0f us, dequant %.0f us, measured in %.2f s)",
            cpu_model(),
            "packed" if choice.packed else "dequant",
            choice.packed_us,
            choice.dequant_us,
            choice.measured_s,
        )
        try:
            current = json.loads(path.read_text()) if path.is_file() else {}
            current = current if isinstance(current, dict) else {}
            current[key] = asdict(choice) | {"cached": False}
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(current, indent=1, sort_keys=True))
            tmp.replace(path)
        except (OSError, ValueError):
            log.warning("int4 kernel choice not cached: %s is not writable", path)
    _CHOICES[key] = choice
    return choice


@dataclass(frozen=True, slots=True)
class WeightFormat:
    """How `load` stores quantized weights: the scheme, the activation dtype, and for int4
    whether the packed CPU kernel's layout is used (where the weight's shape allows it)."""

    scheme: str
    dtype: torch.dtype
    int4_packed: bool = False

    def packs(self, n: int) -> bool:
        return self.scheme == "int4" and self.int4_packed and n % 16 == 0

    def quantize(self, w: torch.Tensor) -> dict[str, torch.Tensor]:
        """A row-major weight [..., N, K] -> the tensors its quantized projection holds."""
        if self.scheme == "int4":
            return int4_groups(w, self.dtype, packed=self.packs(w.shape[-2]))
        if self.scheme == "fp8":
            return fp8_rows(w, self.dtype)
        return int8_rows(w, self.dtype)

    def quantize_head(self, w: torch.Tensor) -> dict[str, torch.Tensor]:
        """The output head [V, D] (a tied embedding's copy): fp8 keeps it at int8, as int4
        builds do. A logit is one long dot product whose error the softmax reads directly, and
        e4m3's three mantissa bits cost it far more than int8's uniform grid at the same bytes;
        the body's projections feed a normalized residual stream, which forgives them."""
        if self.scheme == "fp8":
            return int8_rows(w, self.dtype)
        return self.quantize(w)


def weight_format(scheme: str, dtype: torch.dtype, device: torch.device) -> WeightFormat:
    if scheme == "int4" and device.type == "cpu":
        return WeightFormat(scheme, dtype, int4_packed=int4_choice(dtype).packed)
    return WeightFormat(scheme, dtype)


def _packed_kernel_ok(x: torch.Tensor, k: int) -> bool:
    return x.device.type == "cpu" and k % 16 == 0 and x.shape[0] > 0


def int8_matmul(x: torch.Tensor, weight: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """x [M, K] @ dequant(weight [N, K], scales [N]).T -> [M, N] in x's dtype."""
    if _packed_kernel_ok(x, weight.shape[1]):
        return torch._weight_int8pack_mm(x.contiguous(), weight, scales)
    return F.linear(x, weight.to(x.dtype)) * scales
