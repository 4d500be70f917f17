"""The instruction-set levels the native library is built for, and which of them this CPU runs.

The package build (setup.py, which reads this file by path: it imports nothing but the
standard library) compiles engine/csrc once per level into `libinfersight_<level>.so` next to
this module, the way ggml builds its CPU variants; at load, native.py takes the best level the
CPU supports whose library is there and loads. On x86-64 the levels are the psABI's
microarchitecture levels, plus AVX512-VNNI, which the int8 and int4 loops use where it exists,
and AVX512-BF16, which the fp8 loop uses where it exists:

- `x86-64-v4-bf16`: the level below, plus AVX512-BF16: fp8 weights read bit for bit as bf16
  against bf16 activations (`vdpbf16ps`) (Cooper Lake, Sapphire Rapids, Zen 4);
- `x86-64-v4-vnni`: AVX-512 (F, BW, CD, DQ, VL) and AVX512-VNNI: 512-bit FMAs, `vpdpbusd`;
- `x86-64-v4`: AVX-512 without VNNI: 512-bit FMAs, int8 weights dequantised in registers;
- `x86-64-v3`: AVX2, FMA (and BMI, F16C, ...): 256-bit loops, AVX2's int8 multiply-adds;
- `x86-64-v2`: SSE4.2 and POPCNT: the plain C loops (no int8-activation loops: int4 stays eager).

Other architectures have one level, `generic` (the plain C loops, the compiler's default
target). The CPU's features are read from /proc/cpuinfo's flags (what the kernel reports the
CPU and the OS support: AVX-512 disabled by the OS is absent there); without that file
(another OS) no x86 level is assumed and the engine decodes on the eager path, unless
$INFERSIGHT_ENGINE_MARCH builds a library for the machine (native.py).
"""

from __future__ import annotations

import platform
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "CFLAGS",
    "CSRC",
    "GENERIC",
    "LDFLAGS",
    "LEVELS",
    "SOURCES",
    "Level",
    "cpu_flags",
    "levels_for",
    "library_name",
    "supported",
]

CSRC = "csrc"  # next to this module: the library's C
SOURCES = ("linear.c", "int8.c", "fp8.c", "int4.c", "decode_step.c")
# every build's flags besides its level's (setup.py's and native.py's $INFERSIGHT_ENGINE_MARCH
# ones): OpenMP linked by soname (libgomp.so.1, which torch has loaded: one thread pool), only
# the entry points of infersight.h exported
CFLAGS = ("-O3", "-fopenmp", "-fPIC", "-fvisibility=hidden", "-Wall", "-Wextra")
LDFLAGS = ("-shared", "-fopenmp", "-lm")

_V2 = frozenset({"cx16", "lahf_lm", "popcnt", "pni", "ssse3", "sse4_1", "sse4_2"})  # pni: SSE3
_V3 = _V2 | {"avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "abm", "movbe", "xsave"}  # abm: LZCNT
_V4 = _V3 | {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"}


@dataclass(frozen=True)
class Level:
    """One build of the library: its name, the compiler flags that select it, and the
    /proc/cpuinfo flags a CPU must show to run it."""

    name: str
    cflags: tuple[str, ...]
    requires: frozenset[str]

    @property
    def library(self) -> str:
        """The file the build writes next to this module."""
        return library_name(self.name)


LEVELS: tuple[Level, ...] = (  # best first
    Level(
        "x86-64-v4-bf16",
        ("-march=x86-64-v4", "-mavx512vnni", "-mavx512bf16"),
        _V4 | {"avx512_vnni", "avx512_bf16"},
    ),
    Level("x86-64-v4-vnni", ("-march=x86-64-v4", "-mavx512vnni"), _V4 | {"avx512_vnni"}),
    Level("x86-64-v4", ("-march=x86-64-v4",), _V4),
    Level("x86-64-v3", ("-march=x86-64-v3",), _V3),
    Level("x86-64-v2", ("-march=x86-64-v2",), _V2),
)
GENERIC = Level("generic", (), frozenset())  # any other architecture: the plain C loops


def library_name(level: str) -> str:
    """`x86-64-v3` -> `libinfersight_x86_64_v3.so`."""
    return f"libinfersight_{level.replace('-', '_')}.so"


def _x86(machine: str) -> bool:
    return machine.lower() in ("x86_64", "amd64", "x86-64")


def levels_for(machine: str | None = None) -> tuple[Level, ...]:
    """The levels the package builds on (and for) an architecture: x86-64's four, else `generic`."""
    return LEVELS if _x86(machine or platform.machine()) else (GENERIC,)


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> frozenset[str] | None:
    """The first processor's `flags` line of /proc/cpuinfo; None where there is no such file."""
    try:
        text = cpuinfo.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("flags"):
            return frozenset(line.split(":", 1)[1].split())
    return frozenset()


def supported(flags: frozenset[str] | None, machine: str | None = None) -> tuple[Level, ...]:
    """The levels a CPU with these flags runs, best first: x86-64's those whose flags it shows
    (none when the flags are unknown); another architecture's `generic`."""
    machine = machine or platform.machine()
    if not _x86(machine):
        return (GENERIC,)
    if flags is None:
        return ()
    return tuple(level for level in LEVELS if level.requires <= flags)
