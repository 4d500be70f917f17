"""Native decode kernels: the C/OpenMP library of engine/csrc, built with the package.

What it replaces: the few-row fp32 products of decode (attention's QKV and output
projections, each expert's two projections, the lm head), and, through native_step.py,
the whole decode step. oneDNN's blocked kernel (projection.py) streams those weights from
memory, but each call goes through oneDNN's primitive cache and a thread fork-join sized for
large products; the kernel here is one pass over the packed weight, every batch row against
each 16-column block of it while that block is in L1, with the residual sum and a scale
folded in (the MoE routing weight), so nothing is written twice. The C, with what each entry
point computes and the data layouts, is engine/csrc (its README.md).

Which library: the package build (setup.py) compiles it once per instruction-set level
(isa.py: x86-64-v2's plain C loops, v3's AVX2 and FMA, v4's AVX-512, v4 with AVX512-VNNI,
and with AVX512-BF16 too)
into `libinfersight_<level>.so` next to this module; `kernels` loads the best level this CPU
runs (its /proc/cpuinfo flags). No compiler is needed on the serving machine. Where
$INFERSIGHT_ENGINE_MARCH names a gcc `-march` (`native`: this CPU, tuning included) and a C
compiler is on PATH, the library is built for that target into the cache directory instead,
once per (sources, compiler, flags, CPU); if that build fails, the packaged library serves,
with one log line. Where no library loads (another architecture, a build without the
libraries) the caller decodes on the eager path, with one log line. Whether the library is
*used* is not decided here: paths.py measures it against the eager path on this machine at
load and keeps the faster.

The library links OpenMP by soname (`libgomp.so.1`), which torch has already loaded, so it
shares torch's thread pool and `torch.set_num_threads` governs it too.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import logging
import mmap
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

from . import isa
from .errors import KernelUnavailable

__all__ = [
    "LIBRARY_DIR",
    "MARCH_ENV",
    "NativeKernels",
    "NativeProjection",
    "build",
    "compiler",
    "cpu_features",
    "cpu_model",
    "kernels",
    "march",
    "pack",
    "packaged",
    "sources",
]

log = logging.getLogger("infersight.engine")

MARCH_ENV = "INFERSIGHT_ENGINE_MARCH"
LIBRARY_DIR = Path(__file__).resolve().parent  # where setup.py puts the packaged libraries
CSRC = LIBRARY_DIR / isa.CSRC


def march() -> str | None:
    """$INFERSIGHT_ENGINE_MARCH: a gcc `-march` to build the library for at load (`native`:
    this CPU; `x86-64-v3`: AVX2 and FMA, the 256-bit loops; `x86-64-v2`: the plain C ones), or
    None: the packaged library."""
    return os.environ.get(MARCH_ENV) or None


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
    /proc/cpuinfo. Part of a $INFERSIGHT_ENGINE_MARCH build's key, so a cache directory carried
    to another machine never hands it a library with instructions it lacks."""
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


def sources() -> list[Path]:
    """The library's C files (csrc/), headers included: what a build compiles and its key hashes."""
    return sorted(CSRC.glob("*.[ch]"))


