"""Semantic drift of prompts and responses, scored with Sentence-BERT embeddings.

    detector = DriftDetector()                       # all-MiniLM-L6-v2, cached by text hash
    report = detector.score(read_window("ref.jsonl", "reference"), read_window("now.jsonl"))
    report.drifted, report.p_value, report.to_json()

Batch tests per field (prompt, response): unbiased MMD² with a permutation p-value (exact
kernel, or random Fourier features on large windows) and a nearest-neighbour novelty test
with a split-conformal p-value that holds for the reference in use (the reference's own
error bounded first, see `_conditional`); a one-sided relevance-drop test, conditional in
the same way, when responses exist. Holm's correction across every test keeps the report's
false-alarm rate at alpha; effect floors keep large windows from alarming on trivial
shifts. The explanation (witness texts, reference clusters, novelty, a 2-D projection)
never changes the verdict. Request lengths (prompt and output tokens) get their own section
and verdict (`length_drift`: tests valid conditional on the reference). `StreamingDetector`
charts per-request novelty and relevance with CUSUMs designed for the reference's upper
exceedance rate; `evaluate_window` is the scheduler's entry point.
"""

from __future__ import annotations

from infersight.monitor.extras import require_extra as _require_extra

_require_extra("infersight.monitor.drift", "drift")  # one line when the extra is missing

from ._cache import CachedEmbedder
from ._clusters import NOVEL_CLUSTER, ClusterModel
from ._config import DEFAULT_EFFECT_FLOORS, DriftConfig
from ._cusum import CusumDesign, TailCusum, design_cusum
from ._decide import run_tests
from ._detector import DriftDetector, FittedReference
from ._embedding import Embedder, SentenceTransformerEmbedder, default_model_path
from ._evaluate import evaluate_window, fit_stored
from ._explanation import ClusterShare, ExampleText, FieldExplanation, Novelty, NoveltyExample, Projection
from ._holm import holm_adjust
from ._html import render_html
from ._inputs import INPUT_FORMATS, read_window
from ._lengths import (
    LENGTH_FIELDS,
    LengthDrift,
    LengthSummary,
    LengthTest,
    RequestLengths,
    count_words,
    length_drift,
    read_lengths,
)
from ._metrics import DriftMetrics
from ._mmd import mmd_test
from ._mmd_exact import mmd_exact_test
from ._mmd_rff import mmd_rff_test
from ._novelty import novelty_test
from ._references import (
    ReferenceInfo,
    StoredReference,
    first_requests_after,
    list_references,
    load_reference,
    save_reference,
    traffic_lengths,
    traffic_window,
)
from ._registry import STAT_TESTS, get_test
from ._relevance import (
    RELEVANCE_BUCKETS,
    RelevanceComparison,
    RelevanceSummary,
    relevance,
    summarize_relevance,
)
from ._relevance_drop import relevance_drop_test
from ._reports import list_reports, load_report, save_report
from ._results import REPORT_SCHEMA, DriftReport, FieldVerdict, ReportContext, TestResult
from ._stat import StatResult, StatTest, TestOptions
from ._streaming import StreamingDetector, StreamUpdate
from ._windows import EmbeddedWindow, TextWindow
from .errors import (
    BadRecord,
    CurrentWindowEmpty,
    DriftError,
    EmbedderUnavailable,
    EmbeddingMismatch,
    InputError,
    InputFileNotFound,
    InputNotUTF8,
    NoTextColumn,
    ReferenceNotFound,
    ReferenceWindowEmpty,
    UnknownInputFormat,
    UnknownTest,
    WindowError,
    WindowTooSmall,
)

__all__ = [
    "DEFAULT_EFFECT_FLOORS",
    "INPUT_FORMATS",
    "LENGTH_FIELDS",
    "NOVEL_CLUSTER",
    "RELEVANCE_BUCKETS",
    "REPORT_SCHEMA",
    "STAT_TESTS",
    "BadRecord",
    "CachedEmbedder",
    "ClusterModel",
    "ClusterShare",
    "CurrentWindowEmpty",
    "CusumDesign",
    "DriftConfig",
    "DriftDetector",
    "DriftError",
    "DriftMetrics",
    "DriftReport",
    "EmbeddedWindow",
    "Embedder",
    "EmbedderUnavailable",
    "EmbeddingMismatch",
    "ExampleText",
    "FieldExplanation",
    "FieldVerdict",
    "FittedReference",
    "InputError",
    "InputFileNotFound",
    "InputNotUTF8",
    "LengthDrift",
    "LengthSummary",
    "LengthTest",
    "NoTextColumn",
    "Novelty",
    "NoveltyExample",
    "Projection",
    "ReferenceInfo",
    "ReferenceNotFound",
    "ReferenceWindowEmpty",
    "RelevanceComparison",
    "RelevanceSummary",
    "ReportContext",
    "RequestLengths",
    "SentenceTransformerEmbedder",
    "StatResult",
    "StatTest",
    "StoredReference",
    "StreamUpdate",
    "StreamingDetector",
    "TailCusum",
    "TestOptions",
    "TestResult",
    "TextWindow",
    "UnknownInputFormat",
    "UnknownTest",
    "WindowError",
    "WindowTooSmall",
    "count_words",
    "default_model_path",
    "design_cusum",
    "evaluate_window",
    "first_requests_after",
    "fit_stored",
    "get_test",
    "holm_adjust",
    "length_drift",
    "list_references",
    "list_reports",
    "load_reference",
    "load_report",
    "mmd_exact_test",
    "mmd_rff_test",
    "mmd_test",
    "novelty_test",
    "read_lengths",
    "read_window",
    "relevance",
    "relevance_drop_test",
    "render_html",
    "run_tests",
    "save_reference",
    "save_report",
    "summarize_relevance",
    "traffic_lengths",
    "traffic_window",
]
