"""The novelty scan: its joint bound, its exact p-value, and the smallest detectable share a
report states, checked against the power measured on synthetic embeddings."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from infersight.monitor.cli import main
from infersight.monitor.data import banking77
from infersight.monitor.drift import DetectorConfig, StreamingDetector, TestOptions
from infersight.monitor.drift._detector import detectable_share_for, run_tests
from infersight.monitor.drift._novelty import (
    fit_novelty,
    fit_splits,
    scan_p_value,
    scan_ranks,
    scan_splits,
    scan_test,
    simultaneous_upper,
)
from infersight.monitor.drift._windows import EmbeddedWindow
from scipy.stats import beta


def test_the_joint_bound_covers_every_cut_at_once_and_is_wider_than_each_alone() -> None:
    n, ranks, confidence = 500, scan_ranks(500, 0.01), 0.95
    upper = np.asarray(simultaneous_upper(n, ranks, confidence))
    rng = np.random.default_rng(123)  # fresh order statistics, not the bound's own draws
    u = np.sort(rng.random((4000, n)), axis=1)[:, np.asarray(ranks) - 1]
    covered = float(np.mean((u <= upper).all(axis=1)))
    assert covered >= confidence - 2 * math.sqrt(confidence * (1 - confidence) / 4000), covered
    alone = beta.ppf(confidence, np.asarray(ranks), n + 1 - np.asarray(ranks))
    assert (upper >= alone).all() and np.all(np.diff(upper) > 0)


def test_the_scan_p_value_holds_its_level_at_the_bound_and_is_not_far_below_it() -> None:
    # at the bound the counts are exactly those of uniforms below each b_j: the worst case
    upper = simultaneous_upper(500, scan_ranks(500, 0.01), 0.99)
    rng = np.random.default_rng(5)
    m, draws = 200, 600
    v = rng.random((draws, m))
    p = np.asarray([scan_p_value((row[:, None] < np.asarray(upper)).sum(axis=0), m, upper)[0] for row in v])
    for level in (0.05, 0.2):
        rate = float(np.mean(p <= level))
        se = math.sqrt(level * (1 - level) / draws)
        assert rate <= level + 2 * se, (level, rate)
        assert rate >= level / 3, (level, rate)  # discrete, but not a test that never fires


def _sphere_clusters(rng: np.random.Generator, centres: np.ndarray, n: int, spread: float) -> np.ndarray:
    which = rng.integers(0, centres.shape[0], n)
    x = centres[which] + spread * rng.standard_normal((n, centres.shape[1]))
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def test_the_reported_detectable_share_is_the_share_detected_with_90_percent_power() -> None:
    """Synthetic embeddings: a home mix of 12 topics and a new topic far from all of them.
    The report's share models the scan at its first-step level in the weighted Holm over
    MMD and novelty, the effect floor applied: measured over many
    windows of the same reference, the count with 90% power is the reported one within the
    measurement's interval; and the whole test (every split) detects at least that often."""
    rng = np.random.default_rng(20261204)
    d = 24
    home = rng.standard_normal((12, d))
    home /= np.linalg.norm(home, axis=1, keepdims=True)
    away = rng.standard_normal((1, d))
    away /= np.linalg.norm(away, axis=1, keepdims=True)
    reference = _sphere_clusters(rng, home, 1000, 0.06)
    config = DetectorConfig()
    window, family = 300, ("mmd", "novelty")  # on prompts
    share = detectable_share_for(reference, window, family, config)
    assert share is not None and 0.0 < share < 0.2
    reported = round(share * window)
    calibration = fit_novelty(reference, config.options)
    splits = fit_splits(reference, config.options)
    level, floor = config.first_step_level("novelty", family), config.floor("novelty")
    one_split = level / len(splits)
    powers: dict[int, tuple[int, int]] = {}
    draws = 120
    whole_hits = 0
    for new in range(max(1, reported - 2), reported + 3):
        hits = 0
        for _ in range(draws):
            cur = np.concatenate(
                [
                    _sphere_clusters(rng, home, window - new, 0.06),
                    _sphere_clusters(rng, away, new, 0.06),
                ]
            )
            result = scan_test(calibration, cur)
            hits += result.p_value <= one_split and result.score >= floor
            if new == reported:
                whole = scan_splits(splits, cur)
                whole_hits += whole.p_value <= level and whole.score >= floor
        powers[new] = (hits, draws)
    # the premise of the share: new-topic texts land beyond every cut
    far = calibration.score(_sphere_clusters(rng, away, 200, 0.06))
    assert float(far.min()) > calibration.cuts[0]

    def bounds(hits: int, n: int) -> tuple[float, float]:  # a 95% Wilson interval
        z, phat = 1.96, hits / n
        centre = (phat + z * z / (2 * n)) / (1 + z * z / n)
        half = z * math.sqrt(phat * (1 - phat) / n + z * z / (4 * n * n)) / (1 + z * z / n)
        return centre - half, centre + half

    lowest_possible = min(c for c, (h, n) in powers.items() if bounds(h, n)[1] >= 0.9)
    surely = [c for c, (h, n) in powers.items() if bounds(h, n)[0] >= 0.9]
    highest_possible = min(surely) if surely else max(powers) + 1
    assert lowest_possible <= reported <= highest_possible, (reported, powers)
    assert bounds(whole_hits, draws)[1] >= 0.9, (whole_hits, draws)


