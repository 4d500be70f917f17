"""Native decode kernels: a small C/OpenMP library built with the machine's C compiler.

What it replaces: the few-row fp32 products of decode (attention's QKV and output
projections, each expert's two projections, the lm head), and, through native_step.py,
the whole decode step. oneDNN's blocked kernel (projection.py) streams those weights from
memory, but each call goes through oneDNN's primitive cache and a thread fork-join sized for
large products; the kernel here is one pass over the packed weight, every batch row against
each 16-column block of it while that block is in L1, with the residual sum and a scale
folded in (the MoE routing weight), so nothing is written twice. The C source, with what
each entry point computes, is native_source.py.

Built once per (source, compiler, CPU model and flags) into a cache directory and loaded
with ctypes: no torch headers, so a build takes about a second, and a restart finds the
library already built. The build uses `-march=native` (or $INFERSIGHT_ENGINE_MARCH, `march`):
with AVX-512 the kernels use 512-bit FMAs and masked tails, with AVX2 and FMA 256-bit ones;
otherwise the same loops in plain C. Whether the library is *used* is not decided here:
paths.py measures it against the eager path on this machine at load and keeps the faster.

The library links OpenMP by soname (`libgomp.so.1`), which torch has already loaded, so it
shares torch's thread pool and `torch.set_num_threads` governs it too.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

from .errors import KernelUnavailable
from .native_source import SOURCE

__all__ = [
    "NativeKernels",
    "NativeProjection",
    "build",
    "compiler",
    "cpu_features",
    "cpu_model",
    "march",
    "pack",
]

FLAGS = ("-O3", "-fopenmp", "-shared", "-fPIC")
MARCH_ENV = "INFERSIGHT_ENGINE_MARCH"


def march() -> str:
    """The instruction set the library is built for: `native` (this CPU), unless
    $INFERSIGHT_ENGINE_MARCH names another gcc `-march` (say `x86-64-v3`: AVX2 and FMA, the
    256-bit loops, or `x86-64-v2`: the plain C ones). A name the compiler refuses is a failed
    build: the eager path, with one log line."""
    return os.environ.get(MARCH_ENV) or "native"


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo on Linux), else platform's processor string."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def cpu_features() -> str:
    """What `-march=native` builds for, beyond the model name (virtual machines often show one
    name, "AMD EPYC", for CPUs of different generations): family, model and the flags line of
    /proc/cpuinfo. Part of the build's key, so a cache directory carried to another machine
    never hands it a library with instructions it lacks."""
    wanted = ("cpu family", "model\t", "model ", "stepping", "flags")
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            lines = [line.strip() for line in f.read().split("\n\n", 1)[0].splitlines()]
    except OSError:
        return platform.machine()
    return "\n".join(line for line in lines if line.startswith(wanted))


def compiler() -> str | None:
    """The C compiler to build with: $CC, else cc or gcc on PATH; None when there is none."""
    for name in (os.environ.get("CC"), "cc", "gcc"):
        if name and shutil.which(name):
            return name
    return None


class NativeKernels:
    """The loaded library: `linear` (the packed product), `step` and `step_scratch` (the decode
    step: native_step.py); `avx512` and `vnni` say which loops it was built with, `int8_dot`
    whether it has int8-activation loops (VNNI, or AVX2's multiply-adds) for int8 and int4."""

    def __init__(self, path: Path) -> None:
        try:
            lib = ctypes.CDLL(str(path))
            fn = lib.infersight_linear_f32
            avx512 = bool(lib.infersight_has_avx512())
            vnni = bool(lib.infersight_has_vnni())
            int8_dot = bool(lib.infersight_has_int8_dot())
            step, step_scratch = lib.infersight_decode_step, lib.infersight_step_scratch
        except (OSError, AttributeError) as exc:
            raise KernelUnavailable(f"cannot load {path}: {exc}") from exc
        p, i64 = ctypes.c_void_p, ctypes.c_int64
        fn.argtypes = [p, p, p, p, i64, i64, i64, ctypes.c_float]
        fn.restype = None
        # native_step.py: (model, rows, ids, slots, positions, k cache, v cache, max batch,
        # max length, rope cos, rope sin, logits, scratch, threads, last row only); the scratch
        # size in floats
        step.argtypes = [p, i64, p, p, p, p, p, i64, i64, p, p, p, p, i64, i64]
        step.restype = i64  # -1, or the first bad row: its token (b), slot (B + b) or position (2B + b)
        step_scratch.argtypes = [p, i64, i64]
        step_scratch.restype = i64
        self.path, self.avx512, self.vnni, self._fn = path, avx512, vnni, fn
        self.int8_dot = int8_dot
        self.step, self.step_scratch = step, step_scratch

    @property
    def isa(self) -> str:
        """The loops the build took: "avx512-vnni", "avx512", "avx2" or "plain" (C)."""
        if self.avx512:
            return "avx512-vnni" if self.vnni else "avx512"
        return "avx2" if self.int8_dot else "plain"

    def linear(
        self,
        x: torch.Tensor,
        packed: torch.Tensor,
        n: int,
        residual: torch.Tensor | None = None,
        alpha: float = 1.0,
    ) -> torch.Tensor:
        """x [M, K] fp32, a weight [n, K] as `pack` made it -> residual + alpha * x W^T [M, n]."""
        x = x.contiguous()
        out = torch.empty((x.shape[0], n), dtype=torch.float32)
        if residual is not None:
            residual = residual.contiguous()
        self._fn(
            x.data_ptr(),
            packed.data_ptr(),
            None if residual is None else residual.data_ptr(),
            out.data_ptr(),
            x.shape[0],
            n,
            x.shape[1],
            alpha,
        )
        return out


def pack(weight: torch.Tensor) -> torch.Tensor:
    """weight [N, K] -> [ceil(N/16), K, 16] (zero rows pad N): the kernel's layout, in which a
    16-column block of the product is one contiguous run of memory."""
    N, K = weight.shape
    full, tail = divmod(N, 16)
    out = torch.empty((full + (tail > 0), K, 16), dtype=torch.float32)  # 64-byte aligned (torch's allocator)
    if full:  # one pass over the weight, whatever its strides (a column-major head too)
        out[:full].copy_(weight[: full * 16].unflatten(0, (full, 16)).transpose(1, 2))
    if tail:
        out[full].zero_()
        out[full, :, :tail].copy_(weight[full * 16 :].t())
    return out


class NativeProjection:
    """A CPU fp32 projection on the native kernel, any row count. Same calls as projection.py's
    classes: `p(x)` and `p.add(residual, x, alpha)` (the residual and the scale fused in)."""

    __slots__ = ("kernels", "n", "packed")

    def __init__(self, weight: torch.Tensor, kernels: NativeKernels) -> None:
        self.packed, self.n, self.kernels = pack(weight), weight.shape[0], kernels  # replaces the weight

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.kernels.linear(x, self.packed, self.n)

    def add(self, residual: torch.Tensor, x: torch.Tensor, alpha: float = 1.0) -> torch.Tensor:
        return self.kernels.linear(x, self.packed, self.n, residual, alpha)


def build(cache_dir: Path, *, cpu: str) -> tuple[NativeKernels, bool]:
    """Build (or find already built) the library for this CPU in `cache_dir` -> (kernels, was cached).

    Raises KernelUnavailable when there is no compiler, the build fails or the result will
    not load; the caller falls back to the eager path.
    """
    cc = compiler()
    if cc is None:
        raise KernelUnavailable("no C compiler (cc, gcc or $CC) on PATH")
    flags = (*FLAGS, f"-march={march()}")
    key = hashlib.sha256("\0".join((SOURCE, cc, *flags, cpu, cpu_features())).encode()).hexdigest()[:16]
    target = cache_dir / f"infersight_native_{key}.so"
    if target.is_file():
        return NativeKernels(target), True
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        _compile(cc, flags, cache_dir, target)
    except OSError as exc:  # an unwritable cache directory, a full disk
        raise KernelUnavailable(f"cannot build into {cache_dir}: {exc}") from exc
    return NativeKernels(target), False


def _compile(cc: str, flags: tuple[str, ...], cache_dir: Path, target: Path) -> None:
    with tempfile.TemporaryDirectory(dir=cache_dir) as tmp:
        src = Path(tmp) / "native.c"
        src.write_text(SOURCE)
        built = Path(tmp) / target.name
        try:
            done = subprocess.run(
                [cc, *flags, str(src), "-o", str(built)], capture_output=True, text=True, timeout=120
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise KernelUnavailable(f"{cc} did not run: {exc}") from exc
        if done.returncode != 0:
            first = (done.stderr.strip().splitlines() or ["no output"])[0]
            raise KernelUnavailable(f"{cc} failed ({done.returncode}): {first}")
        os.replace(built, target)  # atomic: a concurrent load sees the whole library or none
