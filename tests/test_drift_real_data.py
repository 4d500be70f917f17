"""On real utterances (Banking77 as reference traffic, NLU++ hotels as the new topic),
embedded with the real all-MiniLM-L6-v2 once per session."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
from _drift_helpers import Pool, TableEmbedder, real_pool
from infersight.monitor.drift import DetectorConfig, DriftDetector, TestOptions, TextWindow
from infersight.monitor.drift._detector import run_tests
from infersight.monitor.drift._explain import NOVEL_CLUSTER
from infersight.monitor.drift._windows import EmbeddedWindow

ALPHA = 0.05


@pytest.fixture(scope="module")
def pool() -> Pool:
    return real_pool()


def _mixed(
    pool: Pool, rng: np.random.Generator, n_ref: int = 600, n_cur: int = 300, share: float = 0.1
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    idx = rng.permutation(len(pool.banking_texts))
    n_new = round(n_cur * share)
    hotels = rng.choice(len(pool.hotel_texts), n_new, replace=False)
    ref = idx[:n_ref]
    cur_b = idx[n_ref : n_ref + n_cur - n_new]
    return ref, cur_b, hotels


def test_disjoint_banking77_samples_raise_false_alarms_at_most_at_alpha(pool: Pool) -> None:
    rng = np.random.default_rng(11)
    splits = 200
    alarms = 0
    for i in range(splits):
        idx = rng.permutation(len(pool.banking))
        ref = EmbeddedWindow.from_arrays(pool.banking[idx[:600]])
        cur = EmbeddedWindow.from_arrays(pool.banking[idx[600:900]])
        tests = run_tests(ref, cur, DetectorConfig(alpha=ALPHA, options=TestOptions(seed=i)))
        alarms += any(t.drifted for t in tests)
    rate = alarms / splits
    # alpha plus two binomial standard errors of a 200-split estimate
    assert rate <= ALPHA + 2 * math.sqrt(ALPHA * (1 - ALPHA) / splits), rate


def test_ten_percent_hotel_utterances_in_a_300_text_window_are_detected(pool: Pool) -> None:
    rng = np.random.default_rng(12)
    draws = 30
    detected = 0
    for i in range(draws):
        ref, cur_b, hotels = _mixed(pool, rng)
        current = np.concatenate([pool.banking[cur_b], pool.hotels[hotels]])
        tests = run_tests(
            EmbeddedWindow.from_arrays(pool.banking[ref]),
            EmbeddedWindow.from_arrays(current),
            DetectorConfig(alpha=ALPHA, options=TestOptions(seed=i)),
        )
        detected += any(t.drifted for t in tests)
    # measured: 30 of 30; at least 27 of 30 (90%)
    assert detected >= 27, detected


def test_explanation_points_at_the_hotel_utterances(pool: Pool) -> None:
    rng = np.random.default_rng(13)
    detector = DriftDetector(TableEmbedder(pool), DetectorConfig(alpha=ALPHA))
    hotel_texts = set(pool.hotel_texts)
    witness_hits = 0
    for _ in range(3):
        ref, cur_b, hotels = _mixed(pool, rng)
        reference = TextWindow.of([pool.banking_texts[i] for i in ref])
        current = TextWindow.of(
            [pool.banking_texts[i] for i in cur_b] + [pool.hotel_texts[i] for i in hotels]
        )
        report = detector.score(reference, current)
        assert report.drifted
        expl = report.explanation("prompt")
        assert expl is not None
        top = expl.clusters[0]
        assert top.cluster == NOVEL_CLUSTER and top.significant
        assert sum(t in hotel_texts for t in top.current_examples) >= 2, top.current_examples
        assert sum(x.text in hotel_texts for x in expl.novelty.examples) >= 3, expl.novelty.examples
        assert expl.novelty.rate > 5 * expl.novelty.reference_rate
        witness_hits += sum(x.text in hotel_texts for x in expl.appeared)
    # Hotels are 10% of each window; among the 15 highest-witness texts of the three
    # draws at least 40% are hotels (measured over 20 draws: 80% on average).
    assert witness_hits >= 6, witness_hits


def test_a_window_of_only_banking_is_reported_without_drift_and_with_a_stable_json_shape(pool: Pool) -> None:
    detector = DriftDetector(TableEmbedder(pool), DetectorConfig(alpha=ALPHA))
    reference = TextWindow.of(pool.banking_texts[:600])
    current = TextWindow.of(pool.banking_texts[600:900])
    report = detector.score(reference, current)
    assert not report.drifted
    data = report.to_json()
    for key in (
        "drift",
        "p_value",
        "score",
        "threshold",
        "method",
        "n_reference",
        "n_current",
        "explanation",
    ):
        assert key in data
    assert data["n_reference"] == 600 and data["n_current"] == 300
    assert data["explanation"]["response"] is None
    drifted = detector.score(
        reference, replace(current, prompts=current.prompts[:270] + pool.hotel_texts[:30])
    )
    assert set(drifted.to_json()) == set(data)


def test_answers_that_stop_matching_their_questions_are_caught_while_prompts_are_unchanged(
    pool: Pool,
) -> None:
    sims = pool.banking @ pool.banking.T
    np.fill_diagonal(sims, -1.0)
    closest = sims.argmax(axis=1)  # a related text stands in for each prompt's good answer
    texts = pool.banking_texts
    rng = np.random.default_rng(14)
    idx = rng.permutation(len(texts))
    ref_rows, cur_rows = idx[:600], idx[600:900]
    reference = TextWindow.of([texts[i] for i in ref_rows], [texts[closest[i]] for i in ref_rows])
    unrelated = rng.permutation(idx[900:])[:300]  # the new release answers something else
    current = TextWindow.of([texts[i] for i in cur_rows], [texts[j] for j in unrelated])
    report = DriftDetector(TableEmbedder(pool), DetectorConfig(alpha=ALPHA)).score(reference, current)
    by_name = {(t.field, t.test): t for t in report.tests}
    assert by_name[("relevance", "relevance_drop")].drifted
    assert not by_name[("prompt", "mmd")].drifted and not by_name[("prompt", "novelty")].drifted
    assert report.relevance is not None
    assert report.relevance.reference.mean is not None and report.relevance.current.mean is not None
    assert report.relevance.current.mean < report.relevance.reference.mean - 0.2
    assert report.correction.startswith("holm(5; ") and report.explanation("response") is not None
