"""`infersight demo` end to end, in its fast mode (smaller windows, the same steps and code
path as `make demo`): every step of the incident must happen and be reported."""

from __future__ import annotations

import io
import json
import re
import shlex
import shutil
from pathlib import Path

import pytest
from _demo_registry import shared_demo_registry
from infersight.engine.registry import Registry
from infersight.monitor.cli import main
from infersight.monitor.service.demo import DemoOptions, DemoResult, run_demo
from infersight.monitor.store import connect
from infersight.monitor.store.tables import dataset_collections
from sqlalchemy import select

STEPS = [
    "demo model", "data", "service", "baseline traffic", "baseline drift check", "topic shift traffic",
    "drift flagged", "drift explained", "drift alert", "bad release canary", "canary rolled back",
    "snapshot", "page", "bad release deployed", "automatic rollback", "rollback snapshot", "rollback page",
    "rolled-back drift resolved", "incident data", "prefix cache", "next release built",
    "next release quality", "next release canary",
]  # fmt: skip
NEXT = "mixtral_banking_int4-v1.2"


def test_the_demo_plays_every_step_of_the_incident(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    # the demo's own `models init-demo` keeps versions already registered: start from the
    # session's demo registry (same bytes) to save rebuilding the checkpoints
    shutil.copytree(shared_demo_registry(tmp_path_factory), tmp_path / "registry", symlinks=True)
    out = io.StringIO()
    result = run_demo(DemoOptions(data_dir=tmp_path, fast=True), out)
    text = out.getvalue()
    assert result.ok, text
    assert [s.name for s in result.steps] == STEPS, text
    assert all(s.ok for s in result.steps)
    assert result.snapshot_path is not None and Path(result.snapshot_path).is_file()
    assert "demo complete: every step happened" in text
    share = float(text.split("the bad canary served ")[1].split("%")[0])
    assert 0 < share < 15
    assert result.page_url.startswith("http://127.0.0.1:")
    # the export command it prints works on what the demo left: the bad release's snapshot requests
    [command] = [line.split(": ", 1)[1] for line in text.splitlines() if "infersight dataset export" in line]
    argv = [*shlex.split(command)[1:-1], str(tmp_path / "bad-release.jsonl")]
    assert main(argv) == 0
    rows = [json.loads(x) for x in (tmp_path / "bad-release.jsonl").read_text().splitlines()]
    assert rows and all(r["model_version"] == "mixtral_banking_fp32-v1.1" and r["in_snapshot"] for r in rows)
    # and each automatic rollback (the canary's, then the post-deploy one) opened a collection
    # of the requests that follow it
    db = connect(f"sqlite:///{tmp_path / 'service' / 'infersight.sqlite'}")
    with db.connect() as conn:
        collections = conn.execute(select(dataset_collections)).all()
    db.dispose()
    assert len(collections) >= 2
    for collection in collections[:2]:
        assert collection.kind == "any" and collection.n == 200
        assert collection.reason == "automatic rollback of mixtral_banking_fp32-v1.1"
    # the demo exported what the collections kept, through the API, and the cache saved prefill
    exported = [json.loads(x) for x in (tmp_path / "incident-data.jsonl").read_text().splitlines()]
    assert exported and all(r["model_version"] == "mixtral_banking_fp32-v1.0" for r in exported)
    [cache] = [s for s in result.steps if s.name == "prefix cache"]
    assert float(cache.detail.split(" prompt blocks")[0]) > 0, cache.detail
    _the_next_release_was_built_from_the_incident_and_canaried(tmp_path, result, text)


def _the_next_release_was_built_from_the_incident_and_canaried(
    tmp_path: Path, result: DemoResult, text: str
) -> None:
    # the incident's export calibrated a GPTQ build of the good version, registered as its child
    info = Registry(tmp_path / "registry").get(NEXT)
    assert info.parent == "mixtral_banking_fp32-v1.0" and info.quantize == "int4"
    record = dict(info.quantization)
    assert json.loads(record["method"]) == "gptq" and json.loads(record["samples"]) > 0
    steps = {s.name: s for s in result.steps}
    assert "GPTQ" in steps["next release built"].detail and NEXT in steps["next release built"].detail
    # its quality figures against the good version, on held-out texts
    quality = steps["next release quality"].detail
    assert "perplexity" in quality and "top-1 agreement" in quality and "held-out utterances" in quality
    agreement = float(quality.split("top-1 agreement ")[1].split("%")[0])
    assert 0 < agreement <= 100
    # the canary decided, and the registry's deploy history holds that decision
    canary = steps["next release canary"].detail
    promoted = "promoted to every user" in canary
    assert promoted or "rolled back" in canary, canary
    records = [
        r for r in Registry(tmp_path / "registry").history.records() if NEXT in (r.from_version, r.to_version)
    ]
    assert records[0].reason == "canary" and records[0].to_version == NEXT, records
    end = records[-1]
    if promoted:
        assert (end.reason, end.to_version) == ("canary-promote", NEXT), records
        # after the demo's step of 60 canary requests (alerting.canary_step_requests), not serve's
        # 200; more where the step waited for its paired checks' minimum of pairs
        served = re.search(r"(\d+) canary requests at 50%, no regression", canary)
        assert served is not None and 60 <= int(served.group(1)) < 200, canary
    else:
        assert (end.reason, end.outcome, end.from_version) == ("canary", "rolled_back", NEXT), records
    assert f"its canary: {'promoted' if promoted else 'rolled back'}" in text


def test_a_prefix_cache_that_served_nothing_fails_its_step() -> None:
    from infersight.monitor.service.demo.script import DemoFailed, Timeline, prefix_cache_step

    out = io.StringIO()
    tl = Timeline(out)
    label = 'model="mixtral_banking",model_version="mixtral_banking_fp32-v1.0"'
    with pytest.raises(DemoFailed):
        prefix_cache_step(f'infersight_prefix_cache_hits_total{{{label},tier="memory"}} 0.0\n'
                          f"infersight_prefix_cache_tokens_saved_total{{{label}}} 0.0\n", tl)  # fmt: skip
    assert (
        "[FAILED] prefix cache: no prompt block was served" in out.getvalue()
        and "[ ok ]" not in out.getvalue()
    )
    prefix_cache_step(f'infersight_prefix_cache_hits_total{{{label},tier="memory"}} 3.0\n'
                      f'infersight_prefix_cache_hits_total{{{label},tier="redis"}} 2.0\n', tl)  # fmt: skip
    assert tl.steps[-1].ok and tl.steps[-1].detail.startswith("5 prompt blocks served")


def test_the_demo_names_the_step_that_did_not_happen(tmp_path: Path) -> None:
    (tmp_path / "registry").write_text("not a directory")  # the model step cannot succeed
    out = io.StringIO()
    result = run_demo(DemoOptions(data_dir=tmp_path, fast=True), out)
    assert not result.ok and result.failed_step == "demo model"
    assert "demo FAILED at step 'demo model'" in out.getvalue()


def test_the_smollm2_switch_registers_the_real_model_and_a_release_that_loses_the_question(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """`infersight demo --model smollm2`'s models: SmolLM2-135M-Instruct imported from its GGUF
    as the good version, and as its bad release the same weights with the Q/K rows left in
    llama.cpp's order, registered with the good one as parent. The bad release loads and
    answers, but loses the question: what the canary and the post-deploy analysis catch.
    The whole smollm2 incident takes minutes on two cores: docs/benchmarks/releases.md has
    its run, command and timings."""
    import torch
    from _smollm2 import FP32, smollm2_registry
    from infersight.engine import load
    from infersight.monitor.service.chat_template import render_template
    from infersight.monitor.service.demo.models import prepare_models
    from infersight.monitor.service.demo.timeline import Timeline

    shared = smollm2_registry(tmp_path_factory)  # the demo's own import command, run once a session
    shutil.copytree(shared, tmp_path / "registry", ignore=shutil.ignore_patterns("deploys.json"))
    out = io.StringIO()
    models = prepare_models("smollm2", tmp_path / "registry", Timeline(out))
    assert (models.good, models.bad) == (FP32, "smollm2_instruct_fp32-v1.1")
    registry = Registry(tmp_path / "registry")
    assert registry.get(models.bad).parent == FP32
    assert "ok ] demo model" in out.getvalue()

    def answer(version: str) -> str:
        model = load(registry.get(version).path, device="cpu")
        assert model.chat_template is not None and model.tokenizer is not None
        question = [{"role": "user", "content": "What is the capital of France?"}]
        prompt = render_template(model.chat_template, question, model.special_tokens)
        ids = torch.tensor([model.tokenizer.encode(prompt, add_special_tokens=False).ids])
        return str(model.tokenizer.decode(model.generate(ids, 12)[0].tolist()))

    assert "Paris" in answer(models.good)
    assert "Paris" not in answer(models.bad)
