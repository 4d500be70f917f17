"""int4 GPTQ (engine/gptq.py) and `infersight models quantize` (engine/calibrate.py).

Claims: GPTQ's output error on correlated inputs is lower than round-to-nearest's on the same
grid, with and without activation order; its weights are in the engine's int4 layout exactly;
the CLI builds a registered version, with its parent and its record, that every int4 path
serves from the stored weights (the head at int8 unless asked); bad input is one line and
registers nothing.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from infersight.engine import load
from infersight.engine.gptq import Hessian, gptq_int4, output_error, rtn_int4
from infersight.engine.projection import Int4Projection, Int8Projection
from infersight.engine.quant import int4_dequantize
from infersight.engine.registry import Registry
from infersight.monitor.cli import main

from tests._tiny_registry import tiny_registry

SRC = "mixtral_tiny_fp32-v1.0"
WORDS = [f"w{i}" for i in range(63)]


def _correlated(k: int, n: int, seed: int) -> torch.Tensor:
    """n input rows [n, k] with strongly correlated columns and a few dominant ones."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, k, generator=g) @ (0.3 * torch.eye(k) + torch.randn(k, k, generator=g) / k**0.5)
    x[:, : k // 16] *= 6.0
    return x


def test_gptq_has_lower_output_error_than_rtn_on_correlated_inputs() -> None:
    k, rows = 256, 64
    hessian = Hessian(k)
    hessian.add(_correlated(k, 1536, 0))
    h = hessian.value()
    w = torch.randn(rows, k, generator=torch.Generator().manual_seed(1)) * 0.05
    for group in (64, 32):
        rtn = output_error(w, rtn_int4(w, group).dequantize(), h)
        for act_order in (False, True):
            gptq = output_error(w, gptq_int4(w, h, group, act_order=act_order).dequantize(), h)
            assert gptq < 0.6 * rtn, (group, act_order, gptq, rtn)


def test_gptq_weights_are_the_engines_int4_layout_exactly() -> None:
    k = 128
    hessian = Hessian(k)
    hessian.add(_correlated(k, 512, 2))
    x = hessian.value()
    x[5, :] = x[:, 5] = 0.0  # a dead input: its weights are zeroed, the rest still quantize
    w = torch.randn(48, k, generator=torch.Generator().manual_seed(3))
    rows = gptq_int4(w, x, 64, act_order=True)
    assert rows.q.dtype == torch.uint8 and int(rows.q.max()) <= 15
    layout = rows.layout()
    assert layout["weight"].shape == (48, k // 2) and layout["scales_zeros"].shape == (2, 48, 2)
    # quant.py's own dequantization of the stored tensors gives GPTQ's weights back exactly
    assert torch.equal(
        int4_dequantize(layout["weight"], layout["scales_zeros"], torch.float32), rows.dequantize()
    )
    # the grid is bf16-exact, as the engine serves it on CPU
    sz = layout["scales_zeros"]
    assert torch.equal(sz.to(torch.bfloat16).float(), sz)


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A tiny random Mixtral registered with a word-level tokenizer, and a calibration file in
    `infersight dataset export`'s shape (prompt, response, other fields; one line unusable)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    root = tmp_path_factory.mktemp("quantize")
    reg = tiny_registry(root, (SRC,))
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate([*WORDS, "[UNK]"])}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(root / SRC / "tokenizer.json"))
    g = torch.Generator().manual_seed(0)
    lines = [json.dumps({"request_id": "x", "prompt": None})]
    for i in range(24):
        words = torch.randint(0, len(WORDS), (40,), generator=g).tolist()
        lines.append(
            json.dumps(
                {"request_id": str(i), "prompt": " ".join(WORDS[j] for j in words), "response": "w1 w2"}
            )
        )
    (root / "calib.jsonl").write_text("\n".join(lines) + "\n")
    return reg, root / "calib.jsonl"


def _run(*argv: str) -> int:
    return main(["models", "quantize", *argv])


