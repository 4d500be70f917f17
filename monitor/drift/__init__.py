"""Semantic drift of prompts and responses, scored with Sentence-BERT embeddings.

    detector = DriftDetector()                       # all-MiniLM-L6-v2, cached by text hash
    report = detector.score(read_window("ref.jsonl", "reference"), read_window("now.jsonl"))
    report.drifted, report.p_value, report.to_json()

Batch tests per field (prompt, response): unbiased MMD² with a permutation p-value (exact
kernel, or random Fourier features on large windows) and a nearest-neighbour novelty test
with a split-conformal p-value that holds for the reference in use (the reference's own
error bounded first, see `_stat_tests`); a one-sided relevance-drop test, conditional in
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

from ._detector import DriftDetector, evaluate_window
from ._explain import (
    NOVEL_CLUSTER,
    ClusterShare,
    ExampleText,
    FieldExplanation,
    Novelty,
    NoveltyExample,
    Projection,
)
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
from ._mmd import StatResult, StatTest, TestOptions
from ._policy import CONFIGURED_REFERENCE, ReferencePolicy, VersionPolicy  # drift policy
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
from ._report import (
    REPORT_SCHEMA,
    DriftMetrics,
    DriftReport,
    FieldVerdict,
    ReportContext,
    TestResult,
    list_reports,
    load_report,
    render_html,
    save_report,
)
from ._stat_tests import (
    DEFAULT_EFFECT_FLOORS,
    RELEVANCE_BUCKETS,
    STAT_TESTS,
    DetectorConfig,
    RelevanceComparison,
    RelevanceSummary,
)
from ._streaming import StreamingDetector, StreamUpdate
from ._windows import (
    INPUT_FORMATS,
    CachedEmbedder,
    EmbeddedWindow,
    Embedder,
    SentenceTransformerEmbedder,
    TextWindow,
    default_model_path,
    read_window,
)
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
    "CONFIGURED_REFERENCE",
    "DEFAULT_EFFECT_FLOORS",
    "INPUT_FORMATS",
    "LENGTH_FIELDS",
    "NOVEL_CLUSTER",
    "RELEVANCE_BUCKETS",
    "REPORT_SCHEMA",
    "STAT_TESTS",
    "BadRecord",
    "CachedEmbedder",
    "ClusterShare",
    "CurrentWindowEmpty",
    "DetectorConfig",
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
    "ReferencePolicy",
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
    "TestOptions",
    "TestResult",
    "TextWindow",
    "UnknownInputFormat",
    "UnknownTest",
    "VersionPolicy",
    "WindowError",
    "WindowTooSmall",
    "count_words",
    "default_model_path",
    "evaluate_window",
    "first_requests_after",
    "length_drift",
    "list_references",
    "list_reports",
    "load_reference",
    "load_report",
    "read_lengths",
    "read_window",
    "render_html",
    "save_reference",
    "save_report",
    "traffic_lengths",
    "traffic_window",
]
