"""The native step's parity set, as a script: `python tests/_native_parity.py CHECKPOINTS LIBRARY_DIR`.

tests/test_engine_native_build.py runs it in a subprocess against a library built with
AddressSanitizer and UndefinedBehaviorSanitizer (libasan preloaded): the engine loads the
library in LIBRARY_DIR as its packaged one, and every case decodes on it and on a reference:
fp32 on the eager path (within 1e-4 of the largest logit, as tests/test_engine_exact.py holds
the native path), int8 and int4 on the package's own optimised build of the same level (int8
within 1e-3: the integer products are exact in both, only the fp32 sums' order and FMA
contraction (-O1 against -O3) may differ; int4 within 3%, the bound tests/test_engine_int4.py
holds native int4 to eager int4 by: its activations are quantised to int8 at every product,
where one ulp can move a value across a rounding step. Each build's distance to the eager
quantised decode is tests/test_engine_paths.py's and test_engine_int4.py's). Cases:
fp32, int8 (fp32 and int8 activations), int4, fp8 (as int8's fp32-activation case), each at 1 and 8 rows (a 6-token prompt per row
through the native prefill, then 4 decode steps); fp32 under a sliding window shorter than the
sequence; and bad token ids, slots and positions refused with nothing written. Prints one JSON line: the cases that ran. Any failed check raises (exit 1); any
sanitizer report aborts (its own exit code and report on stderr).

CHECKPOINTS holds `tiny/` and `window/` (tests/_engine_checkpoints.py's, written by the caller:
transformers is not imported here).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from infersight.engine import MoEModel, load, native
from infersight.engine.errors import CacheCapacityExceeded, InvalidInput

PROMPT, STEPS, VOCAB = 6, 4, 96


def _decodes(model: MoEModel, ids: torch.Tensor, rows: int) -> torch.Tensor:
    """Logits of STEPS decode steps of `rows` rows after PROMPT-token prompts: [STEPS, rows, V]."""
    cache = model.new_cache(max_batch=rows, max_seq_len=PROMPT + STEPS)
    for row in range(rows):
        model.prefill(cache, row, ids[row, :PROMPT])
    at = range(PROMPT, PROMPT + STEPS)
    return torch.stack(
        [model.decode(cache, torch.arange(rows), ids[:rows, t], torch.full((rows,), t)) for t in at]
    )


def _close(got: torch.Tensor, want: torch.Tensor, relative: float, case: str) -> None:
    bound = relative * want.abs().max().item()
    err = (got - want).abs().max().item()
    if not err < bound:
        raise AssertionError(f"{case}: native differs from eager by {err:.3g} (bound {bound:.3g})")


def _refusals(model: MoEModel) -> None:
    """Bad rows are refused before the step writes anything."""
    cache = model.new_cache(max_batch=2, max_seq_len=8)
    model.prefill(cache, 0, torch.tensor([3, 4]))
    before = (cache.k.clone(), cache.v.clone())
    ids = torch.tensor([5, 6])
    bad = [
        (InvalidInput, torch.tensor([0, 1]), torch.tensor([5, VOCAB]), torch.tensor([2, 0])),
        (InvalidInput, torch.tensor([0, 1]), torch.tensor([-1, 5]), torch.tensor([2, 0])),
        (CacheCapacityExceeded, torch.tensor([0, 2]), ids, torch.tensor([2, 0])),
        (CacheCapacityExceeded, torch.tensor([0, -1]), ids, torch.tensor([2, 0])),
        (CacheCapacityExceeded, torch.tensor([0, 1]), ids, torch.tensor([2, 8])),
        (CacheCapacityExceeded, torch.tensor([0, 1]), ids, torch.tensor([2, -3])),
    ]
    for error, slots, tokens, positions in bad:
        try:
            model.decode(cache, slots, tokens, positions)
        except error:
            continue
        raise AssertionError(
            f"{tokens.tolist()} at slots {slots.tolist()}, {positions.tolist()} was not refused"
        )
    if not (torch.equal(cache.k, before[0]) and torch.equal(cache.v, before[1])):
        raise AssertionError("a refused step wrote into the cache")


def _load(library_dir: Path, path: Path, quantize: str | None, engine_path: str = "native") -> MoEModel:
    native.LIBRARY_DIR = library_dir  # where the packaged library is looked up
    return load(path, device="cpu", quantize=quantize, engine_path=engine_path)


def main(checkpoints: Path, library_dir: Path) -> list[str]:
    packaged = native.LIBRARY_DIR
    torch.manual_seed(0)
    ids = torch.randint(0, VOCAB, (8, PROMPT + STEPS))
    ran: list[str] = []
    modes = [  # (name, checkpoint, quantize, int8 activations, bound relative to the largest logit)
        ("fp32", "tiny", None, False, 1e-4),
        ("int8", "tiny", "int8", False, 1e-3),
        ("int8-act8", "tiny", "int8", True, 1e-3),
        ("int4", "tiny", "int4", True, 0.03),
        ("fp8", "tiny", "fp8", False, 1e-3),
        ("fp32-window", "window", None, False, 1e-4),
    ]
    for name, ckpt, quantize, act8, bound in modes:
        model = _load(library_dir, checkpoints / ckpt, quantize)
        step = model.native_step
        if step is None or (act8 and not step.kernels.int8_dot):  # int4, int8 activations: not in plain C
            if not (act8 and model.engine_path.kernels in ("none", "plain")):
                raise AssertionError(f"{name}: no native step ({model.engine_path.describe()})")
            continue
        if step.kernels.path.parent != library_dir:
            raise AssertionError(f"{name}: the step runs {step.kernels.path}, not the build under test")
        step.act8 = act8
        if quantize is None:
            reference = _load(packaged, checkpoints / ckpt, quantize, "eager")
        else:
            reference = _load(packaged, checkpoints / ckpt, quantize)
            assert reference.native_step is not None and reference.native_step.kernels.path.parent == packaged
            reference.native_step.act8 = act8
        for rows in (1, 8):
            _close(_decodes(model, ids, rows), _decodes(reference, ids, rows), bound, f"{name} x{rows}")
            ran.append(f"{name} x{rows}")
    _refusals(_load(library_dir, checkpoints / "tiny", None))
    ran.append("refusals")
    return ran


if __name__ == "__main__":
    print(json.dumps(main(Path(sys.argv[1]), Path(sys.argv[2]))))
