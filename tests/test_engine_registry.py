"""The version registry: names, metadata, sha256 of the weights, the deploy history."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch
from infersight.engine.errors import (
    InvalidVersionName,
    NotACheckpoint,
    RegistryCorrupt,
    VersionExists,
    VersionNotFound,
)
from infersight.engine.registry import (
    VERSION_RULE,
    DeployHistory,
    DeployRecord,
    Registry,
    VersionName,
    hash_weight_files,
)
from safetensors.torch import save_file


def _checkpoint(path: Path, value: float = 1.0) -> Path:
    """Files only: the registry hashes weights, it does not load them."""
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"model_type": "mixtral"}))
    save_file({"w": torch.full((4, 4), value)}, str(path / "model.safetensors"))
    return path


@pytest.mark.parametrize(
    ("name", "parts"),
    [
        ("mixtral_banking_int8-v1.2", ("mixtral", "banking", "int8", 1, 2)),
        ("mixtral_banking_fp32-v0.0", ("mixtral", "banking", "fp32", 0, 0)),
        ("mixtral8x7b_hotels2_bf16-v12.30", ("mixtral8x7b", "hotels2", "bf16", 12, 30)),
    ],
)
def test_version_names_parse_and_format_back(name: str, parts: tuple[object, ...]) -> None:
    parsed = VersionName.parse(name)
    assert (parsed.arch, parsed.dataset, parsed.quant, parsed.major, parsed.minor) == parts
    assert str(parsed) == name


@pytest.mark.parametrize(
    "name",
    [
        "mixtral-banking-int8-v1.2",
        "mixtral_banking_int8-v1",
        "Mixtral_banking_int8-v1.2",
        "mixtral_banking_int3-v1.2",
        "mixtral_banking_int8-v01.2",
        "mixtral_int8-v1.2",
        "mixtral_banking_int8_v1.2",
        "",
        "../etc_passwd_int8-v1.0",
        "mixtral_banking_int8-v1.2\n",  # `$` matches before a final newline: the whole name must match
    ],
)
def test_bad_version_name_is_refused_with_the_rule(name: str) -> None:
    with pytest.raises(InvalidVersionName) as info:
        VersionName.parse(name)
    assert VERSION_RULE in str(info.value)


def test_register_records_metadata_and_the_weights_sha256(tmp_path: Path) -> None:
    ckpt = _checkpoint(tmp_path / "ckpt")
    registry = Registry(tmp_path / "reg")
    base = registry.register("mixtral_banking_fp32-v1.0", ckpt)
    child = registry.register("mixtral_banking_int8-v1.1", ckpt, quantize="int8", parent=base.name)

    file_digest = hashlib.sha256((ckpt / "model.safetensors").read_bytes()).hexdigest()
    assert dict(base.files) == {"model.safetensors": file_digest}
    assert base.sha256 == hash_weight_files(ckpt)[0]
    assert (base.arch, base.dataset, base.quant, base.major, base.minor) == (
        "mixtral",
        "banking",
        "fp32",
        1,
        0,
    )
    assert base.parent is None and child.parent == base.name
    assert child.quant == "int8" and child.quantize == "int8" and base.quantize is None
    assert base.path == ckpt.resolve()
    assert base.created_at <= child.created_at

    reopened = Registry(tmp_path / "reg")  # metadata is on disk, not in memory
    assert reopened.get(child.name) == child
    assert [v.name for v in reopened.versions()] == [base.name, child.name]
    assert child.name in reopened and "mixtral_banking_fp32-v9.9" not in reopened


def test_sha256_changes_when_one_byte_of_the_weights_changes(tmp_path: Path) -> None:
    a = _checkpoint(tmp_path / "a", 1.0)
    b = _checkpoint(tmp_path / "b", 1.0)
    assert hash_weight_files(a)[0] == hash_weight_files(b)[0]
    data = bytearray((b / "model.safetensors").read_bytes())
    data[-1] ^= 0x01
    (b / "model.safetensors").write_bytes(bytes(data))
    assert hash_weight_files(a)[0] != hash_weight_files(b)[0]


def test_register_copy_puts_the_checkpoint_inside_the_registry(tmp_path: Path) -> None:
    ckpt = _checkpoint(tmp_path / "ckpt")
    info = Registry(tmp_path / "reg").register("mixtral_banking_fp32-v1.0", ckpt, copy=True)
    assert info.path == (tmp_path / "reg" / "mixtral_banking_fp32-v1.0" / "checkpoint").resolve()
    assert hash_weight_files(info.path)[0] == hash_weight_files(ckpt)[0]


def test_register_refuses_bad_input_and_keeps_what_is_stored(tmp_path: Path) -> None:
    ckpt = _checkpoint(tmp_path / "ckpt")
    registry = Registry(tmp_path / "reg")
    first = registry.register("mixtral_banking_fp32-v1.0", ckpt)
    with pytest.raises(VersionExists):
        registry.register("mixtral_banking_fp32-v1.0", ckpt)
    with pytest.raises(VersionNotFound, match=r"mixtral_banking_fp32-v0\.9"):
        registry.register("mixtral_banking_fp32-v1.1", ckpt, parent="mixtral_banking_fp32-v0.9")
    with pytest.raises(InvalidVersionName, match="quantize"):
        registry.register("mixtral_banking_int8-v1.1", ckpt)  # int8 name, no quantize
    with pytest.raises(InvalidVersionName, match="quantize"):
        registry.register("mixtral_banking_fp32-v1.1", ckpt, quantize="int8")
    with pytest.raises(NotACheckpoint, match="does not exist"):
        registry.register("mixtral_banking_fp32-v1.1", tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(NotACheckpoint, match=r"config\.json"):
        registry.register("mixtral_banking_fp32-v1.1", tmp_path / "empty")
    assert [v.name for v in registry.versions()] == [first.name]
    assert registry.get(first.name) == first
    with pytest.raises(VersionNotFound, match=r"known: mixtral_banking_fp32-v1\.0"):
        registry.get("mixtral_banking_fp32-v2.0")


def test_unreadable_metadata_is_a_typed_error(tmp_path: Path) -> None:
    ckpt = _checkpoint(tmp_path / "ckpt")
    registry = Registry(tmp_path / "reg")
    registry.register("mixtral_banking_fp32-v1.0", ckpt)
    (registry.root / "mixtral_banking_fp32-v1.0" / "version.json").write_text("{not json")
    with pytest.raises(RegistryCorrupt, match=r"version\.json"):
        registry.versions()


def test_deploy_history_keeps_a_stack_of_good_versions_across_restarts(tmp_path: Path) -> None:
    path = tmp_path / "deploys.json"
    history = DeployHistory(path)
    assert history.last_good() is None and history.previous_good() is None
    history.record(DeployRecord(1.0, None, "a_b_fp32-v1.0", "start", "deployed"))
    history.record(DeployRecord(2.0, "a_b_fp32-v1.0", "a_b_fp32-v1.1", "deploy", "deployed"))
    history.record(DeployRecord(3.0, "a_b_fp32-v1.1", "a_b_fp32-v1.2", "deploy", "refused", "checksum"))
    reopened = DeployHistory(path)
    assert reopened.good_versions() == ["a_b_fp32-v1.0", "a_b_fp32-v1.1"]
    assert reopened.previous_good() == "a_b_fp32-v1.0"
    reopened.record(DeployRecord(4.0, "a_b_fp32-v1.1", "a_b_fp32-v1.0", "rollback", "deployed"))
    assert DeployHistory(path).good_versions() == ["a_b_fp32-v1.0"]
    assert [r.outcome for r in DeployHistory(path).records()] == [
        "deployed",
        "deployed",
        "refused",
        "deployed",
    ]
    path.write_text("[]")
    with pytest.raises(RegistryCorrupt, match="deploy history"):
        DeployHistory(path).records()
