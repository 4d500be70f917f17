"""Loading a checkpoint directory: what loads, and the typed error for everything that must not.

Every bad checkpoint raises before a weight is assigned: no half-built model ever exists.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import infersight.engine.loading as loading
import pytest
import torch
from infersight.engine import load
from infersight.engine.errors import (
    CheckpointCorrupt,
    CheckpointMismatch,
    CheckpointNotFound,
    NonFiniteWeights,
    TokenizerInvalid,
    UnsupportedConfig,
    UnsupportedQuantization,
)
from infersight.engine.network import BlockedExperts
from safetensors.torch import load_file, save_file

from tests._engine_checkpoints import save_checkpoint

LAST = "model.layers.1.block_sparse_moe.experts.3.w2.weight"


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, torch.Tensor]:
    directory = tmp_path_factory.mktemp("ckpt")
    ref = save_checkpoint(directory, 11)
    ids = torch.tensor([[4, 8, 15, 16, 23, 42]])
    with torch.no_grad():
        return directory, ref(ids).logits


@pytest.fixture
def ckpt(pristine: tuple[Path, torch.Tensor], tmp_path: Path) -> Path:
    return Path(shutil.copytree(pristine[0], tmp_path / "ckpt"))


def _edit_weights(directory: Path, edit) -> None:  # type: ignore[no-untyped-def]
    tensors = load_file(directory / "model.safetensors")
    edit(tensors)
    save_file(
        {k: v.contiguous() for k, v in tensors.items()}, directory / "model.safetensors", {"format": "pt"}
    )


def _edit_config(directory: Path, edit) -> None:  # type: ignore[no-untyped-def]
    raw = json.loads((directory / "config.json").read_text())
    edit(raw)
    (directory / "config.json").write_text(json.dumps(raw))


@pytest.fixture
def never_builds(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail the test if loading gets as far as building tensors for the network."""

    def forbidden(*args: object, **kwargs: object) -> None:
        raise AssertionError("load started building the model before validation finished")

    monkeypatch.setattr(loading, "build_state", forbidden)


def test_loaded_model_reproduces_the_checkpoints_logits(
    ckpt: Path, pristine: tuple[Path, torch.Tensor]
) -> None:
    model = load(ckpt, device="cpu")
    got = model.logits(torch.tensor([[4, 8, 15, 16, 23, 42]]))
    assert (got - pristine[1]).abs().max().item() < 1e-4
    assert model.config.num_local_experts == 4 and model.config.eos_token_ids == (2,)
    assert model.tokenizer is None


def test_tensors_used_as_stored_are_views_of_the_memory_map(ckpt: Path) -> None:
    model = load(ckpt, device="cpu")
    mapped = []
    for line in Path("/proc/self/maps").read_text().splitlines():
        fields = line.split()
        if len(fields) >= 6 and fields[5] == str((ckpt / "model.safetensors").resolve()):
            start, end = (int(x, 16) for x in fields[0].split("-"))
            mapped.append((start, end))

    def in_map(t: torch.Tensor) -> bool:
        return any(start <= t.data_ptr() < end for start, end in mapped)

    net = model.network
    assert in_map(net.tok_embeddings.weight) and in_map(net.norm.weight)
    assert in_map(net.layers[1].attention.wo.weight) and in_map(net.layers[1].moe.gate.weight)
    # the fused tensors (and the CPU head's column-major layout) are the one copy loading makes;
    # in fp32 on CPU the stacked experts are then reordered for oneDNN and the stack released
    assert not in_map(net.layers[0].attention.wqkv.weight)
    assert isinstance(net.layers[0].moe.experts, BlockedExperts)
    assert not in_map(net.output.weight) and net.output.weight.stride() == (1, 96)


def test_sharded_checkpoint_loads_like_a_single_file(tmp_path: Path) -> None:
    ref = save_checkpoint(tmp_path, 12, max_shard_size="60KB")
    assert (tmp_path / "model.safetensors.index.json").is_file() and not (
        tmp_path / "model.safetensors"
    ).exists()
    assert len(list(tmp_path.glob("model-*.safetensors"))) > 2
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    with torch.no_grad():
        expected = ref(ids).logits
    assert (load(tmp_path, device="cpu").logits(ids) - expected).abs().max().item() < 1e-4


def test_transformers_v4_config_with_top_level_rope_theta_loads(
    ckpt: Path, pristine: tuple[Path, torch.Tensor]
) -> None:
    def v4(raw: dict) -> None:  # type: ignore[type-arg]
        raw["rope_theta"] = raw.pop("rope_parameters")["rope_theta"]
        raw["rope_scaling"] = None
        raw["torch_dtype"] = raw.pop("dtype")
        raw["transformers_version"] = "4.46.0"

    _edit_config(ckpt, v4)
    got = load(ckpt, device="cpu").logits(torch.tensor([[4, 8, 15, 16, 23, 42]]))
    assert (got - pristine[1]).abs().max().item() < 1e-4


