"""`infersight models import`: a GGUF written the way llama.cpp's converter writes it comes back
as the checkpoint it was made from; bad files get typed errors and register nothing."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import pytest

pytest.importorskip("gguf")
torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from _gguf_writer import byte_vocab, tiny_mixtral, write_gguf  # noqa: E402
from infersight.engine import load  # noqa: E402
from infersight.engine.errors import GGUFCorrupt, GGUFError, GGUFMismatch, GGUFUnsupported  # noqa: E402
from infersight.engine.gguf import import_gguf  # noqa: E402
from infersight.engine.registry import Registry  # noqa: E402
from infersight.monitor.cli import main  # noqa: E402

PROMPTS = torch.tensor([[5, 17, 250, 3, 99, 140, 7, 61], [299, 0, 12, 200, 45, 45, 1, 88]])


@pytest.fixture(scope="module")
def mixtral() -> object:
    return tiny_mixtral()


def _decoded(model: object) -> torch.Tensor:
    """Logits of the decode path (the native step where the model has one): each prompt
    prefilled to its 6th token, then its last two decoded. [2, 2, V]."""
    cache = model.new_cache(max_batch=2, max_seq_len=16)  # type: ignore[attr-defined]
    for row in range(2):
        model.prefill(cache, row, PROMPTS[row, :6])  # type: ignore[attr-defined]
    steps = [model.decode(cache, torch.arange(2), PROMPTS[:, t], torch.full((2,), t)) for t in (6, 7)]  # type: ignore[attr-defined]
    return torch.stack(steps)


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / (b.max() - b.min()))


def test_mixtral_gguf_f32_imports_to_the_logits_of_its_checkpoint(mixtral, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    info, done = import_gguf(
        Registry(tmp_path / "r"), "mixtral_tiny_fp32-v1.0", write_gguf(mixtral, tmp_path / "m.gguf")
    )
    assert done.arch == "mixtral" and done.tensor_types == (("F32", 23),) and done.rerounded == ()
    with torch.no_grad():
        want = mixtral(PROMPTS).logits
    assert _relative(load(info.path).logits(PROMPTS), want) < 1e-4


def test_mixtral_gguf_q8_0_imports_within_the_q8_0_rounding(mixtral, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    import gguf

    path = write_gguf(mixtral, tmp_path / "m.gguf", outtype="q8_0")
    info, done = import_gguf(Registry(tmp_path / "r"), "mixtral_tiny_fp32-v1.0", path)
    assert dict(done.tensor_types) == {"F32": 5, "Q8_0": 18}
    rounded = tiny_mixtral()  # the same weights, each 2-D one through q8_0 and back
    q8 = gguf.GGMLQuantizationType.Q8_0
    with torch.no_grad():
        for p in rounded.parameters():
            if p.dim() >= 2:
                data = p.numpy().reshape(-1, p.shape[-1])
                p.copy_(
                    torch.from_numpy(gguf.quants.dequantize(gguf.quants.quantize(data, q8), q8)).reshape(
                        p.shape
                    )
                )
        want, unrounded = rounded(PROMPTS).logits, mixtral(PROMPTS).logits
    got = load(info.path).logits(PROMPTS)
    assert _relative(got, want) < 1e-4
    assert 1e-4 < _relative(got, unrounded) < 0.05  # q8_0 moved them, a little


def test_keep_serves_q8_0_as_int8_and_reports_each_rerounded_tensor(mixtral, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    path = write_gguf(mixtral, tmp_path / "m.gguf", outtype="q8_0")
    info, done = import_gguf(Registry(tmp_path / "r"), "mixtral_tiny_int8-v1.0", path, quantize="keep")
    assert done.quant == "int8" and info.quantize == "int8"
    names = {r.tensor for r in done.rerounded}
    assert "blk.0.attn_q.weight" in names and "blk.1.ffn_gate_exps.weight+blk.1.ffn_up_exps.weight" in names
    assert (
        "token_embd.weight" not in names and "blk.0.ffn_gate_inp.weight" not in names
    )  # kept full precision
    assert all(0 < r.rms_rel <= r.max_rel * 50 and r.max_rel < 0.02 for r in done.rerounded)
    model = load(info.path, quantize="int8")
    assert torch.isfinite(model.logits(PROMPTS)).all()


@pytest.mark.parametrize("outtype", ["q4_0", "q4_1"])
def test_keep_holds_q4_blocks_unrounded_and_the_native_int4_step_serves_them(  # type: ignore[no-untyped-def]
    outtype: str, mixtral, tmp_path: Path
) -> None:
    import gguf
    from infersight.engine.native_int4 import scales_mins
    from infersight.engine.quant import int4_dequantize
    from safetensors.torch import load_file

    path = write_gguf(mixtral, tmp_path / "m.gguf", outtype=outtype)
    registry = Registry(tmp_path / "r")
    info, done = import_gguf(registry, "mixtral_tiny_int4-v1.0", path, quantize="keep")
    assert done.quant == "int4" and info.quantize == "int4"
    # only the head (int8 rows) and the embedding's bf16 lookup are rounded again: no block
    assert {r.tensor for r in done.rerounded} == {"output.weight", "token_embd.weight"}
    # the stored groups are the file's blocks: dequantized, the values gguf's reader gives
    stored = load_file(str(info.path / "quantized.safetensors"))
    reader = gguf.GGUFReader(path)
    t = next(t for t in reader.tensors if t.name == "blk.1.attn_v.weight")
    want = torch.from_numpy(gguf.quants.dequantize(t.data, t.tensor_type).copy()).reshape(-1, 64)
    qkv_w, qkv_sz = stored["layers.1.attention.wqkv.weight"], stored["layers.1.attention.wqkv.scales_zeros"]
    assert qkv_sz.shape[0] == 64 // 32  # groups of 32, as the blocks
    got = int4_dequantize(qkv_w, qkv_sz, torch.float32)[-want.shape[0] :]
    assert torch.equal(got, want)
    # the native step packs the blocks' fp16 scales and minimums as they are
    mins = scales_mins(qkv_sz)
    assert torch.equal(mins.float()[..., 0], qkv_sz[..., 0]) and torch.equal(
        mins.float()[..., 1], qkv_sz[..., 1] - 8 * qkv_sz[..., 0]
    )
    fp32, _ = import_gguf(registry, "mixtral_tiny_fp32-v1.0", path)
    reference = _decoded(load(fp32.path))  # the file's values, dequantized, in fp32
    kept = load(info.path, quantize="int4", engine_path="native")
    assert kept.native_step is not None and kept.native_step.model.int4_group == 32
    again = load(fp32.path, quantize="int4", engine_path="native")  # groups of 64: a second rounding
    assert again.native_step is not None and again.native_step.model.int4_group == 64
    err_kept, err_again = _relative(_decoded(kept), reference), _relative(_decoded(again), reference)
    assert err_kept < 0.5 * err_again


def _bad(kind: str, mixtral: object, tmp: Path) -> Path:
    path = write_gguf(mixtral, tmp / "good.gguf")
    data = path.read_bytes()
    if kind == "truncated":
        path.write_bytes(data[: len(data) - 4096])
    elif kind == "magic":
        path.write_bytes(b"GGML" + data[4:])
    elif kind == "arch":
        path = write_gguf(mixtral, tmp / "arch.gguf", arch="gpt2")
    elif kind == "vocab":
        tokens, _, _ = byte_vocab(300)
        path = write_gguf(mixtral, tmp / "vocab.gguf", tokens=tokens[:-5])  # 295 tokens, 300 embedding rows
    return path


@pytest.mark.parametrize(
    ("kind", "error", "where"),
    [
        ("truncated", GGUFCorrupt, "blk.1.ffn_down_exps.weight"),
        ("magic", GGUFCorrupt, ""),
        ("arch", GGUFUnsupported, "general.architecture"),
        ("vocab", GGUFMismatch, "tokenizer.ggml.tokens"),
    ],
)
def test_a_bad_file_gets_its_typed_error_and_registers_nothing(  # type: ignore[no-untyped-def]
    kind: str, error: type[GGUFError], where: str, mixtral, tmp_path: Path
) -> None:
    path = _bad(kind, mixtral, tmp_path)
    registry = Registry(tmp_path / "r")
    before = sorted(p.relative_to(registry.root) for p in registry.root.rglob("*"))
    with pytest.raises(error) as raised:
        import_gguf(registry, "mixtral_tiny_fp32-v1.0", path)
    assert raised.value.path == str(path) and raised.value.where == where
    assert str(path) in str(raised.value)
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        assert main(["models", "import", str(registry.root), "mixtral_tiny_fp32-v1.0", str(path)]) == 2
    assert err.getvalue().count("\n") == 1 and str(path) in err.getvalue()
    assert (
        sorted(p.relative_to(registry.root) for p in registry.root.rglob("*") if "imports" not in p.parts)
        == before
    )
    assert registry.versions() == [] and not any((registry.root / "imports").glob("*"))


def test_a_missing_tensor_is_named(mixtral, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    import gguf

    good = write_gguf(mixtral, tmp_path / "good.gguf")
    reader = gguf.GGUFReader(good)
    out = gguf.GGUFWriter(tmp_path / "missing.gguf", "mixtral")
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name == "general.architecture":
            continue
        kind = field.types[0]
        sub = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        out.add_key_value(field.name, field.contents(), kind, sub_type=sub)
    for t in reader.tensors:
        if t.name != "blk.1.attn_v.weight":
            out.add_tensor(t.name, t.data)
    out.write_header_to_file()
    out.write_kv_data_to_file()
    out.write_tensors_to_file()
    out.close()
    with pytest.raises(GGUFMismatch, match=r"blk\.1\.attn_v\.weight: tensor missing"):
        import_gguf(Registry(tmp_path / "r"), "mixtral_tiny_fp32-v1.0", tmp_path / "missing.gguf")


def test_the_name_must_say_the_quant_the_import_serves(mixtral, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    registry = Registry(tmp_path / "r")
    path = write_gguf(mixtral, tmp_path / "m.gguf", outtype="q8_0")
    with pytest.raises(Exception, match="says quant 'int4' but the import is int8"):
        import_gguf(registry, "mixtral_tiny_int4-v1.0", path, quantize="keep")
    assert registry.versions() == [] and not any((registry.root / "imports").glob("*"))


def test_a_sentencepiece_vocabulary_tokenizes_as_transformers_reads_it() -> None:
    from infersight.engine.gguf_tokenizer import build_tokenizer
    from transformers.integrations.gguf.gguf_tokenizer_mapping import convert_gguf_tokenizer

    pieces = ["▁", "t", "h", "e", "a", "s", "i", "n", "o", "r", "▁t", "he", "▁the", "▁a", "▁is", "in", "▁in",
              "on", "er", "▁o", "▁on", "st", "▁s", "at", "en", "an"]  # fmt: skip
    tokens = ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256)), *pieces]
    types = [2, 3, 3] + [6] * 256 + [1] * len(pieces)  # unknown, control, bytes, normal
    scores = [0.0] * 259 + [-float(i) for i in range(len(pieces))]
    meta = {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.scores": scores,
            "tokenizer.ggml.token_type": types, "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2,
            "tokenizer.ggml.unknown_token_id": 0}  # fmt: skip
    ours = build_tokenizer("tiny.gguf", meta, len(tokens))
    theirs, _ = convert_gguf_tokenizer("llama", {"tokenizer_type": "llama", "tokens": tokens, "scores": scores,
                                                 "token_type": types, "unk_token_id": 0})  # fmt: skip
    for text in ["the sea is on in the street", "hé 😀 x", "Then at nine"]:
        ids = ours.tokenizer.encode(text, add_special_tokens=False).ids
        assert ids == theirs.encode(text, add_special_tokens=False).ids
        assert ours.tokenizer.decode(ids) == text  # unknown characters through byte fallback
        assert ours.tokenizer.encode(text).ids == [1, *ids]  # llama vocabularies add BOS
    assert ours.config["bos_token"] == "<s>" and ours.config["eos_token"] == "</s>"
