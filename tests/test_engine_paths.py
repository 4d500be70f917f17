"""The decode path is chosen by measuring at load, cached across restarts, and a machine where
no native library loads serves on the eager path with one log line, never an error.

Exactness of each path against transformers is tests/test_engine_exact.py's job; here the
eager fallbacks are also checked to produce the eager path's logits.
"""

from __future__ import annotations

import json
import logging
import stat
from pathlib import Path

import pytest
import torch
from infersight.collectors import EnginePathCollector
from infersight.engine import EnginePath, MoEModel, isa, load, native
from infersight.engine.errors import CacheCapacityExceeded, InvalidInput, KernelUnavailable
from infersight.engine.native import NativeProjection
from infersight.engine.network import KVCache
from infersight.engine.paths import cpu_model
from prometheus_client import CollectorRegistry, generate_latest

from tests._engine_checkpoints import save_checkpoint

IDS = torch.tensor([[3, 17, 42, 5, 61]])


@pytest.fixture
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "cache"
    monkeypatch.setenv("INFERSIGHT_CACHE_DIR", str(path))
    return path / "engine"


@pytest.fixture
def checkpoint(tmp_path: Path) -> Path:
    save_checkpoint(tmp_path / "ckpt", 11)
    return tmp_path / "ckpt"


@pytest.fixture
def no_library(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The package without its libraries (an sdist built where the compiler failed): the
    folder they are looked up in is an empty one."""
    empty = tmp_path / "no-libraries"
    empty.mkdir()
    monkeypatch.setattr(native, "LIBRARY_DIR", empty)
    return empty


def _fake_compiler(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, script: str) -> None:
    """$CC is a shell script standing in for a broken compiler (the only stand-in here)."""
    cc = tmp_path / "broken-cc"
    cc.write_text("#!/bin/sh\n" + script)
    cc.chmod(cc.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("CC", str(cc))


def _engine_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "infersight.engine" and r.levelno >= logging.WARNING
    ]


def test_first_load_measures_and_a_restart_reads_the_cached_verdict(
    checkpoint: Path, cache_dir: Path
) -> None:
    first = load(checkpoint, device="cpu")
    assert first.engine_path.reason == "measured"
    assert first.engine_path.cpu == cpu_model()
    assert [rows for rows, _ in first.engine_path.speedups] == [1, 8]
    assert all(ratio > 0 for _, ratio in first.engine_path.speedups)
    verdicts = json.loads((cache_dir / "paths.json").read_text())
    ((key, verdict),) = verdicts.items()
    assert cpu_model() in key and verdict["path"] == first.engine_path.name
    assert not list(cache_dir.glob("*.so"))  # the packaged library: nothing was built

    again = load(checkpoint, device="cpu")  # a restart: same machine, same shapes
    assert again.engine_path.reason == "cached"
    assert again.engine_path.name == first.engine_path.name
    assert again.engine_path.speedups == first.engine_path.speedups  # as measured, through JSON
    assert torch.allclose(again.logits(IDS), first.logits(IDS), atol=1e-5)


@pytest.mark.parametrize("quantize", [None, "int8"])
def test_prefill_takes_the_way_measured_faster_for_the_prompts_length(
    checkpoint: Path, cache_dir: Path, quantize: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The load also times the native step's prefill (a prompt as rows of one slot) against
    the eager forward at 16 and 128 tokens; the verdict keeps both ratios, a restart reads
    them back, and each prompt takes the way that was faster at the nearer length, with the
    same last-token logits either way."""
    model = load(checkpoint, device="cpu", quantize=quantize, engine_path="auto")
    if model.native_step is None:
        pytest.fail(f"the native path lost on decode here ({model.engine_path.describe()}): nothing to check")
    ratios = model.native_step.prefill_speedups
    assert [n for n, _ in ratios] == [16, 128] and all(r > 0 for _, r in ratios)
    ((_, verdict),) = [
        kv for kv in json.loads((cache_dir / "paths.json").read_text()).items() if kv[1].get("prefill")
    ]
    assert [tuple(pair) for pair in verdict["prefill"]] == list(ratios)
    again = load(checkpoint, device="cpu", quantize=quantize, engine_path="auto")
    assert again.engine_path.reason == "cached" and again.native_step is not None
    assert again.native_step.prefill_speedups == ratios
    step = again.native_step
    for tokens, ratio in ratios:
        assert step.prefills(tokens) == (ratio > 1.0)
    step.prefill_speedups = ((16, 2.0), (128, 0.5))  # native for short prompts only
    assert [step.prefills(n) for n in (1, 16, 40, 50, 128, 400)] == [True, True, True, False, False, False]
    ids = torch.tensor([3, 17, 42, 5, 61, 9, 8, 90, 7, 1])
    cache = again.new_cache(max_batch=1, max_seq_len=16)
    native_logits = again.prefill(cache, 0, ids)
    called: list[int] = []
    monkeypatch.setattr(step, "prefill", lambda *a: called.append(1))  # must not be taken now
    step.prefill_speedups = ((16, 0.5), (128, 0.5))
    eager_logits = again.prefill(cache, 0, ids)
    assert not called
    bound = 1e-4 if quantize is None else 0.03 * eager_logits.abs().max().item()
    assert (native_logits - eager_logits).abs().max().item() < bound


def test_the_chosen_path_is_the_one_measured_faster(checkpoint: Path, cache_dir: Path) -> None:
    model = load(checkpoint, device="cpu")
    ratios = [ratio for _, ratio in model.engine_path.speedups]
    geometric = (ratios[0] * ratios[1]) ** 0.5
    assert model.engine_path.name == ("native" if geometric > 1.0 else "eager")
    wqkv = model.network.layers[0].attention.wqkv
    assert isinstance(wqkv, NativeProjection) == (model.engine_path.name == "native")


def test_without_a_compiler_the_packaged_library_serves(
    checkpoint: Path, cache_dir: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """No compiler at all (a slim image): the library the package carries for this CPU's level
    runs, with no warning; asking for a -march build as well only adds one log line."""
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.setenv("PATH", str(checkpoint))  # no cc, no gcc
    caplog.set_level(logging.INFO, logger="infersight.engine")
    (best, *_) = isa.supported(isa.cpu_flags())
    model = load(checkpoint, device="cpu", engine_path="native")
    assert model.engine_path.name == "native" and model.native_step is not None
    assert model.native_step.kernels.path == native.LIBRARY_DIR / best.library
    assert not _engine_warnings(caplog)
    monkeypatch.setenv(native.MARCH_ENV, "native")
    again = load(checkpoint, device="cpu", engine_path="native")
    assert again.native_step is not None and again.native_step.kernels.level == best.name
    (line,) = _engine_warnings(caplog)
    assert "no C compiler" in line and f"packaged {best.name}" in line
    assert not list(cache_dir.glob("*.so"))
    torch.testing.assert_close(again.logits(IDS), model.logits(IDS), rtol=0, atol=0)


def test_no_library_for_this_cpu_falls_back_to_eager_with_one_log_line(
    checkpoint: Path, cache_dir: Path, no_library: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="infersight.engine")
    model = load(checkpoint, device="cpu", engine_path="native")
    assert model.engine_path.name == "eager"
    assert model.engine_path.reason.startswith("fallback: no packaged native library loads")
    (line,) = _engine_warnings(caplog)
    assert "eager path" in line and "not built" in line
    eager = load(checkpoint, device="cpu", engine_path="eager")
    assert torch.equal(model.logits(IDS), eager.logits(IDS))


def test_another_architecture_has_no_x86_library(no_library: Path) -> None:
    """An aarch64 machine: the one level it has is the plain C build (`generic`); its flags
    say nothing of x86 levels. Where that is not built either, nothing loads."""
    assert isa.supported(frozenset({"fp", "asimd"}), "aarch64") == (isa.GENERIC,)
    assert isa.levels_for("aarch64") == (isa.GENERIC,)
    assert isa.supported(None, "x86_64") == ()  # no /proc/cpuinfo: no level assumed
    with pytest.raises(KernelUnavailable, match="generic: not built"):
        native.packaged(frozenset({"fp", "asimd"}), "aarch64")
    with pytest.raises(KernelUnavailable, match="runs on this CPU"):  # an x86-64 older than v2
        native.packaged(frozenset({"sse2", "cx16"}), "x86_64")


def test_a_failed_march_build_runs_the_packaged_library_with_one_log_line(
    tmp_path: Path,
    checkpoint: Path,
    cache_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    _fake_compiler(tmp_path, monkeypatch, 'echo "native.c:1: error: unknown target" >&2\nexit 1\n')
    monkeypatch.setenv(native.MARCH_ENV, "native")
    caplog.set_level(logging.INFO, logger="infersight.engine")
    model = load(checkpoint, device="cpu", engine_path="native")
    assert model.engine_path.name == "native" and model.native_step is not None
    assert model.native_step.kernels.level == isa.supported(isa.cpu_flags())[0].name
    (line,) = _engine_warnings(caplog)
    assert "failed (1): native.c:1: error: unknown target" in line


def test_a_failed_march_build_without_a_packaged_library_falls_back_to_eager(
    tmp_path: Path,
    checkpoint: Path,
    cache_dir: Path,
    no_library: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    _fake_compiler(tmp_path, monkeypatch, 'echo "native.c:1: error: unknown target" >&2\nexit 1\n')
    monkeypatch.setenv(native.MARCH_ENV, "native")
    caplog.set_level(logging.INFO, logger="infersight.engine")
    model = load(checkpoint, device="cpu")  # auto
    assert model.engine_path.name == "eager"
    assert "failed (1): native.c:1: error: unknown target" in model.engine_path.reason
    assert len(_engine_warnings(caplog)) == 1
    assert model.generate(IDS, 3).shape == (1, 3)


def test_a_library_that_will_not_load_falls_back_to_eager(
    tmp_path: Path,
    checkpoint: Path,
    cache_dir: Path,
    no_library: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # a packaged file that is not a shared library, and a -march "build" that writes another
    for level in isa.supported(isa.cpu_flags()):
        (no_library / level.library).write_text("junk")
    _fake_compiler(tmp_path, monkeypatch, 'while [ "$1" != "-o" ]; do shift; done\necho junk > "$2"\n')
    monkeypatch.setenv(native.MARCH_ENV, "native")
    model = load(checkpoint, device="cpu", engine_path="native")
    assert model.engine_path.name == "eager" and "cannot load" in model.engine_path.reason
    assert len(_engine_warnings(caplog)) == 1


def test_an_unwritable_cache_directory_still_serves_the_packaged_library(
    tmp_path: Path, checkpoint: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    monkeypatch.setenv("INFERSIGHT_CACHE_DIR", str(blocker))  # .../engine cannot be made under a file
    monkeypatch.setenv(native.MARCH_ENV, "native")  # nor a library built into it
    model = load(checkpoint, device="cpu", engine_path="native")
    assert model.engine_path.name == "native" and model.native_step is not None
    (line,) = _engine_warnings(caplog)
    assert "cannot build into" in line


def test_paths_without_a_native_variant_are_eager_and_say_so(checkpoint: Path, cache_dir: Path) -> None:
    # int4 weights with fp32 activations: the native steps are for bf16 quantised models
    int4 = load(checkpoint, device="cpu", quantize="int4", dtype=torch.float32)
    assert int4.engine_path == EnginePath("eager", cpu_model(), "not applicable", 0.0, (), "none", "fp32")
    assert int4.native_step is None
    forced = load(checkpoint, device="cpu", engine_path="eager")
    assert (forced.engine_path.name, forced.engine_path.reason) == ("eager", "requested")
    assert not cache_dir.exists()  # nothing was built or measured for either


@pytest.mark.parametrize("quantize", ["int8", "int4"])
def test_quantised_models_are_measured_on_the_loaded_model_and_the_verdict_cached(
    checkpoint: Path, cache_dir: Path, quantize: str
) -> None:
    first = load(checkpoint, device="cpu", quantize=quantize)
    if quantize == "int4" and not native.kernels(cache_dir, cpu=cpu_model()).int8_dot:
        # int4's native step needs the int8-activation loops (VNNI or AVX2): without them it stays eager, and says why
        assert (first.engine_path.name, first.engine_path.reason) == ("eager", "not applicable")
        return
    assert first.engine_path.reason == "measured"
    assert [rows for rows, _ in first.engine_path.speedups] == [1, 8]
    geometric = (first.engine_path.speedups[0][1] * first.engine_path.speedups[1][1]) ** 0.5
    assert first.engine_path.name == ("native" if geometric > 1.0 else "eager")
    assert (first.native_step is not None) == (first.engine_path.name == "native")
    again = load(checkpoint, device="cpu", quantize=quantize)
    assert again.engine_path.reason == "cached" and again.engine_path.name == first.engine_path.name
    fp32 = load(checkpoint, device="cpu")  # its own verdict: not the quantised one
    assert fp32.engine_path.reason == "measured"


def _builds() -> list[str]:
    """The libraries this CPU runs: every packaged level it supports (isa.py), and a
    `-march=native` build ($INFERSIGHT_ENGINE_MARCH) where there is a compiler."""
    levels = [level.name for level in isa.supported(isa.cpu_flags())]
    return (["march=native"] if native.compiler() else []) + levels


def _decodes(model: MoEModel, ids: torch.Tensor) -> torch.Tensor:
    """Logits of 4 decode steps of 3 rows after 8-token prompts: [4, 3, V]."""
    cache = model.new_cache(max_batch=3, max_seq_len=16)
    for row in range(3):
        model.prefill(cache, row, ids[row, :8])
    steps = [model.decode(cache, torch.arange(3), ids[:, t], torch.full((3,), t)) for t in range(8, 12)]
    return torch.stack(steps)


def test_every_build_this_cpu_runs_decodes_alike(
    tmp_path: Path, cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Parity across the library's instruction sets (each packaged level this CPU runs, chosen
    as on a CPU with just that level's flags, and a `-march=native` build), in every mode of
    the native step: fp32 within 1e-4 of
    the eager decode with the same greedy tokens; int8 with its weights dequantised within 3%
    of the largest logit of the eager int8 decode; and every mode within 1e-3 of the largest
    logit across the builds that have it (fp8's distance to its eager decode is
    tests/test_engine_fp8.py's, on weights whose routing margins bf16 does not flip) (the integer products are exact in each: only the
    order of the fp32 sums differs). The plain C build has no int8-activation loops: int8
    keeps fp32 activations on it and int4 stays eager, saying why."""
    save_checkpoint(tmp_path / "ckpt", 5, hidden_size=128, intermediate_size=96, vocab_size=256)
    ids = torch.randint(0, 256, (3, 12), generator=torch.Generator().manual_seed(5))
    modes = {
        "fp32": (None, False),
        "int8": ("int8", False),
        "int8-act8": ("int8", True),
        "int4": ("int4", True),
        "fp8": ("fp8", False),
    }
    eager = {
        q: _decodes(load(tmp_path / "ckpt", device="cpu", quantize=q, engine_path="eager"), ids)
        for q in (None, "int8")
    }
    per_mode: dict[str, list[torch.Tensor]] = {mode: [] for mode in (*modes, "fp8-bf16", "fp8-head8")}
    builds = _builds()
    assert builds, "no native library runs on this CPU"
    levels = {level.name: level for level in isa.LEVELS}
    for build in builds:
        if build == "march=native":
            monkeypatch.setenv(native.MARCH_ENV, "native")
        else:  # a CPU showing only this level's flags
            monkeypatch.delenv(native.MARCH_ENV, raising=False)
            monkeypatch.setattr(isa, "cpu_flags", lambda flags=levels[build].requires: flags)
        kernels = native.kernels(cache_dir, cpu=cpu_model())
        assert kernels.level == build
        if build == "x86-64-v2":
            assert not kernels.avx512 and not kernels.int8_dot
        if build == "x86-64-v3":
            assert not kernels.avx512 and kernels.int8_dot
        if build.startswith("x86-64-v4"):
            assert kernels.avx512 and kernels.vnni == build.endswith(("vnni", "bf16"))
            assert kernels.bf16 == build.endswith("bf16")
        for mode, (quantize, act8) in modes.items():
            model = load(tmp_path / "ckpt", device="cpu", quantize=quantize, engine_path="native")
            step = model.native_step
            if step is None:
                assert mode == "int4" and not kernels.int8_dot
                assert model.engine_path.reason == "not applicable"
                continue
            assert step.kernels.path == kernels.path
            assert model.engine_path.kernels == kernels.isa  # what the path-info metric labels
            acts = "int8" if step.act8 or step.int4 else "bf16" if step.fp8 and kernels.bf16 else "fp32"
            assert bool(step.model.fp8_packed) == (
                step.fp8 and kernels.fp8_packed
            )  # the quantizer writes no subnormals
            assert model.engine_path.activations == acts
            step.act8 = act8
            if act8 and not kernels.int8_dot:
                continue  # the setter kept fp32 activations: the "int8" mode again
            # fp8's int8 head reads int8 activations where the build has their loops: a mode of its own
            fp8_kind = ("-bf16" if kernels.bf16 else "-head8" if kernels.int8_dot else "") if step.fp8 else ""
            per_mode[mode + fp8_kind].append(_decodes(model, ids))
    for got in per_mode["fp32"]:
        torch.testing.assert_close(got, eager[None], atol=1e-4, rtol=0)
        assert torch.equal(got.argmax(-1), eager[None].argmax(-1))
    for got in per_mode["int8"]:
        assert (got - eager["int8"]).abs().max().item() < 0.03 * eager["int8"].abs().max().item()
    for got in per_mode["fp8-bf16"] + per_mode["fp8-head8"]:  # bf16 or int8 activations: as far
        ref = per_mode["fp8"][0]  # from fp32 ones as int8's are
        assert (got - ref).abs().max().item() < 0.03 * ref.abs().max().item()
    for mode, got in per_mode.items():
        # those need the int8-activation loops, or AVX512-BF16
        assert got or mode in ("int8-act8", "int4", "fp8-bf16", "fp8-head8"), mode
        if mode == "fp8-head8":  # the body's fp32 sums differ in order by ISA, and one rounding
            continue  # of the head's int8 activations turned by that is a whole step: 3% above
        for other in got[1:]:
            assert (other - got[0]).abs().max().item() < 1e-3 * got[0].abs().max().item(), mode


def test_the_native_step_refuses_a_bad_token_slot_or_position_writing_nothing(
    checkpoint: Path, cache_dir: Path
) -> None:
    model = load(checkpoint, device="cpu", engine_path="native")
    assert model.native_step is not None
    cache = model.new_cache(max_batch=2, max_seq_len=8)
    model.prefill(cache, 0, torch.tensor([3, 4]))
    before = (cache.k.clone(), cache.v.clone())
    ids = torch.tensor([5, 6])
    with pytest.raises(InvalidInput, match=r"token ids must lie in \[0, 96\), got 96"):
        model.decode(cache, torch.tensor([0, 1]), torch.tensor([5, 96]), torch.tensor([2, 0]))
    # the C step checks every row before the first write: a good row 0 is not written either
    with pytest.raises(CacheCapacityExceeded, match=r"slots must lie in \[0, 2\), got 2"):
        model.decode(cache, torch.tensor([0, 2]), ids, torch.tensor([2, 0]))
    with pytest.raises(CacheCapacityExceeded, match=r"slots must lie in \[0, 2\), got -1"):
        model.decode(cache, torch.tensor([0, -1]), ids, torch.tensor([2, 0]))
    with pytest.raises(CacheCapacityExceeded, match=r"positions must lie in \[0, 8\), got 8"):
        model.decode(cache, torch.tensor([0, 1]), ids, torch.tensor([2, 8]))
    with pytest.raises(CacheCapacityExceeded, match=r"positions must lie in \[0, 8\), got -3"):
        model.decode(cache, torch.tensor([0, 1]), ids, torch.tensor([2, -3]))
    assert torch.equal(cache.k, before[0]) and torch.equal(cache.v, before[1])  # nothing was written
    eager = load(checkpoint, device="cpu", engine_path="eager")
    assert eager.native_step is None
    with pytest.raises(CacheCapacityExceeded, match="positions"):  # the same errors on the eager path
        eager.decode(
            eager.new_cache(max_batch=2, max_seq_len=8), torch.tensor([0]), ids[:1], torch.tensor([8])
        )
    with pytest.raises(CacheCapacityExceeded, match="slots"):
        eager.decode(
            eager.new_cache(max_batch=2, max_seq_len=8), torch.tensor([2]), ids[:1], torch.tensor([0])
        )
    torch.testing.assert_close(  # and a good step after the refusals is the eager one's
        model.decode(cache, torch.tensor([0]), ids[:1], torch.tensor([2])),
        eager.decode(_prefilled(eager), torch.tensor([0]), ids[:1], torch.tensor([2])),
        rtol=0,
        atol=1e-4,
    )
    c = model.config
    foreign = KVCache.allocate(  # a bf16 cache, as an int8 model's: not what this fp32 step reads
        layers=c.num_hidden_layers,
        max_batch=1,
        kv_heads=c.num_key_value_heads,
        max_seq_len=8,
        head_dim=c.head_dim,
        dtype=torch.bfloat16,
        device=torch.device("cpu"),
    )
    with pytest.raises(InvalidInput, match="not this model's"):
        model.decode(foreign, torch.tensor([0]), torch.tensor([5]), torch.tensor([0]))


def _prefilled(model: MoEModel) -> KVCache:
    cache = model.new_cache(max_batch=2, max_seq_len=8)
    model.prefill(cache, 0, torch.tensor([3, 4]))
    return cache


def test_an_unknown_engine_path_is_refused_naming_the_choices(checkpoint: Path) -> None:
    with pytest.raises(InvalidInput, match="engine_path must be one of auto, eager, native, got 'fast'"):
        load(checkpoint, device="cpu", engine_path="fast")


class _Runtime:
    def __init__(self, paths: dict[str, EnginePath | None]) -> None:
        self.paths = paths

    def engine_paths(self) -> dict[str, EnginePath | None]:
        return self.paths


def test_path_info_metric_names_each_serving_versions_path() -> None:
    registry = CollectorRegistry()
    runtime = _Runtime(
        {
            "mixtral_support_fp32-v1.0": EnginePath(
                "native", "AMD EPYC", "cached", 0.25, ((1, 1.3), (8, 1.1)), "avx2", "int8"
            ),
            "mixtral_support_fp32-v1.1": EnginePath("eager", "AMD EPYC", "fallback: no C compiler", 0.01),
        }
    )
    registry.register(EnginePathCollector(runtime, model="mixtral"))
    text = generate_latest(registry).decode()
    assert (
        'infersight_engine_path_info{activations="int8",cpu="AMD EPYC",kernels="avx2",model="mixtral",'
        'model_version="mixtral_support_fp32-v1.0",path="native",reason="cached"} 1.0'
    ) in text
    assert (
        'infersight_engine_path_info{activations="",cpu="AMD EPYC",kernels="none",model="mixtral",'
        'model_version="mixtral_support_fp32-v1.1",path="eager",reason="fallback"} 1.0'
    ) in text
    assert (
        'infersight_engine_path_setup_seconds{model="mixtral",model_version="mixtral_support_fp32-v1.0"} 0.25'
        in text
    )
    runtime.paths = {}
    assert "infersight_engine_path_info{" not in generate_latest(registry).decode()
