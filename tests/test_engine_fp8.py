"""quantize="fp8": float8 e4m3 weights with a scale per output row, router in full precision.

Claims: (1) the layout is torch's own e4m3 conversion of w / s, and every e4m3 byte decodes
in the native library's loop (each ISA level) to exactly torch's value; (2) the eager fp8
kernels compute exactly the model whose weights are the dequantized ones, its output head
kept at int8 rows; (3) the native decode step reads the same bytes and agrees with the eager
decode; (4) the tensor-core path's call (`torch._scaled_mm`, row-wise scales) computes the
product of the e4m3 activations and weights: checked on the CPU's implementation of the same
op, since no GPU runs here (the operands' order, layout and scales are what it checks).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from infersight.engine import isa, load, native
from infersight.engine.projection import Fp8Projection, Int8Projection
from infersight.engine.quant import FP8_MAX, fp8_dequantize, fp8_rows, fp8_scaled_matmul, int8_rows
from infersight.engine.registry import Registry
from safetensors.torch import load_file, save_file

from tests._engine_checkpoints import save_checkpoint

SHAPE = {"hidden_size": 128, "intermediate_size": 192, "vocab_size": 256, "initializer_range": 0.02}


def _quantized_keys(key: str) -> bool:
    return key.endswith("proj.weight") or ".experts." in key or key == "lm_head.weight"


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("fp8")
    save_checkpoint(directory, 21, **SHAPE)
    return directory


@pytest.fixture(scope="module")
def ids() -> torch.Tensor:
    return torch.randint(0, 256, (3, 16), generator=torch.Generator().manual_seed(0))


def test_the_fp8_layout_is_torchs_e4m3_of_the_scaled_rows_without_subnormals() -> None:
    w = torch.randn(3, 40, 96, generator=torch.Generator().manual_seed(1)) * 0.05
    w[0, 0, 5] = 0.0  # an all-but-zero row keeps a usable scale
    w[1, 2, :4] = torch.tensor([1e-7, -3e-6, 2e-6, 0.0])  # under e4m3's smallest normal, 2^-6 of the scale
    q = fp8_rows(w, torch.float32)
    assert q["weight"].dtype == torch.float8_e4m3fn and q["weight"].shape == w.shape
    scales = q["scales"]
    assert torch.equal(scales, w.abs().amax(-1) / FP8_MAX)
    scaled = w / scales[..., None]
    normal = scaled.abs() >= 2**-6
    bytes_ = q["weight"].view(torch.uint8)
    assert torch.equal(bytes_[normal], scaled.to(torch.float8_e4m3fn).view(torch.uint8)[normal])
    # the rest is 0 or +-2^-6, whichever is nearer: no subnormal code
    assert not (((bytes_ & 0x78) == 0) & ((bytes_ & 7) != 0)).any()
    tiny = q["weight"].float()[~normal]
    want = torch.where(scaled[~normal].abs() < 2**-7, 0.0, scaled[~normal].sign() * 2**-6)
    assert torch.equal(tiny, want) and (tiny == 0).any() and (tiny != 0).any()
    # every row's largest weight lands on e4m3's largest value, and no byte is a NaN
    assert torch.equal(q["weight"].float().abs().amax(-1), torch.full(scales.shape, FP8_MAX))
    assert not torch.isnan(q["weight"].float()).any()
    back = fp8_dequantize(q["weight"], scales, torch.float32)
    # 3 mantissa bits: within half a step, 2^-4 of the value, above e4m3's subnormals
    normal = w.abs() >= 2**-6 * scales[..., None]
    assert ((back - w).abs() <= w.abs() * 2**-4 + 1e-12)[normal].all()


def test_every_e4m3_byte_decodes_exactly_in_each_native_build() -> None:
    """The native loops' decode against torch's float8_e4m3fn -> fp32 conversion, signed zero
    included, for every level this CPU runs (the plain C build's scalar decode defines it):
    every finite byte through the fp32 loop (the one weights with subnormal codes take), and
    every byte but the subnormal codes, which the quantizer never writes, through the
    x86-64-v4-bf16 build's bf16 loop, which reads activations rounded to bf16."""
    finite = [b for b in range(256) if b not in (0x7F, 0xFF)]
    normal = [b for b in finite if b & 0x78 or not b & 7]
    levels = isa.supported(isa.cpu_flags())
    built = [lv for lv in levels if (native.LIBRARY_DIR / lv.library).is_file()]
    assert built, "no native library runs on this CPU"
    for codes, bf16_loop in ((finite, False), (normal, True)):
        # [5, K] with K not a multiple of 16
        w = torch.tensor(codes, dtype=torch.uint8).view(torch.float8_e4m3fn).view(1, -1).repeat(5, 1)
        scales = torch.tensor([1.0, 0.5, 2.0, 0.25, 3.0])
        eye = torch.eye(w.shape[1])
        for level in built:
            kernels = native.NativeKernels(native.LIBRARY_DIR / level.library, level.name)
            got = kernels.rows_fp8(eye, w, scales)
            assert torch.equal(got, (w.float() * scales[:, None]).t()), level.name
            x = torch.randn(7, w.shape[1], generator=torch.Generator().manual_seed(2))
            rounded = x.bfloat16().float() if bf16_loop and kernels.bf16 else x
            want = rounded @ (w.float() * scales[:, None]).t()
            torch.testing.assert_close(kernels.rows_fp8(x, w, scales), want, atol=1e-3, rtol=1e-4)


def test_the_tensor_core_call_is_the_product_of_the_e4m3_activations_and_weights() -> None:
    if not hasattr(torch, "_scaled_mm"):
        pytest.fail("this torch has no _scaled_mm: the fp8 tensor-core path cannot run on it")
    g = torch.Generator().manual_seed(3)
    x = torch.randn(5, 64, generator=g) * torch.logspace(-2, 1, 5).unsqueeze(1)  # rows far apart
    rows = fp8_rows(torch.randn(48, 64, generator=g), torch.float32)
    weight, scales = rows["weight"], rows["scales"]
    dense = fp8_dequantize(weight, scales, torch.float32)

    def product(x: torch.Tensor, scales_of_rows: torch.Tensor) -> torch.Tensor:
        x = x.float()
        xs = x.abs().amax(dim=1, keepdim=True) / FP8_MAX
        xq = (x / xs).to(torch.float8_e4m3fn).float() * xs  # the activations as the call casts them
        return xq @ (weight.float() * scales_of_rows.unsqueeze(-1)).T

    expected = product(x, scales)
    got = fp8_scaled_matmul(x, weight, scales, out_dtype=torch.float32)
    assert got.shape == (5, 48)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
    # a swapped or transposed scale would put one row's scale on another's products
    assert not torch.allclose(got, product(x, scales.flip(0)), rtol=1e-3)
    assert (got - x @ dense.T).abs().max() > 0  # and the activations are e4m3, not x itself
    # the kernels' bf16 output: the same product rounded once
    xb = x.bfloat16()
    bf16 = fp8_scaled_matmul(xb, weight, scales)
    assert bf16.dtype == torch.bfloat16
    torch.testing.assert_close(bf16.float(), product(xb, scales), rtol=8e-3, atol=1e-5)


def test_fp8_equals_the_model_with_dequantized_weights(ckpt: Path, ids: torch.Tensor, tmp_path: Path) -> None:
    tensors = load_file(ckpt / "model.safetensors")
    for key, w in tensors.items():
        if key == "lm_head.weight":  # the head stays int8 rows
            q = int8_rows(w, torch.float32)
            tensors[key] = (q["weight"].float() * q["scales"][:, None]).contiguous()
        elif _quantized_keys(key):
            q = fp8_rows(w, torch.float32)
            tensors[key] = fp8_dequantize(q["weight"], q["scales"], torch.float32).contiguous()
    dequantized = Path(shutil.copytree(ckpt, tmp_path / "dq"))
    save_file(tensors, dequantized / "model.safetensors", {"format": "pt"})
    reference = load(dequantized, device="cpu").logits(ids)
    fp8 = load(ckpt, device="cpu", quantize="fp8", dtype=torch.float32)
    *body, head = fp8.network.projections()
    assert all(isinstance(p, Fp8Projection) for p in body) and isinstance(head, Int8Projection)
    assert fp8.network.layers[0].moe.gate.dtype == torch.float32  # the router stays full precision
    assert (fp8.logits(ids) - reference).abs().max().item() < 1e-4


def test_fp8_native_decode_agrees_with_eager_and_stays_close_to_fp32(ckpt: Path, ids: torch.Tensor) -> None:
    eager = load(ckpt, device="cpu", quantize="fp8", engine_path="eager")
    fast = load(ckpt, device="cpu", quantize="fp8", engine_path="native")
    assert eager.dtype == torch.bfloat16 and eager.native_step is None
    step = fast.native_step
    assert step is not None and step.fp8 and not step.act8
    step.act8 = True  # fp8 has no int8-activation variant: the setter keeps fp32 activations
    assert not step.act8 and fast.engine_path.activations == ("bf16" if step.kernels.bf16 else "fp32")

    def decodes(model: object) -> torch.Tensor:
        cache = model.new_cache(max_batch=3, max_seq_len=16)  # type: ignore[attr-defined]
        for row in range(3):
            model.prefill(cache, row, ids[row, :10])  # type: ignore[attr-defined]
        at = range(10, 16)
        return torch.stack([model.decode(cache, torch.arange(3), ids[:, t], torch.full((3,), t)) for t in at])  # type: ignore[attr-defined]

    a, b = decodes(eager), decodes(fast)
    # stated bound: the native step's fp32 activations against eager's bf16 ones
    assert (a - b).abs().max().item() < 0.03 * a.abs().max().item()
    assert (a.argmax(-1) == b.argmax(-1)).float().mean().item() >= 0.9
    fp32 = load(ckpt, device="cpu").logits(ids)
    assert (fp32.argmax(-1) == fast.logits(ids).argmax(-1)).float().mean().item() >= 0.9


def test_an_fp8_version_registers_and_records_its_quant(ckpt: Path, tmp_path: Path) -> None:
    registry = Registry(tmp_path / "reg")
    info = registry.register("mixtral_banking_fp8-v1.0", ckpt, quantize="fp8")
    assert registry.get(info.name).quantize == "fp8"
