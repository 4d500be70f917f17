"""The engine's native library: engine/csrc compiled once per instruction-set level.

Everything else about the package is pyproject.toml's. setuptools' extension machinery builds
each level as an extension of the `infersight.engine` package (a plain shared library, loaded
with ctypes: no Python headers, no `PyInit_`), named by engine/isa.py, which lists the levels
and is read here by path (it needs only the standard library). `pip install` from the sdist,
`python -m build` and an editable install (`pip install -e .`, which puts the libraries next to
engine/isa.py in the checkout) all build them; a wheel carries them, so the serving machine
needs no compiler. The extensions are optional: a machine whose compiler cannot build them
still installs the package, and the engine decodes on the eager path (native.py says so in one
log line). The levels compile in parallel. The SDK (monitor/sdk/) is pure Python.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = Path(__file__).resolve().parent


def _isa():  # engine/isa.py, without importing the package (torch)
    spec = importlib.util.spec_from_file_location("_infersight_isa", HERE / "engine" / "isa.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


class BuildLevels(build_ext):
    """build_ext for libraries rather than Python modules: the file is `libinfersight_<level>.so`
    (no ABI tag), and the compiler's command lines are CFLAGS and the level's flags alone,
    without the interpreter's own build flags (`-fwrapv`, `-g`, its `-O`)."""

    def finalize_options(self) -> None:
        super().finalize_options()
        parallel: int | bool | None = getattr(self, "parallel", None)
        if parallel is None:  # `--parallel` not given: one job per core
            self.parallel = os.cpu_count() or 1

    def build_extensions(self) -> None:
        cc = self.compiler
        for name in ("compiler_so", "linker_so"):  # unix: the program only (it honours $CC)
            if hasattr(cc, name):
                command = getattr(cc, name)
                cc.set_executable(
                    name,
                    command[: next((i for i, a in enumerate(command) if a.startswith("-")), len(command))],
                )
        super().build_extensions()

    def build_extension(self, ext: Extension) -> None:
        """The level's objects in a folder of their own (every level compiles the same files);
        skipped when the library is newer than its sources and headers."""
        target = self.get_ext_fullpath(ext.name)
        inputs = [*ext.sources, *ext.depends]
        if (
            not self.force
            and os.path.exists(target)
            and max(map(os.path.getmtime, inputs)) <= os.path.getmtime(target)
        ):
            return
        objects = self.compiler.compile(
            ext.sources,
            output_dir=os.path.join(self.build_temp, ext.name),
            extra_postargs=ext.extra_compile_args,
            depends=ext.depends,
        )
        self.compiler.link_shared_object(objects, target, extra_postargs=ext.extra_link_args, target_lang="c")

    def get_ext_filename(self, fullname: str) -> str:
        package, _, name = fullname.rpartition(".")
        return os.path.join(*package.split("."), name + ".so")


ISA = _isa()
CSRC = f"engine/{ISA.CSRC}"
setup(
    ext_modules=[
        Extension(
            "infersight.engine." + Path(level.library).stem,
            sources=[f"{CSRC}/{name}" for name in ISA.SOURCES],
            depends=[f"{CSRC}/infersight.h", f"{CSRC}/kernels.h"],
            extra_compile_args=[*ISA.CFLAGS, *level.cflags],
            extra_link_args=list(ISA.LDFLAGS),
            optional=True,
        )
        for level in ISA.levels_for()
    ],
    cmdclass={"build_ext": BuildLevels},
)