def test_tokenizer_json_is_loaded_when_present(ckpt: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({"[UNK]": 0, "hello": 1, "world": 2}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(ckpt / "tokenizer.json"))
    model = load(ckpt, device="cpu")
    assert model.tokenizer is not None and model.tokenizer.encode("hello world").ids == [1, 2]


def test_missing_directory_is_checkpoint_not_found(tmp_path: Path) -> None:
    with pytest.raises(CheckpointNotFound, match="not a directory"):
        load(tmp_path / "nope")


def test_missing_config_json_is_checkpoint_not_found(ckpt: Path) -> None:
    (ckpt / "config.json").unlink()
    with pytest.raises(CheckpointNotFound, match=r"config\.json"):
        load(ckpt)


def test_pytorch_bin_only_is_refused_with_what_was_found(ckpt: Path) -> None:
    (ckpt / "model.safetensors").rename(ckpt / "pytorch_model.bin")
    with pytest.raises(CheckpointNotFound, match="only safetensors"):
        load(ckpt)


def test_missing_tensor_is_named(ckpt: Path, never_builds: None) -> None:
    _edit_weights(ckpt, lambda t: t.pop("model.layers.1.self_attn.k_proj.weight"))
    with pytest.raises(CheckpointMismatch, match="missing") as info:
        load(ckpt)
    assert info.value.tensor == "model.layers.1.self_attn.k_proj.weight"


def test_extra_tensor_is_named(ckpt: Path, never_builds: None) -> None:
    _edit_weights(ckpt, lambda t: t.update({"model.layers.0.mlp.bias": torch.zeros(4)}))
    with pytest.raises(CheckpointMismatch, match="unexpected") as info:
        load(ckpt)
    assert info.value.tensor == "model.layers.0.mlp.bias"


def test_wrong_shape_is_named_with_both_shapes(ckpt: Path, never_builds: None) -> None:
    _edit_weights(ckpt, lambda t: t.update({LAST: torch.zeros(64, 95)}))
    with pytest.raises(CheckpointMismatch, match=r"\[64, 95\], expected \[64, 96\]") as info:
        load(ckpt)
    assert info.value.tensor == LAST


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_weight_is_named_before_anything_is_built(
    ckpt: Path, never_builds: None, bad: float
) -> None:
    def poison(t: dict[str, torch.Tensor]) -> None:
        t[LAST] = t[LAST].clone()
        t[LAST][3, 7] = bad

    _edit_weights(ckpt, poison)
    with pytest.raises(NonFiniteWeights) as info:
        load(ckpt)
    assert info.value.tensor == LAST and info.value.count == 1


def test_index_pointing_at_a_missing_shard_names_the_shard(tmp_path: Path, never_builds: None) -> None:
    save_checkpoint(tmp_path, 12, max_shard_size="60KB")
    victim = sorted(tmp_path.glob("model-*.safetensors"))[1]
    victim.unlink()
    with pytest.raises(CheckpointNotFound, match=victim.name):
        load(tmp_path)


def test_corrupt_weight_file_is_checkpoint_corrupt(ckpt: Path) -> None:
    (ckpt / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all")
    with pytest.raises(CheckpointCorrupt, match=r"model\.safetensors"):
        load(ckpt)


@pytest.mark.parametrize(
    ("field", "edit"),
    [
        ("rope_parameters.rope_type", lambda r: r["rope_parameters"].update(rope_type="yarn", factor=4.0)),
        ("rope_scaling", lambda r: r.update(rope_scaling={"type": "linear", "factor": 2.0})),
        ("hidden_act", lambda r: r.update(hidden_act="gelu")),
        ("model_type", lambda r: r.update(model_type="llama")),
        ("sliding_window", lambda r: r.update(sliding_window=0)),
        ("num_key_value_heads", lambda r: r.update(num_key_value_heads=3)),
        ("num_experts_per_tok", lambda r: r.update(num_experts_per_tok=5)),
        ("quantization_config", lambda r: r.update(quantization_config={"quant_method": "gptq"})),
        ("mystery_knob", lambda r: r.update(mystery_knob=True)),
        ("vocab_size", lambda r: r.pop("vocab_size")),
    ],
)
def test_unsupported_config_names_the_field(ckpt: Path, never_builds: None, field: str, edit) -> None:  # type: ignore[no-untyped-def]
    _edit_config(ckpt, edit)
    with pytest.raises(UnsupportedConfig) as info:
        load(ckpt)
    assert info.value.field == field and field in str(info.value)


def test_unreadable_tokenizer_is_tokenizer_invalid(ckpt: Path, never_builds: None) -> None:
    (ckpt / "tokenizer.json").write_text("{}")
    with pytest.raises(TokenizerInvalid, match=r"tokenizer\.json"):
        load(ckpt)


def test_unknown_quantization_is_refused_before_reading(ckpt: Path, never_builds: None) -> None:
    with pytest.raises(UnsupportedQuantization, match="int3"):
        load(ckpt, quantize="int3")


def test_experts_stored_stacked_as_transformers_v5_holds_them_load_too(
    ckpt: Path, pristine: tuple[Path, torch.Tensor]
) -> None:
    def stack(t: dict[str, torch.Tensor]) -> None:
        for n in range(2):
            old, new = f"model.layers.{n}.block_sparse_moe.", f"model.layers.{n}.mlp."
            t[new + "gate.weight"] = t.pop(old + "gate.weight")
            experts = [[t.pop(f"{old}experts.{e}.{w}.weight") for w in ("w1", "w3", "w2")] for e in range(4)]
            t[new + "experts.gate_up_proj"] = torch.stack([torch.cat([w1, w3]) for w1, w3, _ in experts])
            t[new + "experts.down_proj"] = torch.stack([w2 for _, _, w2 in experts])

    _edit_weights(ckpt, stack)
    got = load(ckpt, device="cpu").logits(torch.tensor([[4, 8, 15, 16, 23, 42]]))
    assert (got - pristine[1]).abs().max().item() < 1e-4
    int8 = load(ckpt, device="cpu", quantize="int8").logits(torch.tensor([[4, 8, 15, 16, 23, 42]]))
    assert (int8 - pristine[1]).abs().max().item() < 0.15 * pristine[1].abs().max().item()
    _edit_weights(ckpt, lambda t: t.pop("model.layers.1.mlp.experts.down_proj"))
    with pytest.raises(CheckpointMismatch, match="missing") as info:
        load(ckpt)
    assert info.value.tensor == "model.layers.1.mlp.experts.down_proj"