def test_models_quantize_registers_a_gptq_build_every_int4_path_serves(
    registry: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    reg, calib = registry
    name = "mixtral_tiny_int4-v1.1"
    assert (
        _run(str(reg), SRC, name, "--method", "gptq", "--calibration", str(calib), "--group-size", "32") == 0
    )
    assert (
        "registered mixtral_tiny_int4-v1.1 (int4 gptq, groups of 32, head int8, 24 texts"
        in capsys.readouterr().out
    )
    info = Registry(reg).get(name)
    record = dict(info.quantization)
    assert info.parent == SRC and info.quantize == "int4"
    assert json.loads(record["method"]) == "gptq" and json.loads(record["head"]) == "int8"
    assert json.loads(record["group_size"]) == 32 and json.loads(record["samples"]) == 24
    assert {f for f, _ in info.files} == {"model.safetensors", "quantized.safetensors"}
    ids = torch.randint(0, 63, (2, 12), generator=torch.Generator().manual_seed(4))
    # the build's model.safetensors holds the dequantized weights: what its int4 paths compute
    reference = load(info.path, device="cpu", engine_path="eager").logits(ids)
    for path in ("eager", "native"):
        model = load(info.path, device="cpu", quantize="int4", engine_path=path)
        assert isinstance(model.network.head, Int8Projection)
        assert isinstance(model.network.layers[0].attention.wqkv, Int4Projection)
        assert (model.native_step is not None) == (
            path == "native" and model.engine_path.kernels not in ("none", "plain")
        )
        got = model.logits(ids)
        assert (got - reference).abs().max().item() < 0.03 * reference.abs().max().item(), path
        if model.native_step is not None:  # the decode step's int4 body and int8 head
            cache = model.new_cache(max_batch=1, max_seq_len=16)
            model.prefill(cache, 0, ids[0, :8])
            step = model.decode(cache, torch.tensor([0]), ids[0, 8:9], torch.tensor([8]))[0]
            assert (step - reference[0, 8]).abs().max().item() < 0.05 * reference.abs().max().item()


def test_an_rtn_build_with_an_int4_head_records_it(registry: tuple[Path, Path]) -> None:
    reg, _ = registry
    name = "mixtral_tiny_int4-v1.2"
    assert _run(str(reg), SRC, name, "--method", "rtn", "--group-size", "32", "--head", "int4") == 0
    info = Registry(reg).get(name)
    assert json.loads(dict(info.quantization)["head"]) == "int4"
    assert isinstance(load(info.path, device="cpu", quantize="int4").network.head, Int4Projection)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--method", "awq"), "unknown method 'awq'; choose one of gptq, rtn"),
        (("--method", "gptq", "--group-size", "64"), "group size 64 does not divide the hidden_size, 32"),
        (("--method", "gptq", "--calibration", "EMPTY"), "has no usable prompt"),
        (("--method", "gptq"), "--method gptq needs --calibration FILE.jsonl"),
    ],
)
def test_bad_input_is_one_line_and_registers_nothing(
    registry: tuple[Path, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    args: tuple[str, ...],
    message: str,
) -> None:
    reg, calib = registry
    empty = tmp_path / "empty.jsonl"
    empty.write_text('{"prompt": ""}\n{"response": "no prompt"}\nnot json\n')
    argv = [a.replace("EMPTY", str(empty)) for a in args]
    if "--calibration" not in argv and "awq" not in argv and "needs" not in message:
        argv += ["--calibration", str(calib)]
    before = sorted(p.name for p in reg.iterdir())
    assert _run(str(reg), SRC, "mixtral_tiny_int4-v2.0", *argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err, err
    assert sorted(p.name for p in reg.iterdir()) == before  # no version, no partial build left


def test_an_exported_data_set_calibrates_on_its_prompts_and_answers(tmp_path: Path) -> None:
    from infersight.engine.calibrate import calibration_texts

    # the fields `infersight dataset export` writes: the model's answer is calibration text too
    exported = tmp_path / "incident.jsonl"
    rows = [
        {"request_id": "a", "prompt": "where is my card?", "answer": "It is on its way."},
        {"request_id": "b", "prompt": "book a room", "answer": None},
        {"request_id": "c", "prompt": "cancel it", "response": "Done."},
    ]
    exported.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert calibration_texts(exported) == [
        "where is my card?\nIt is on its way.",
        "book a room",
        "cancel it\nDone.",
    ]
