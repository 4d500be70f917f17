"""The OpenVINO int8 embedder (NNCF static quantization) against the fp32 Sentence-BERT
model, its per-machine cache, the measured choice between it and ONNX Runtime's int8
embedder, the forced backend, and the fall back to ONNX Runtime without openvino.

Both exports and one measurement run once per test session, into the session's
$INFERSIGHT_CACHE_DIR (tests/conftest.py), by the `chosen` fixture; the choice tests then
run in copies of that cache (links to the exports) with the timing replaced."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("openvino")
pytest.importorskip("nncf")

from _drift_helpers import real_embedder
from infersight.monitor.data import banking77
from infersight.monitor.drift import CachedEmbedder, OnnxEmbedder, default_embedder
from infersight.monitor.drift import _openvino_embed as ove
from infersight.monitor.drift._fast_embed import ExportedEmbedder, embedder_cache_dir, padded_batches
from infersight.monitor.drift._openvino_embed import OpenVinoEmbedder
from infersight.monitor.drift.errors import EmbedderUnavailable


@pytest.fixture(scope="module")
def chosen() -> ExportedEmbedder:
    """What `auto` picks at 1 thread: both exports made (or found) and timed once."""
    return ove.choose(threads=1)


@pytest.fixture(scope="module")
def ov(chosen: ExportedEmbedder) -> OpenVinoEmbedder:
    embedder = OpenVinoEmbedder(threads=1)
    embedder.encode(["load the model"])
    return embedder


def _texts(n: int) -> list[str]:
    distinct = list(dict.fromkeys(u.text for u in banking77("test")))
    return distinct[:: len(distinct) // n][:n]


def _linked_cache(tmp_path: Path) -> Path:
    """A cache dir whose export folders link to the session's: no export, no choice made."""
    out = tmp_path / "cache"
    out.mkdir()
    for folder in embedder_cache_dir().iterdir():
        if any(folder.glob("model.int8.*")):
            (out / folder.name).symlink_to(folder, target_is_directory=True)
    return out


def test_openvino_int8_embeddings_match_fp32_ones_on_banking77(ov: OpenVinoEmbedder) -> None:
    texts = _texts(200)
    assert not set(texts) & set(ove.calibration_texts())  # calibrated on other texts (train split)
    fp32 = real_embedder().encode(texts)
    int8 = ov.encode(texts)
    assert int8.shape == fp32.shape == (200, 384) and int8.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(int8, axis=1), 1.0, atol=1e-4)
    cos = np.einsum("ij,ij->i", int8, fp32)
    assert np.median(cos) >= 0.99
    assert np.quantile(cos, 0.01) >= 0.97
    # the activations' scales are fixed at export: other batchmates barely move a row
    again = ov.encode(texts[::-1])[::-1]
    assert np.einsum("ij,ij->i", again, int8).min() >= 0.99
    # nor does the batching: fixed batches of 64 (more padding) give the same rows
    session, tokenizer = ov._load()
    fixed = np.empty_like(int8)
    for idx, ids, mask in padded_batches(tokenizer, texts, 64, plan=False):
        assert idx.size == 64 or idx.size == 200 % 64
        fixed[idx] = ov.run(session, ids, mask)
    assert np.einsum("ij,ij->i", fixed, int8).min() >= 0.999
    assert ov.encode([]).shape == (0, 384)
    assert (ov.backend, ov.precision, ov.dimension) == ("openvino", "int8", 384)
    assert ov.name == real_embedder().name + "+openvino-int8"


def test_the_openvino_export_is_made_once_per_machine_and_reused(ov: OpenVinoEmbedder) -> None:
    path = ov.export_path
    assert path.is_file() and path.with_suffix(".bin").is_file()
    assert path.is_relative_to(embedder_cache_dir())
    made = path.stat().st_mtime_ns
    again = OpenVinoEmbedder(threads=1)
    assert again.export_path == path
    again.encode(["a second embedder in the same process"])
    assert again.exported is False and path.stat().st_mtime_ns == made