class NativeKernels:
    """The loaded library: `linear` (the packed product), `step` and `step_scratch` (the decode
    step: native_step.py); `avx512` and `vnni` say which loops it was built with, `int8_dot`
    whether it has int8-activation loops (VNNI, or AVX2's multiply-adds) for int8 and int4,
    `fp8_packed` whether it has the fp8 loop over a packed copy of the bytes (AVX2, AVX512-BF16)
    and `bf16` whether that loop reads bf16 activations (AVX512-BF16) rather than fp32 ones;
    `level` the packaged level (isa.py) or `march=...` for a $INFERSIGHT_ENGINE_MARCH build."""

    def __init__(self, path: Path, level: str) -> None:
        try:
            lib = ctypes.CDLL(str(path))
            fn = lib.infersight_linear_f32
            avx512 = bool(lib.infersight_has_avx512())
            vnni = bool(lib.infersight_has_vnni())
            int8_dot = bool(lib.infersight_has_int8_dot())
            bf16 = bool(lib.infersight_has_bf16())
            fp8_packed = bool(lib.infersight_has_fp8_packed())
            step, step_scratch = lib.infersight_decode_step, lib.infersight_step_scratch
            rows_fp8 = lib.infersight_rows_fp8
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
        rows_fp8.argtypes = [p, p, p, p, i64, i64, i64]
        rows_fp8.restype = None
        self._rows_fp8 = rows_fp8
        self.path, self.avx512, self.vnni, self._fn = path, avx512, vnni, fn
        self.int8_dot, self.bf16, self.fp8_packed, self.level = int8_dot, bf16, fp8_packed, level
        # what a measured verdict holds for (paths.py): this build of the library, by its bytes
        self.key = f"{path.stem}-{hashlib.sha256(path.read_bytes()).hexdigest()[:12]}"
        self.step, self.step_scratch = step, step_scratch
        self.arena = HugePageArena()  # the packed weights of the models these kernels serve

    @property
    def isa(self) -> str:
        """The loops the build took: "avx512-bf16", "avx512-vnni", "avx512", "avx2" or "plain" (C)."""
        if self.avx512:
            return "avx512-bf16" if self.bf16 else "avx512-vnni" if self.vnni else "avx512"
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

    def rows_fp8(self, x: torch.Tensor, weight: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
        """x [M, K] fp32, weight [N, K] float8_e4m3fn, scales [N] -> x (scales * W)^T [M, N]: the
        decode step's fp8 loop on its own (engine/csrc/int8.c; x rounded to bf16 where `bf16`),
        for tests."""
        x = x.float().contiguous()
        w = weight.contiguous().view(torch.uint8)
        s = scales.float().contiguous()
        out = torch.empty((x.shape[0], w.shape[0]), dtype=torch.float32)
        self._rows_fp8(
            x.data_ptr(), w.data_ptr(), s.data_ptr(), out.data_ptr(), x.shape[0], w.shape[0], x.shape[1]
        )
        return out


class HugePageArena:
    """Memory for packed weights, carved out of large anonymous mappings that the kernel is
    asked to back with transparent huge pages (`madvise(MADV_HUGEPAGE)`; the usual THP
    setting, "madvise", grants it only to mappings that ask).

    Why: a decode step streams every weight once, and at batch 1 its speed is the memory
    stream's. With 4 KiB pages the core's stream prefetchers stop at every page boundary and
    each page costs a TLB walk; a model's thin projections (a few MB each, torch's allocator
    giving each its own 4 KiB-paged block) then stream markedly slower than one long read.
    2 MiB pages remove both. Tensors are bump-allocated, 64-byte aligned, in chunks of
    `chunk_bytes` (a larger tensor gets a mapping of its own); a chunk's mapping lives while
    any tensor in it does (each tensor holds a reference). Where the kernel does not grant
    huge pages the memory is plain anonymous memory, as torch's would be."""

    _HUGE = 2 << 20
    _ALIGN = 64

    def __init__(self, chunk_bytes: int = 64 << 20) -> None:
        self.chunk_bytes = int(chunk_bytes)
        self._chunk: mmap.mmap | None = None
        self._offset = 0  # the next free byte of the current chunk
        self._end = 0

    def empty(self, shape: tuple[int, ...], dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """An uninitialised contiguous tensor of `shape` in huge-page-advised memory."""
        count = 1
        for n in shape:
            count *= int(n)
        nbytes = count * torch.empty((), dtype=dtype).element_size()
        if nbytes == 0:
            return torch.empty(shape, dtype=dtype)
        if nbytes > self.chunk_bytes // 4:  # its own mapping: a chunk's tail is not wasted on it
            chunk, offset = self._map(nbytes)
        else:
            if self._chunk is None or self._offset + nbytes > self._end:
                self._chunk, self._offset = self._map(self.chunk_bytes)
                self._end = self._offset + self.chunk_bytes
            chunk, offset = self._chunk, self._offset
            self._offset += -(-nbytes // self._ALIGN) * self._ALIGN
        flat = torch.frombuffer(chunk, dtype=torch.uint8, count=nbytes, offset=offset)
        return flat.view(dtype).view(shape)

    def _map(self, nbytes: int) -> tuple[mmap.mmap, int]:
        """A fresh mapping of `nbytes` starting at a 2 MiB boundary -> (mapping, that start's offset)."""
        # private: a shared anonymous mapping is shmem, which THP's setting for anonymous memory skips
        m = mmap.mmap(-1, nbytes + self._HUGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        if hasattr(mmap, "MADV_HUGEPAGE"):
            with contextlib.suppress(OSError):  # a kernel without THP: 4 KiB pages, as torch's own
                m.madvise(mmap.MADV_HUGEPAGE)
        address = ctypes.addressof(ctypes.c_char.from_buffer(m))
        return m, -address % self._HUGE


def pack(weight: torch.Tensor, arena: HugePageArena | None = None) -> torch.Tensor:
    """weight [N, K] -> [ceil(N/16), K, 16] (zero rows pad N): the kernel's layout, in which a
    16-column block of the product is one contiguous run of memory. Allocated from `arena`
    when given (huge pages), else by torch."""
    N, K = weight.shape
    full, tail = divmod(N, 16)
    shape = (full + (tail > 0), K, 16)
    # 64-byte aligned either way (torch's allocator, the arena's bump)
    out = arena.empty(shape) if arena is not None else torch.empty(shape, dtype=torch.float32)
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
        # replaces the weight; in the kernels' huge-page arena
        self.packed, self.n, self.kernels = pack(weight, kernels.arena), weight.shape[0], kernels

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.kernels.linear(x, self.packed, self.n)

    def add(self, residual: torch.Tensor, x: torch.Tensor, alpha: float = 1.0) -> torch.Tensor:
        return self.kernels.linear(x, self.packed, self.n, residual, alpha)


def packaged(flags: frozenset[str] | None = None, machine: str | None = None) -> NativeKernels:
    """The best packaged library this CPU runs (`flags`: its /proc/cpuinfo flags, read when None).

    Raises KernelUnavailable when none is there or none loads (another architecture, a
    package built without the libraries)."""
    levels = isa.supported(isa.cpu_flags() if flags is None else flags, machine)
    if not levels:
        raise KernelUnavailable(
            f"no packaged native library runs on this CPU ({machine or platform.machine()})"
        )
    failures = []
    for level in levels:
        path = LIBRARY_DIR / level.library
        if not path.is_file():
            failures.append(f"{level.name}: not built")
            continue
        try:
            return NativeKernels(path, level.name)
        except KernelUnavailable as exc:
            failures.append(f"{level.name}: {exc}")
    raise KernelUnavailable(f"no packaged native library loads ({'; '.join(failures)})")


def kernels(cache_dir: Path, *, cpu: str) -> NativeKernels:
    """The library the engine runs on: a $INFERSIGHT_ENGINE_MARCH build where that is set and
    a compiler builds it (else, with one log line, the packaged one), the packaged one otherwise.

    Raises KernelUnavailable when no library loads; the caller falls back to the eager path.
    """
    target = march()
    if target is None:
        return packaged()
    try:
        return build(cache_dir, cpu=cpu, march=target)[0]
    except KernelUnavailable as exc:
        try:
            found = packaged()
        except KernelUnavailable as none:
            raise KernelUnavailable(f"{exc}; {none}") from none
        log.warning(
            "engine: no library for $%s=%s (%s); running the packaged %s one",
            MARCH_ENV,
            target,
            exc,
            found.level,
        )
        return found


def build(cache_dir: Path, *, cpu: str, march: str = "native") -> tuple[NativeKernels, bool]:
    """Build (or find already built) the library for `-march=<march>` in `cache_dir` -> (kernels,
    was cached). The packaged libraries need none of this: it is $INFERSIGHT_ENGINE_MARCH's.

    Raises KernelUnavailable when there is no compiler, the build fails or the result will
    not load.
    """
    cc = compiler()
    if cc is None:
        raise KernelUnavailable("no C compiler (cc, gcc or $CC) on PATH")
    flags = (*isa.CFLAGS, f"-march={march}")
    files = sources()
    text = "\0".join(f"{f.name}\0{f.read_text()}" for f in files)
    key = hashlib.sha256("\0".join((text, cc, *flags, cpu, cpu_features())).encode()).hexdigest()[:16]
    target = cache_dir / f"infersight_native_{key}.so"
    if target.is_file():
        return NativeKernels(target, f"march={march}"), True
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        _compile(cc, flags, [f for f in files if f.suffix == ".c"], cache_dir, target)
    except OSError as exc:  # an unwritable cache directory, a full disk
        raise KernelUnavailable(f"cannot build into {cache_dir}: {exc}") from exc
    return NativeKernels(target, f"march={march}"), False


def _compile(cc: str, flags: tuple[str, ...], files: list[Path], cache_dir: Path, target: Path) -> None:
    with tempfile.TemporaryDirectory(dir=cache_dir) as tmp:
        built = Path(tmp) / target.name
        command = [cc, *flags, *map(str, files), "-o", str(built), *isa.LDFLAGS]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=120)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise KernelUnavailable(f"{cc} did not run: {exc}") from exc
        if done.returncode != 0:
            first = (done.stderr.strip().splitlines() or ["no output"])[0]
            raise KernelUnavailable(f"{cc} failed ({done.returncode}): {first}")
        os.replace(built, target)  # atomic: a concurrent load sees the whole library or none
