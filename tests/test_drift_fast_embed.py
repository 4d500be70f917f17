"""default_embedder(): the int8 ONNX Runtime export of all-MiniLM-L6-v2 against the fp32
Sentence-BERT model it replaces, its per-machine cache, the fp32 fallback, and where the
backend is named (/metrics, the drift report).

The export (tens of seconds) runs once per test session, into the session's
$INFERSIGHT_CACHE_DIR (tests/conftest.py); every test here reuses it."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import numpy as np
import pytest
from _drift_helpers import real_embedder
from infersight.monitor.data import banking77
from infersight.monitor.drift import (
    CachedEmbedder,
    DetectorConfig,
    DriftDetector,
    OnnxEmbedder,
    TextWindow,
    default_embedder,
)
from infersight.monitor.drift._fast_embed import (
    bucket_width,
    embedder_cache_dir,
    load_tokenizer,
    plan_batches,
)
from infersight.monitor.drift.errors import EmbedderUnavailable
from prometheus_client import CollectorRegistry, generate_latest


@pytest.fixture(scope="module")
def fast() -> OnnxEmbedder:
    embedder = OnnxEmbedder(threads=1)
    embedder.encode(["load the session (and export, the first time this session)"])
    return embedder


def _texts(n: int) -> list[str]:
    distinct = list(dict.fromkeys(u.text for u in banking77("test")))
    return distinct[:: len(distinct) // n][:n]


def test_int8_embeddings_match_fp32_ones_on_banking77(fast: OnnxEmbedder) -> None:
    texts = _texts(200)
    fp32 = real_embedder().encode(texts)
    int8 = fast.encode(texts)
    assert int8.shape == fp32.shape == (200, 384) and int8.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(int8, axis=1), 1.0, atol=1e-4)
    cos = np.einsum("ij,ij->i", int8, fp32)
    assert np.median(cos) >= 0.99
    assert np.quantile(cos, 0.01) >= 0.97
    # batches are ordered by length, and each row still comes back in its text's place (the
    # activations' int8 scale is per batch, so other batchmates move a row a little, no more)
    again = fast.encode(texts[::-1])[::-1]
    assert np.einsum("ij,ij->i", again, int8).min() >= 0.97
    assert fast.encode([]).shape == (0, 384)


def test_batches_cover_every_text_once_and_pad_less_than_fixed_ones() -> None:
    from infersight.monitor.drift._windows import default_model_path

    tokenizer = load_tokenizer(default_model_path())
    texts = _texts(256)
    lengths = np.array([len(e.ids) for e in tokenizer.encode_batch(texts)])
    plan = plan_batches(lengths, 64, 256)
    rows = np.concatenate([idx for idx, _ in plan])
    assert sorted(rows.tolist()) == list(range(256))  # each text in exactly one batch
    for idx, width in plan:
        assert idx.size in (1, 2, 4, 8, 16, 32, 64)  # few shapes: compiled ones are reused
        assert lengths[idx].max() <= width == bucket_width(int(lengths[idx].max()), 256)
    padded = sum(idx.size * width for idx, width in plan)
    order = np.sort(lengths)
    fixed = sum(64 * int(order[s : s + 64].max()) for s in range(0, 256, 64))
    assert padded < 0.8 * fixed  # the longest texts no longer pad 64 short ones
    assert [bucket_width(w, 256) for w in (8, 9, 17, 33, 250, 300)] == [8, 10, 20, 40, 256, 300]
    assert plan_batches(np.array([7]), 64, 256)[0][1] == 7
    assert plan_batches(np.zeros(0, dtype=np.int64), 64, 256) == []


def test_the_export_is_made_once_per_machine_and_reused(fast: OnnxEmbedder) -> None:
    path = fast.export_path
    assert path.is_file() and path.is_relative_to(embedder_cache_dir())
    made = path.stat().st_mtime_ns
    again = OnnxEmbedder(threads=1)
    assert again.export_path == path
    again.encode(["a second embedder in the same process"])
    assert again.exported is False and path.stat().st_mtime_ns == made


def test_the_default_embedder_is_the_int8_one_behind_a_cache(fast: OnnxEmbedder) -> None:
    embedder = default_embedder(threads=1, backend="onnxruntime")
    assert isinstance(embedder, CachedEmbedder) and isinstance(embedder.inner, OnnxEmbedder)
    assert (embedder.backend, embedder.precision) == ("onnxruntime", "int8")
    # its name differs from the fp32 model's: stored fp32 reference embeddings are not reused
    assert embedder.name == real_embedder().name + "+onnxruntime-int8"
    # auto: an int8 model, whichever runtime measured faster here (tests/test_drift_openvino_embed.py)
    auto = DriftDetector().embedder
    assert (auto.backend, auto.precision) in {("onnxruntime", "int8"), ("openvino", "int8")}  # type: ignore[attr-defined]
    with pytest.raises(
        ValueError, match="valid backends are auto, onnxruntime, openvino, sentence-transformers"
    ):
        default_embedder(backend="tensorrt")


def test_without_onnxruntime_it_falls_back_to_fp32_with_one_log_line(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # `import onnxruntime` raises ImportError
    with caplog.at_level(logging.INFO, logger="infersight.monitor.drift"):
        embedder = default_embedder()
    lines = [r for r in caplog.records if r.name.startswith("infersight.monitor.drift")]
    assert len(lines) == 1 and lines[0].levelno == logging.WARNING
    assert "fp32 sentence-transformers" in lines[0].getMessage() and "onnxruntime" in lines[0].getMessage()
    assert (embedder.backend, embedder.precision) == ("sentence-transformers", "fp32")  # type: ignore[attr-defined]
    assert embedder.name == real_embedder().name  # type: ignore[attr-defined]
    np.testing.assert_array_equal(
        embedder.encode(["my card was declined"]), real_embedder().encode(["my card was declined"])
    )
    with pytest.raises(EmbedderUnavailable, match="onnxruntime backend cannot run"):
        default_embedder(backend="onnxruntime")


def test_a_model_the_export_does_not_cover_stays_fp32(tmp_path: Path) -> None:
    (tmp_path / "modules.json").write_text('[{"idx": 0, "name": "0", "path": "", "type": "x.Transformer"}]')
    embedder = default_embedder(tmp_path, cache_entries=0)
    assert (embedder.backend, embedder.precision) == ("sentence-transformers", "fp32")  # type: ignore[attr-defined]


def test_metrics_and_the_report_name_the_backend(fast: OnnxEmbedder, tmp_path: Path) -> None:
    from infersight.monitor.service.config import DriftConfig
    from infersight.monitor.service.pipeline import TextReservoir
    from infersight.monitor.service.wiring_drift import DriftWiring
    from sqlalchemy import create_engine

    registry = CollectorRegistry()
    engine = create_engine(f"sqlite:///{tmp_path / 'db.sqlite'}")
    wiring = DriftWiring(
        DriftConfig(embed_threads=1, embedder="onnxruntime"), engine, registry, TextReservoir(16)
    )
    exposed = generate_latest(registry).decode()
    assert 'infersight_embedder_info{backend="onnxruntime",precision="int8"} 1.0' in exposed

    texts = _texts(160)
    detector = DriftDetector(CachedEmbedder(fast), DetectorConfig())
    report = detector.score(TextWindow.of(texts[:80]), TextWindow.of(texts[80:]))
    assert report.context.embedder == f"{fast.name} (onnxruntime int8)"
    assert "onnxruntime int8" in report.to_json()["embedder"]
    assert wiring.detector.embedder_label.endswith("(onnxruntime int8)")


def test_the_service_makes_the_auto_embedder_at_first_use_not_at_start(
    fast: OnnxEmbedder, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`drift.embedder: auto` may export and time two runtimes on a new machine (tens of
    seconds): the service starts without it and makes it when the first texts are embedded."""
    from infersight.monitor import drift
    from infersight.monitor.service.config import DriftConfig
    from infersight.monitor.service.pipeline import TextReservoir
    from infersight.monitor.service.wiring_drift import DriftWiring
    from sqlalchemy import create_engine

    made: list[str] = []

    def default_embedder(**kwargs: object) -> OnnxEmbedder:
        made.append(str(kwargs["backend"]))
        return fast

    monkeypatch.setattr(drift, "default_embedder", default_embedder)
    registry = CollectorRegistry()
    wiring = DriftWiring(DriftConfig(embed_threads=1), create_engine(f"sqlite:///{tmp_path / 'db.sqlite'}"),
                         registry, TextReservoir(16))  # fmt: skip
    assert made == [] and 'backend="auto (chosen at first use)"' in generate_latest(registry).decode()
    rows = wiring.detector.embedder.encode(["my card was declined", "where is my refund"])
    assert rows.shape == (2, 384) and made == ["auto"]
    assert (
        'infersight_embedder_info{backend="onnxruntime",precision="int8"} 1.0'
        in generate_latest(registry).decode()
    )
    assert wiring.detector.embedder_name == fast.name and made == ["auto"]  # made once
