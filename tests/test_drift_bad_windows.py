"""Windows that are too small, or made of repeats: typed errors, or a verdict with a note,
never a crash or a division by zero (real Banking77 embeddings)."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
from _drift_helpers import Pool, TableEmbedder, real_pool
from infersight.monitor.drift import DetectorConfig, DriftDetector, DriftReport, TextWindow
from infersight.monitor.drift._stat_tests import novelty_test, relevance_drop_test
from infersight.monitor.drift.errors import CurrentWindowEmpty, ReferenceWindowEmpty, WindowTooSmall


@pytest.fixture(scope="module")
def pool() -> Pool:
    return real_pool()


def _score(pool: Pool, reference: TextWindow, current: TextWindow) -> DriftReport:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a division by zero or an invalid value fails the test
        report = DriftDetector(TableEmbedder(pool), DetectorConfig()).score(reference, current)
        json.loads(report.dumps())  # finite floats only (allow_nan=False)
    return report


def test_too_small_and_empty_windows_keep_their_typed_errors(pool: Pool) -> None:
    detector = DriftDetector(TableEmbedder(pool), DetectorConfig())
    texts = pool.banking_texts
    with pytest.raises(WindowTooSmall, match="reference"):
        detector.score(TextWindow.of(texts[:3]), TextWindow.of(texts[100:200]))
    with pytest.raises(WindowTooSmall, match="current"):
        detector.score(TextWindow.of(texts[:100]), TextWindow.of(texts[200:201]))
    with pytest.raises(ReferenceWindowEmpty):
        detector.score(TextWindow.of(()), TextWindow.of(texts[200:300]))
    with pytest.raises(CurrentWindowEmpty):
        detector.score(TextWindow.of(texts[:100]), TextWindow.of(()))
    with pytest.raises(WindowTooSmall):
        novelty_test(pool.banking[:3], pool.banking[3:10], DetectorConfig().options)
    with pytest.raises(WindowTooSmall):
        relevance_drop_test(np.asarray([0.5]), np.asarray([0.4, 0.3]))


def test_reference_of_many_exact_duplicates_gets_a_verdict_with_a_note(pool: Pool) -> None:
    texts = pool.banking_texts
    reference = TextWindow.of([texts[0]] * 450 + list(texts[1:151]))  # 3 of 4 are one text
    current = TextWindow.of(texts[600:900])
    report = _score(pool, reference, current)
    assert report.notes == (
        "reference prompts: 449 of 600 are exact repeats (151 distinct texts); "
        "each repeat counts as an observation",
    )
    assert report.to_json()["notes"] == list(report.notes)
    # a window of 300 distinct texts is not the reference dominated by one text: drift
    assert report.drifted
    # the same reference against itself-like traffic (the same repeats) is not drift
    same = _score(pool, reference, TextWindow.of([texts[0]] * 225 + list(texts[1:76])))
    assert not same.drifted


def test_window_of_one_repeated_text_gets_a_verdict_with_a_note(pool: Pool) -> None:
    texts = pool.banking_texts
    reference = TextWindow.of(texts[:600])
    report = _score(pool, reference, TextWindow.of([texts[1000]] * 300))
    assert "current prompts: all 300 are one repeated text" in report.notes
    assert report.drifted and report.method.startswith("mmd")  # one text is not the reference's traffic
    both = _score(pool, TextWindow.of([texts[5]] * 50), TextWindow.of([texts[5]] * 30))
    assert not both.drifted
    assert both.notes == (
        "reference prompts: all 50 are one repeated text",
        "current prompts: all 30 are one repeated text",
    )
