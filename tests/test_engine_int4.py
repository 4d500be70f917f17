"""quantize="int4": group-wise 4-bit weights, router gate in full precision, kernel chosen by
measurement at load and cached per CPU model.

As for int8, two separate claims: (1) both int4 paths (torch's packed CPU kernel, and unpack
+ dense matmul) compute the model whose weights are the dequantized int4 weights, and (2)
that model's next-token distributions stay close to fp32's on weights of a realistic scale.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from infersight.engine import MoEModel, Registry, load, loading
from infersight.engine.errors import InvalidVersionName, UnsupportedQuantization
from infersight.engine.native_int4 import plain_nibbles
from infersight.engine.projection import Int4Projection
from infersight.engine.quant import (
    _CHOICES,
    choice_key,
    int4_choice,
    int4_dequantize,
    int4_groups,
    int4_matmul,
)
from safetensors.torch import load_file, save_file

from tests._engine_checkpoints import save_checkpoint

# intermediate 96: not a multiple of 64, so the expert down projections use groups of 32
SHAPE = {"hidden_size": 128, "intermediate_size": 96, "vocab_size": 256, "initializer_range": 0.02}


def _quantized_keys(key: str) -> bool:
    return key.endswith("proj.weight") or ".experts." in key or key == "lm_head.weight"


@pytest.fixture(autouse=True, scope="module")
def kernel_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Every load here measures into (and reads from) a cache of its own."""
    directory = tmp_path_factory.mktemp("kernel-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("INFERSIGHT_CACHE_DIR", str(directory))
        saved = dict(_CHOICES)
        _CHOICES.clear()
        yield directory
        _CHOICES.clear()
        _CHOICES.update(saved)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("int4")
    save_checkpoint(directory, 31, **SHAPE)
    return directory


@pytest.fixture(params=["eager", "native"])
def int4_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every `load` in the test forced onto one decode path: the eager int4 kernels, or the
    native step (native_int4.py) reading packed copies of the same weights. Where the library
    lacks the int8-activation loops (VNNI or AVX2) the native case loads eager ("not
    applicable"), as a machine would."""
    choose = loading.choose
    monkeypatch.setattr(
        loading, "choose", lambda config, **kw: choose(config, **(kw | {"requested": request.param}))
    )
    return str(request.param)


def _on_path(model: MoEModel, path: str) -> None:
    if path == "eager" or model.engine_path.reason == "not applicable":
        assert model.native_step is None
    else:
        assert model.engine_path.name == "native" and model.native_step is not None


@pytest.fixture(scope="module")
def ids() -> torch.Tensor:
    return torch.randint(0, 256, (4, 24), generator=torch.Generator().manual_seed(0))


def _kl(reference: torch.Tensor, other: torch.Tensor) -> float:
    """Mean KL(reference || other) of the next-token distributions."""
    p, q = reference.log_softmax(-1), other.log_softmax(-1)
    return (p.exp() * (p - q)).sum(-1).mean().item()


@pytest.mark.parametrize("n", [64, 40])  # 40 rows: not a multiple of 16, the packed kernel refuses it
@pytest.mark.parametrize("k", [128, 96])  # groups of 64, then of 32
def test_both_int4_paths_compute_the_dequantized_weight(n: int, k: int) -> None:
    w = torch.randn(n, k, generator=torch.Generator().manual_seed(n + k)) * 0.05
    x = torch.randn(5, k, generator=torch.Generator().manual_seed(1))
    plain = int4_groups(w, torch.float32, packed=False)
    dense = int4_dequantize(plain["weight"], plain["scales_zeros"], torch.float32)
    assert plain["weight"].shape == (n, k // 2) and plain["weight"].dtype == torch.uint8
    assert plain["scales_zeros"].shape == (k // (64 if k % 64 == 0 else 32), n, 2)
    # the rounding error of 4 bits with per-group min/max: at most half a step per weight
    step = plain["scales_zeros"][..., 0].t().repeat_interleave(k // plain["scales_zeros"].shape[0], 1)
    assert ((dense - w).abs() <= step / 2 + 1e-6).all()
    reference = x @ dense.t()
    assert (int4_matmul(x, plain["weight"], plain["scales_zeros"], False) - reference).abs().max() < 1e-5
    if n % 16 == 0:
        packed = int4_groups(w, torch.float32, packed=True)
        assert torch.equal(packed["scales_zeros"], plain["scales_zeros"])
        got = int4_matmul(x, packed["weight"], packed["scales_zeros"], True)
        assert (got - reference).abs().max() < 1e-4


def test_int4_equals_the_model_with_dequantized_weights_on_both_paths(
    ckpt: Path, ids: torch.Tensor, tmp_path: Path
) -> None:
    tensors = load_file(ckpt / "model.safetensors")
    for key, w in tensors.items():
        if _quantized_keys(key):
            q = int4_groups(w, torch.float32, packed=False)
            tensors[key] = int4_dequantize(q["weight"], q["scales_zeros"], torch.float32).contiguous()
    dequantized = Path(shutil.copytree(ckpt, tmp_path / "dq"))
    save_file(tensors, dequantized / "model.safetensors", {"format": "pt"})
    reference = load(dequantized, device="cpu").logits(ids)

    chosen = int4_choice(torch.float32)
    model = load(ckpt, device="cpu", quantize="int4", dtype=torch.float32)
    assert isinstance(model.network.head, Int4Projection) and model.network.head.packed is chosen.packed
    assert (model.logits(ids) - reference).abs().max().item() < 1e-4
    # the path the measurement did not pick, forced: the same model
    _CHOICES[choice_key(torch.float32)] = replace(chosen, packed=not chosen.packed)
    try:
        forced = load(ckpt, device="cpu", quantize="int4", dtype=torch.float32)
    finally:
        _CHOICES[choice_key(torch.float32)] = chosen
    assert isinstance(forced.network.head, Int4Projection) and forced.network.head.packed is not chosen.packed
    assert (forced.logits(ids) - reference).abs().max().item() < 1e-4


def test_int4_next_token_distributions_stay_close_to_fp32(
    ckpt: Path, ids: torch.Tensor, int4_path: str
) -> None:
    fp32 = load(ckpt, device="cpu")
    int8, int4 = load(ckpt, device="cpu", quantize="int8"), load(ckpt, device="cpu", quantize="int4")
    _on_path(int4, int4_path)
    a, b8, b4 = fp32.logits(ids), int8.logits(ids), int4.logits(ids)
    assert int4.dtype == torch.bfloat16 and b4.dtype == torch.float32 and b4.shape == a.shape
    # stated bounds: max abs error under 30% of the largest logit, mean KL under 0.01 nats;
    # int4 is coarser than int8 (16 levels per group against 255 per row), and it shows
    assert (a - b4).abs().max().item() < 0.3 * a.abs().max().item()
    kl4, kl8 = _kl(a, b4), _kl(a, b8)
    assert kl4 < 0.01
    assert kl8 < kl4


def test_router_gate_stays_full_precision_and_the_rest_is_int4(ckpt: Path) -> None:
    model = load(ckpt, device="cpu", quantize="int4")
    stored = load_file(ckpt / "model.safetensors")
    net = model.network
    assert model.quantize == "int4"
    projections = list(net.projections())
    assert all(isinstance(p, Int4Projection) and p.weight.dtype == torch.uint8 for p in projections)
    for n, block in enumerate(net.layers):
        w13, w2 = block.moe.loop.pairs[0]
        assert isinstance(w13, Int4Projection) and isinstance(w2, Int4Projection)
        assert w13.scales_zeros.shape[0] == 128 // 64 and w2.scales_zeros.shape[0] == 96 // 32
        gate = block.moe.gate
        assert gate.dtype == torch.float32
        assert torch.equal(gate, stored[f"model.layers.{n}.block_sparse_moe.gate.weight"])
    full = sum(v.numel() * 4 for k, v in stored.items() if _quantized_keys(k))
    held = sum(p.weight.numel() for p in projections)  # type: ignore[union-attr]
    assert held == full // 8  # half a byte per weight


def test_int4_serving_hooks_agree_with_its_full_forward(
    ckpt: Path, ids: torch.Tensor, int4_path: str
) -> None:
    model = load(ckpt, device="cpu", quantize="int4")
    _on_path(model, int4_path)
    cache = model.new_cache(max_batch=2, max_seq_len=32)
    full = model.logits(ids[:1, :10])[0]
    last = model.prefill(cache, 1, ids[0, :9])
    step = model.decode(cache, torch.tensor([1]), ids[0, 9:10], torch.tensor([9]))[0]
    scale = full.abs().max().item()
    assert (last - full[8]).abs().max().item() < 0.05 * scale
    assert (step - full[9]).abs().max().item() < 0.05 * scale


@pytest.mark.parametrize("packed", [True, False])
def test_the_native_int4_step_computes_the_eager_int4_decode(
    ckpt: Path, ids: torch.Tensor, packed: bool
) -> None:
    """The native step reads either storage (torch's packed bytes or plain nibbles) into its
    own layout; against the eager int4 decode of the same weights it differs only by its int8
    activations (per 64 columns) and fp32 accumulation: stated bound 3% of the largest logit,
    and on every row and step a greedy token of the eager decode: its argmax, or where the
    eager decode's bf16 logits tie exactly for the maximum, one of the tied tokens."""
    chosen = int4_choice(torch.bfloat16)
    _CHOICES[choice_key(torch.bfloat16)] = replace(chosen, packed=packed)
    try:
        eager = load(ckpt, device="cpu", quantize="int4", engine_path="eager")
        fast = load(ckpt, device="cpu", quantize="int4", engine_path="native")
    finally:
        _CHOICES[choice_key(torch.bfloat16)] = chosen
    if fast.native_step is None:
        assert fast.engine_path.reason == "not applicable"  # no int8-activation loops in this library
        return
    assert isinstance(fast.network.head, Int4Projection) and fast.network.head.packed is packed
    rows = torch.arange(4)
    caches = [m.new_cache(max_batch=4, max_seq_len=32) for m in (eager, fast)]
    for m, cache in zip((eager, fast), caches, strict=True):
        for r in range(4):
            m.prefill(cache, r, ids[r, :8])
    for t in range(8, 16):
        a, b = (
            m.decode(c, rows, ids[:, t], torch.full((4,), t))
            for m, c in zip((eager, fast), caches, strict=True)
        )
        assert (a - b).abs().max().item() < 0.03 * a.abs().max().item()
        picked = a.gather(-1, b.argmax(-1, keepdim=True)).squeeze(-1)
        assert torch.equal(picked, a.max(-1).values)  # a greedy token of the eager decode


@pytest.mark.parametrize(
    "shape", [(64, 128), (48, 96), (80, 64), (272, 96), (1024, 64)]
)  # the last two: by blocks
def test_plain_nibbles_inverts_torchs_packed_int4_layout(shape: tuple[int, int]) -> None:
    n, k = shape
    q = torch.randint(0, 16, (n, k), generator=torch.Generator().manual_seed(n * k), dtype=torch.int32)
    packed = torch._convert_weight_to_int4pack_for_cpu(q, 1)
    assert torch.equal(plain_nibbles(packed, k, True), q.to(torch.uint8))
    plain = (q[:, 0::2] | (q[:, 1::2] << 4)).to(torch.uint8)
    assert torch.equal(plain_nibbles(plain, k, False), q.to(torch.uint8))


def test_sizes_no_int4_group_divides_are_refused_naming_the_size(tmp_path: Path) -> None:
    save_checkpoint(tmp_path, 4, **(SHAPE | {"hidden_size": 72, "intermediate_size": 40}))
    with pytest.raises(UnsupportedQuantization, match="multiples of 32, got 72"):
        load(tmp_path, device="cpu", quantize="int4")


def test_the_kernel_choice_is_measured_once_and_read_back_from_disk(kernel_cache: Path) -> None:
    _CHOICES.clear()
    first = int4_choice(torch.bfloat16)
    stored = json.loads((kernel_cache / "kernel_choices.json").read_text())
    (key,) = [k for k in stored if k.endswith("torch.bfloat16")]
    assert key.startswith("int4|") and stored[key]["packed"] == first.packed
    assert first.packed_us > 0 and first.dequant_us > 0 and first.measured_s < 10
    _CHOICES.clear()  # a restarted process
    again = int4_choice(torch.bfloat16)
    assert again.cached and (again.packed, again.packed_us) == (first.packed, first.packed_us)


def test_an_unwritable_kernel_cache_still_loads(
    ckpt: Path, ids: torch.Tensor, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("INFERSIGHT_CACHE_DIR", str(blocker / "cache"))
    _CHOICES.clear()
    model = load(ckpt, device="cpu", quantize="int4")
    assert torch.isfinite(model.logits(ids[:1])).all()


def test_int4_versions_register_and_load_as_int4(ckpt: Path, tmp_path: Path) -> None:
    registry = Registry(tmp_path / "models")
    info = registry.register("mixtral_banking_int4-v1.0", ckpt, quantize="int4")
    assert info.quant == "int4" and info.quantize == "int4"
    with pytest.raises(InvalidVersionName, match="int4"):
        registry.register("mixtral_banking_int4-v1.1", ckpt)  # int4 name, no quantize
    with pytest.raises(InvalidVersionName):
        registry.register("mixtral_banking_int8-v1.1", ckpt, quantize="int4")


def test_stand_in_torch_without_the_packed_int4_kernel_falls_back_to_unpack_and_dense(
    ckpt: Path, ids: torch.Tensor, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def missing(*args: object) -> torch.Tensor:
        raise NotImplementedError("no int4 kernel in this torch build")

    # the stand-in is torch itself: a build without the kernel (CPU-boundary, not our code)
    monkeypatch.setattr(torch, "_weight_int4pack_mm_for_cpu", missing)
    monkeypatch.setenv("INFERSIGHT_CACHE_DIR", str(tmp_path))
    _CHOICES.clear()
    try:
        model = load(ckpt, device="cpu", quantize="int4")
        assert not int4_choice(torch.bfloat16).packed
        assert isinstance(model.network.head, Int4Projection) and not model.network.head.packed
        assert torch.isfinite(model.logits(ids[:1])).all()
    finally:
        _CHOICES.clear()