def test_auto_keeps_the_choice_measured_once_per_machine(
    chosen: ExportedEmbedder, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert chosen.backend in ("onnxruntime", "openvino")
    choice_file = Path(chosen.choice["path"])  # type: ignore[attr-defined]
    stored = json.loads(choice_file.read_text())
    assert stored["backend"] == chosen.backend and set(stored["cpu_seconds"]) == {"onnxruntime", "openvino"}
    assert stored["cpu_seconds"][chosen.backend] == min(stored["cpu_seconds"].values())

    def no_timing(*_: object) -> dict[str, float]:
        raise AssertionError("measured again")

    monkeypatch.setattr(ove, "_cpu_seconds", no_timing)
    embedder = default_embedder(threads=1)
    assert isinstance(embedder, CachedEmbedder)
    assert embedder.backend == chosen.backend and embedder.inner.choice["measured_now"] is False  # type: ignore[attr-defined]


@pytest.mark.parametrize("faster", ["onnxruntime", "openvino"])
def test_auto_runs_the_faster_backend(
    chosen: ExportedEmbedder, faster: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = _linked_cache(tmp_path)
    seconds = (
        {"onnxruntime": 1.0, "openvino": 2.0}
        if faster == "onnxruntime"
        else {"onnxruntime": 2.0, "openvino": 1.0}
    )
    monkeypatch.setattr(ove, "_cpu_seconds", lambda *_: seconds)
    embedder = default_embedder(threads=1, cache_dir=cache, cache_entries=0)
    assert isinstance(embedder, ExportedEmbedder) and embedder.backend == faster
    assert embedder.choice["measured_now"] is True and embedder.exported is False  # type: ignore[attr-defined]
    assert embedder.encode(["my card was declined"]).shape == (1, 384)
    # another thread count is another choice (the threads are part of what was measured)
    monkeypatch.setattr(ove, "_cpu_seconds", lambda *_: {"onnxruntime": 1.0, "openvino": 1.5})
    assert default_embedder(threads=2, cache_dir=cache, cache_entries=0).backend == "onnxruntime"
    assert default_embedder(threads=1, cache_dir=cache, cache_entries=0).backend == faster


def test_a_backend_can_be_forced_by_argument_or_environment(
    chosen: ExportedEmbedder, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert isinstance(default_embedder(backend="openvino", cache_entries=0), OpenVinoEmbedder)
    monkeypatch.setattr(ove, "choose", lambda *_, **__: pytest.fail("auto measured"))
    monkeypatch.setenv("INFERSIGHT_EMBED_BACKEND", "openvino")
    assert isinstance(default_embedder(cache_entries=0), OpenVinoEmbedder)
    monkeypatch.setenv("INFERSIGHT_EMBED_BACKEND", "onnxruntime")
    assert isinstance(default_embedder(cache_entries=0), OnnxEmbedder)
    # the argument wins over the environment
    assert isinstance(default_embedder(backend="openvino", cache_entries=0), OpenVinoEmbedder)
    monkeypatch.setenv("INFERSIGHT_EMBED_BACKEND", "tensorrt")
    with pytest.raises(ValueError, match="unknown embedder backend 'tensorrt'"):
        default_embedder()


def test_without_openvino_auto_runs_onnxruntime_as_before(
    chosen: ExportedEmbedder, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setitem(sys.modules, "openvino", None)  # `import openvino` raises ImportError
    monkeypatch.setattr(ove, "choose", lambda *_, **__: pytest.fail("auto measured"))
    with caplog.at_level(logging.INFO, logger="infersight.monitor.drift"):
        embedder = default_embedder(threads=1)
    assert isinstance(embedder, CachedEmbedder) and isinstance(embedder.inner, OnnxEmbedder)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    with pytest.raises(EmbedderUnavailable, match="openvino backend cannot run: openvino is not installed"):
        default_embedder(backend="openvino")


def test_a_failing_openvino_export_leaves_onnxruntime(
    chosen: ExportedEmbedder,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    cache = _linked_cache(tmp_path)
    ov_folder = OpenVinoEmbedder(threads=1, cache_dir=cache).export_path.parent
    ov_folder.unlink()  # the OpenVINO export is missing here, and making it fails

    def broken(*_: object, **__: object) -> None:
        raise RuntimeError("no quantizer today")

    monkeypatch.setattr(ove, "export_openvino_int8", broken)
    with caplog.at_level(logging.WARNING, logger="infersight.monitor.drift"):
        embedder = default_embedder(threads=1, cache_dir=cache, cache_entries=0)
    assert isinstance(embedder, OnnxEmbedder)
    assert any("OpenVINO backend failed" in r.getMessage() for r in caplog.records)
    assert not list(cache.rglob("choice.json"))  # nothing cached: a later process tries again
