"""A registry with the demo model (good and corrupted versions), built once per session."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

GOOD = "mixtral_banking_fp32-v1.0"
BAD = "mixtral_banking_fp32-v1.1"


def build_demo_registry(root: Path) -> Path:
    """The engine's own `infersight models init-demo` (good, int8 and corrupted versions)."""
    import contextlib
    import io

    from infersight.monitor.cli import main

    registry = root / "registry"
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["models", "init-demo", str(registry)]) == 0
    return registry


_BUILT: dict[str, Path] = {}


def shared_demo_registry(factory: pytest.TempPathFactory) -> Path:
    """The demo registry, built once per test session (building it takes a while)."""
    if "root" not in _BUILT:
        _BUILT["root"] = build_demo_registry(factory.mktemp("demo"))
    return _BUILT["root"]


def private_copy(registry: Path, dest: Path) -> Path:
    """A registry of the same versions with its own deploy history (checkpoints shared)."""
    shutil.copytree(registry, dest, ignore=shutil.ignore_patterns("checkpoints", "deploys.json"))
    return dest