def test_a_report_states_its_detectable_share_in_its_json() -> None:
    rng = np.random.default_rng(8)
    home = rng.standard_normal((6, 16))
    ref = EmbeddedWindow.from_arrays(_sphere_clusters(rng, home, 400, 0.1))
    cur = EmbeddedWindow.from_arrays(_sphere_clusters(rng, home, 200, 0.1))
    config = DetectorConfig(options=TestOptions(permutations=100))
    tests = run_tests(ref, cur, config)
    assert {t.test for t in tests} == {"mmd", "novelty"}
    family = tuple(t.test for t in tests)
    small = detectable_share_for(ref.prompt_embeddings, 200, family, config)
    large = detectable_share_for(ref.prompt_embeddings, 2000, family, config)
    assert small is not None and large is not None and large < small  # a larger window sees a thinner trickle
    assert detectable_share_for(ref.prompt_embeddings, 200, ("mmd",), DetectorConfig(tests=("mmd",))) is None


def _home_with_odd_texts(rng: np.random.Generator, centres: np.ndarray, n: int) -> np.ndarray:
    """A home law like real traffic's: tight topics, and a few texts (3%) that belong to
    none of them (anywhere on the sphere), which are what sits at the top of the tail."""
    x = _sphere_clusters(rng, centres, n, 0.08)
    odd = rng.random(n) < 0.03
    anywhere = rng.standard_normal((int(odd.sum()), centres.shape[1]))
    x[odd] = anywhere / np.linalg.norm(anywhere, axis=1, keepdims=True)
    return x


def test_jackknife_cuts_keep_their_bounds_for_nearly_every_reference() -> None:
    """The jackknife calibration (the bank is the whole reference, each reference text
    scored against the rest) under the bounds the scan applies: over many references, the
    chance that a new text from the same law lands beyond each cut (estimated on fresh
    texts) is within its simultaneous bound for all cuts at once on at least the
    `reference_confidence` share of references (less the estimate's noise), and on average
    at most the cut's rank over `n + 1`."""
    rng = np.random.default_rng(20261206)
    d, n, references, fresh = 16, 400, 150, 8000
    centres = rng.standard_normal((10, d))
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    options = TestOptions(reference_confidence=0.95)
    covered, q_top = 0, []
    for _ in range(references):
        calibration = fit_novelty(_home_with_odd_texts(rng, centres, n), options)
        assert calibration.bank.shape[0] == n == calibration.n  # every text is bank and calibration
        new = calibration.score(_home_with_odd_texts(rng, centres, fresh))
        q = np.asarray([np.mean(new > c) for c in calibration.cuts])
        upper = np.asarray(calibration.upper)
        covered += bool((q <= upper + 2 * np.sqrt(upper / fresh)).all())  # q is itself an estimate
        q_top.append(q[-1])
    share = covered / references
    noise = 2 * math.sqrt(0.95 * 0.05 / references)
    assert share >= 0.95 - noise, share
    k = calibration.ranks[-1]
    assert float(np.mean(q_top)) <= k / (n + 1) * 1.1, (np.mean(q_top), k / (n + 1))


def test_the_streaming_chart_scores_requests_with_the_batch_scans_calibration() -> None:
    rng = np.random.default_rng(3)
    home = rng.standard_normal((6, 16))
    home /= np.linalg.norm(home, axis=1, keepdims=True)
    reference = _sphere_clusters(rng, home, 300, 0.1)
    options = TestOptions()
    detector = StreamingDetector(EmbeddedWindow.from_arrays(reference), target_arl=200, options=options)
    batch = fit_novelty(reference, options)
    assert np.array_equal(detector.calibration.calibration, batch.calibration)
    assert detector.calibration.cuts == batch.cuts
    rows = _sphere_clusters(rng, home, 20, 0.1)
    streamed = [u.novelty for u in detector.observe_many(rows)]
    assert np.allclose(streamed, batch.score(rows))


@pytest.fixture(scope="module")
def reference_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("plan") / "reference.txt"
    path.write_text("\n".join(u.text for u in banking77("test")[:200]) + "\n", encoding="utf-8")
    return path


def test_window_size_prints_the_detectable_share_for_each_window(
    reference_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc = main(["drift", str(reference_file), "--window-size", "100", "1000", "--json", "--no-progress",
               "--embedder", "sentence-transformers"])  # fmt: skip
    out, err = capsys.readouterr()
    assert rc == 0, err
    data = json.loads(out)
    assert data["n_reference"] == 200 and [w["window"] for w in data["windows"]] == [100, 1000]
    shares = [w["detectable_share"] for w in data["windows"]]
    assert all(s is not None for s in shares) and shares[1] < shares[0]


def test_window_size_with_a_current_window_or_a_tiny_size_is_one_line(
    reference_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["drift", str(reference_file), str(reference_file), "--window-size", "300"]) == 2
    assert "drop CURRENT" in capsys.readouterr().err
    assert main(["drift", str(reference_file), "--window-size", "1"]) == 2
    assert "--window-size must be at least 2" in capsys.readouterr().err
    assert main(["drift", str(reference_file)]) == 2
    assert "--window-size" in capsys.readouterr().err
