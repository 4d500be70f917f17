"""The public surface of infersight.engine: exports, sampling, and typed errors for bad calls."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import infersight.engine as engine
import pytest
import torch
from infersight.engine import MoEModel, load
from infersight.engine import errors as engine_errors
from infersight.engine.errors import CacheCapacityExceeded, InvalidInput, InvalidSamplingParams
from infersight.engine.requests import sample

from tests._engine_checkpoints import save_checkpoint


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> MoEModel:
    directory = tmp_path_factory.mktemp("api")
    save_checkpoint(directory, 31)
    return load(directory, device="cpu")


def test_all_lists_exactly_the_public_names_and_each_resolves() -> None:
    assert engine.__all__ == sorted(engine.__all__)
    assert set(engine.__all__) == set(engine._EXPORTS)
    for name in engine.__all__:
        assert getattr(engine, name) is not None
    for needed in ("load", "MoEModel", "ModelConfig", "Runtime", "Registry", "EngineError"):
        assert needed in engine.__all__
    # every error the package raises is in `errors`, under EngineError; the package exports the base
    for name in engine_errors.__all__:
        assert issubclass(getattr(engine_errors, name), engine_errors.EngineError), name
    assert set(engine_errors.__all__) & set(engine.__all__) == {"EngineError"}
    # the network's parts stay in their modules
    assert not {"KVCache", "sample"} & set(engine.__all__)
    with pytest.raises(AttributeError):
        _ = engine.not_a_thing  # type: ignore[attr-defined]


def test_events_and_errors_import_without_torch() -> None:
    code = "import sys, infersight.engine.events, infersight.engine.errors; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_sample_at_temperature_zero_is_argmax() -> None:
    logits = torch.tensor([[0.1, 2.0, -1.0], [3.0, 0.0, 2.9]])
    assert sample(logits, temperature=0.0, top_p=1.0, generator=None).tolist() == [1, 0]


def test_sample_follows_the_distribution_and_top_p_cuts_the_tail() -> None:
    probs = torch.tensor([0.7, 0.2, 0.1])
    logits = probs.log().expand(4000, 3)
    gen = torch.Generator().manual_seed(0)
    counts = torch.bincount(sample(logits, temperature=1.0, top_p=1.0, generator=gen), minlength=3) / 4000
    assert torch.allclose(counts, probs, atol=0.03)
    # tokens more likely than the third already cover 0.9 >= 0.75: it is never drawn
    cut = torch.bincount(sample(logits, temperature=1.0, top_p=0.75, generator=gen), minlength=3) / 4000
    assert cut[2] == 0 and torch.allclose(cut[:2], torch.tensor([0.7, 0.2]) / 0.9, atol=0.03)
    # a tiny top_p keeps only the most likely token
    assert sample(logits, temperature=5.0, top_p=0.01, generator=gen).eq(0).all()


@pytest.mark.parametrize(("temperature", "top_p"), [(-0.5, 1.0), (float("nan"), 1.0), (1.0, 0.0), (1.0, 1.5)])
def test_bad_sampling_values_are_refused(temperature: float, top_p: float) -> None:
    with pytest.raises(InvalidSamplingParams):
        sample(torch.zeros(1, 4), temperature=temperature, top_p=top_p, generator=None)


def test_seeded_sampling_is_reproducible(model: MoEModel) -> None:
    ids = torch.tensor([[1, 2, 3, 4]])
    a = model.generate(ids, 12, temperature=1.0, top_p=0.9, seed=7)
    b = model.generate(ids, 12, temperature=1.0, top_p=0.9, seed=7)
    c = model.generate(ids, 12, temperature=1.0, top_p=0.9, seed=8)
    assert a.shape == (1, 12) and a.dtype == torch.long
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_generate_zero_tokens_and_no_early_stop(model: MoEModel) -> None:
    ids = torch.tensor([[5, 6, 7], [8, 9, 10]])
    assert model.generate(ids, 0).shape == (2, 0)
    assert model.generate(ids, 20).shape == (2, 20)  # EOS is the serving layer's business


@pytest.mark.parametrize(
    "bad",
    [
        torch.tensor([[0.5, 1.0]]),
        torch.tensor([1, 2, 3]),
        torch.tensor([[1, 96]]),
        torch.tensor([[-1, 2]]),
        [[1, 2]],
    ],
    ids=["float", "1-d", "past-vocab", "negative", "list"],
)
def test_bad_token_ids_are_invalid_input(model: MoEModel, bad: object) -> None:
    with pytest.raises(InvalidInput):
        model.logits(bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidInput):
        model.generate(bad, 2)  # type: ignore[arg-type]


def test_cache_limits_are_typed_errors(model: MoEModel) -> None:
    cache = model.new_cache(max_batch=2, max_seq_len=8)
    assert cache.max_batch == 2 and cache.max_seq_len == 8 and cache.nbytes > 0
    with pytest.raises(CacheCapacityExceeded, match="slot"):
        model.prefill(cache, 2, torch.tensor([1, 2]))
    with pytest.raises(CacheCapacityExceeded, match="9 tokens"):
        model.prefill(cache, 0, torch.arange(9))
    model.prefill(cache, 0, torch.arange(4))
    with pytest.raises(CacheCapacityExceeded, match="positions"):
        model.decode(cache, torch.tensor([0]), torch.tensor([1]), torch.tensor([8]))
    with pytest.raises(InvalidInput, match=r"\[B\]"):
        model.decode(cache, torch.tensor([0, 1]), torch.tensor([1]), torch.tensor([4]))
    with pytest.raises(InvalidInput):
        model.new_cache(max_batch=0, max_seq_len=8)
    with pytest.raises(InvalidInput):
        model.generate(torch.tensor([[1]]), -1)


def test_load_defaults_pick_fp32_on_cpu_and_bf16_for_int8(tmp_path: Path) -> None:
    save_checkpoint(tmp_path, 32)
    assert load(tmp_path, device="cpu").dtype == torch.float32
    assert load(tmp_path, device="cpu", quantize="int8").dtype == torch.bfloat16
    assert (
        load(tmp_path, device="cpu", dtype=torch.bfloat16).network.layers[0].moe.experts.w13.dtype
        == torch.bfloat16
    )
