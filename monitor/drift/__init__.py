"""Semantic drift of prompts and responses, scored with Sentence-BERT embeddings.

    detector = DriftDetector()                       # default_embedder(): all-MiniLM-L6-v2, int8
    report = detector.score(read_window("ref.jsonl", "reference"), read_window("now.jsonl"))
    report.drifted, report.p_value, report.to_json()

Batch tests per field (prompt, response): unbiased MMD² with a permutation p-value (exact
kernel, or random Fourier features on large windows) and a nearest-neighbour novelty scan
over several tail cuts with a split-conformal p-value that holds for the reference in use
(the reference's own error bounded first for every cut at once, see `_novelty`); a
one-sided relevance-drop test, conditional in the same way, when responses exist. Each
report states the smallest share of new-topic texts its window detects with 90% power. A weighted Holm correction across every test keeps the report's
false-alarm rate at alpha; effect floors keep large windows from alarming on trivial
shifts. The explanation (witness texts, reference clusters, novelty, a 2-D projection)
never changes the verdict. Request lengths (prompt and output tokens) get their own section
and verdict (`length_drift`: tests valid conditional on the reference). `StreamingDetector`
charts per-request novelty and relevance with CUSUMs designed for the reference's upper
exceedance rate; `evaluate_window` is the scheduler's entry point.

This module is the public API. Every error is in `errors` (all derive from `DriftError`);
the statistics' internals (the tests, Holm's correction, the CUSUM design) and the
explanation's parts stay in their modules, reached through the detector and its report.
"""

from __future__ import annotations

from infersight.monitor.extras import require_extra as _require_extra

_require_extra("infersight.monitor.drift", "drift")  # one line when the extra is missing

from ._detector import DriftDetector, evaluate_window
from ._fast_embed import OnnxEmbedder
from ._lengths import LengthDrift, RequestLengths, length_drift, read_lengths
from ._mmd import TestOptions
from ._openvino_embed import default_embedder
from ._policy import ReferencePolicy, VersionPolicy
from ._references import list_references, load_reference, save_reference, traffic_window
from ._report import DriftMetrics, DriftReport, list_reports, load_report
from ._report_html import render_html
from ._stat_tests import DetectorConfig
from ._streaming import StreamingDetector, StreamUpdate
from ._windows import CachedEmbedder, Embedder, SentenceTransformerEmbedder, TextWindow, read_window
from .errors import DriftError, WindowError

__all__ = [
    "CachedEmbedder",
    "DetectorConfig",
    "DriftDetector",
    "DriftError",
    "DriftMetrics",
    "DriftReport",
    "Embedder",
    "LengthDrift",
    "OnnxEmbedder",
    "ReferencePolicy",
    "RequestLengths",
    "SentenceTransformerEmbedder",
    "StreamUpdate",
    "StreamingDetector",
    "TestOptions",
    "TextWindow",
    "VersionPolicy",
    "WindowError",
    "default_embedder",
    "evaluate_window",
    "length_drift",
    "list_references",
    "list_reports",
    "load_reference",
    "load_report",
    "read_lengths",
    "read_window",
    "render_html",
    "save_reference",
    "traffic_window",
]
