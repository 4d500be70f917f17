"""The native library's C is checked as C: every ISA level compiles clean with -Werror, and
the parity set (tests/_native_parity.py) passes through a build with AddressSanitizer and
UndefinedBehaviorSanitizer.

The sanitizer build is one library, at -O1, for the best level this CPU runs (the loops
production runs here; x86-64-v3 and up also have the int8-activation loops int4 needs), run
in a subprocess with libasan preloaded (Python itself is not built with it). Parity of every
packaged level against eager at full optimisation is tests/test_engine_paths.py's
`test_every_build_this_cpu_runs_decodes_alike`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from infersight.engine import isa, native

from tests._engine_checkpoints import save_checkpoint

ROOT = Path(__file__).resolve().parents[1]
SANITIZE = ("-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-fno-omit-frame-pointer")


def _compiler() -> str:
    cc = native.compiler()
    if cc is None:  # the package's own build needs one too: in CI its absence is a failure
        if os.environ.get("CI"):
            pytest.fail("no C compiler on PATH: the library's checks need one")
        pytest.skip("no C compiler on PATH")
    return cc


def _run_all(commands: list[list[str]], timeout: float) -> None:
    """Run the commands side by side; each must succeed, its first lines of errors shown if not."""
    procs = [subprocess.Popen(c, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for c in commands]
    for command, proc in zip(commands, procs, strict=True):
        _, err = proc.communicate(timeout=timeout)
        assert proc.returncode == 0, f"{' '.join(command)} failed:\n" + "\n".join(err.splitlines()[:20])


def test_every_level_compiles_without_a_warning() -> None:
    """Every level's preprocessor branches, type-checked with -Werror (-fsyntax-only: the
    sanitizer build below compiles one level in full, with the optimiser's warnings too)."""
    cc = _compiler()
    flags = [*isa.CFLAGS, "-Werror", "-fsyntax-only"]
    commands = [
        [cc, *flags, *level.cflags, str(native.CSRC / name)]
        for level in isa.levels_for()
        for name in isa.SOURCES
    ]
    _run_all(commands, timeout=600)


def test_the_sanitizer_build_passes_the_parity_set(tmp_path: Path) -> None:
    cc = _compiler()
    (level, *_) = isa.supported(isa.cpu_flags()) or pytest.fail("no packaged level runs on this CPU")
    asan = subprocess.run([cc, "-print-file-name=libasan.so"], capture_output=True, text=True).stdout.strip()
    if not Path(asan).is_file():
        pytest.fail(f"{cc} has no AddressSanitizer runtime (libasan.so)")
    flags = [f for f in isa.CFLAGS if f != "-O3"] + ["-O1", "-g", "-Werror", *SANITIZE, *level.cflags]
    objects = [tmp_path / f"{Path(name).stem}.o" for name in isa.SOURCES]
    _run_all(
        [
            [cc, *flags, "-c", str(native.CSRC / name), "-o", str(obj)]
            for name, obj in zip(isa.SOURCES, objects, strict=True)
        ],
        timeout=600,
    )
    library = tmp_path / "lib"
    library.mkdir()
    _run_all([[cc, *map(str, objects), "-o", str(library / level.library), *SANITIZE, *isa.LDFLAGS]], 120)

    checkpoints = tmp_path / "checkpoints"
    save_checkpoint(checkpoints / "tiny", 3)
    save_checkpoint(checkpoints / "window", 4, sliding_window=4)
    env = {k: v for k, v in os.environ.items() if k not in ("INFERSIGHT_ENGINE_MARCH", "PYTHONPATH")}
    env |= {
        "LD_PRELOAD": asan,
        # Python and torch are not sanitized: their leaks, and torch's new/free pairs, are not this library's
        "ASAN_OPTIONS": "detect_leaks=0:alloc_dealloc_mismatch=0:detect_odr_violation=0:halt_on_error=1",
        "UBSAN_OPTIONS": "halt_on_error=1:print_stacktrace=1",
        "INFERSIGHT_CACHE_DIR": str(tmp_path / "cache"),
        "OMP_NUM_THREADS": "2",
    }
    done = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "_native_parity.py"), str(checkpoints), str(library)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, f"exit {done.returncode}:\n{done.stderr[-6000:]}"
    assert "runtime error" not in done.stderr and "AddressSanitizer" not in done.stderr, done.stderr[-6000:]
    ran = json.loads(done.stdout.strip().splitlines()[-1])
    modes = ["fp32", "int8", "fp8", "fp32-window"] + (
        ["int8-act8", "int4"] if level.name != "x86-64-v2" else []
    )
    assert sorted(ran) == sorted([f"{m} x{rows}" for m in modes for rows in (1, 8)] + ["refusals"])
