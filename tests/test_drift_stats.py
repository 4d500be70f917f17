"""The statistics on fixed arrays: each test computes what it claims and is calibrated."""

from __future__ import annotations

import numpy as np
import pytest
from infersight.monitor.drift import DetectorConfig, TestOptions
from infersight.monitor.drift._detector import run_tests
from infersight.monitor.drift._mmd import (
    StatTest,
    kernel_from_gram,
    median_widths,
    mmd_exact_test,
    mmd_rff_test,
    mmd_test,
)
from infersight.monitor.drift._stat_tests import holm_adjust, novelty_test, relevance_drop_test
from infersight.monitor.drift._windows import EmbeddedWindow
from infersight.monitor.drift.errors import EmbeddingMismatch, UnknownTest


def _sphere(rng: np.random.Generator, n: int, d: int = 16, shift: float = 0.0) -> np.ndarray:
    x = rng.standard_normal((n, d)).astype(np.float32)
    x[:, 0] += shift
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def _brute_mmd2(x: np.ndarray, y: np.ndarray, widths: tuple[float, ...]) -> float:
    def k(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        d2 = ((a[:, None, :] - b[None, :, :]) ** 2).sum(-1)
        return np.mean([np.exp(-d2 / w) for w in widths], axis=0)

    m, n = len(x), len(y)
    kxx, kyy, kxy = k(x, x), k(y, y), k(x, y)
    return float(
        (kxx.sum() - np.trace(kxx)) / (m * (m - 1))
        + (kyy.sum() - np.trace(kyy)) / (n * (n - 1))
        - 2 * kxy.mean()
    )


def test_exact_mmd_statistic_equals_the_unbiased_estimator_computed_by_hand() -> None:
    rng = np.random.default_rng(1)
    x, y = _sphere(rng, 40), _sphere(rng, 30, shift=0.5)
    result = mmd_exact_test(x, y, TestOptions(permutations=50))
    widths = median_widths(x)
    assert result.statistic == pytest.approx(_brute_mmd2(x, y, widths), rel=1e-4, abs=1e-6)
    assert result.method == "mmd2_permutation_exact"


def test_kernel_squaring_shortcut_matches_direct_exponentials() -> None:
    rng = np.random.default_rng(2)
    x = _sphere(rng, 50)
    widths = (0.3, 0.6, 1.2, 2.4, 0.7)
    got = kernel_from_gram(x @ x.T, widths)
    d2 = np.maximum(2 - 2 * (x @ x.T), 0)
    want = np.mean([np.exp(-d2 / w) for w in widths], axis=0)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_permutation_p_value_is_b_plus_one_over_p_plus_one() -> None:
    rng = np.random.default_rng(3)
    x, y = _sphere(rng, 60), _sphere(rng, 60, shift=3.0)
    result = mmd_exact_test(x, y, TestOptions(permutations=99))
    assert result.p_value == pytest.approx(1 / 100)  # nothing beats a huge shift
    null = mmd_exact_test(x, _sphere(rng, 60), TestOptions(permutations=99))
    assert (null.p_value * 100) == pytest.approx(round(null.p_value * 100))


def test_random_feature_mmd_approximates_the_exact_statistic() -> None:
    rng = np.random.default_rng(4)
    x, y = _sphere(rng, 300), _sphere(rng, 300, shift=0.6)
    exact = mmd_exact_test(x, y, TestOptions(permutations=20))
    approx = mmd_rff_test(x, y, TestOptions(permutations=20, rff_frequencies=4096))
    assert approx.statistic == pytest.approx(exact.statistic, rel=0.1)
    assert approx.method.startswith("mmd2_permutation_rff")


def test_mmd_switches_to_random_features_above_the_pooled_size_and_says_so() -> None:
    rng = np.random.default_rng(5)
    x, y = _sphere(rng, 60), _sphere(rng, 50)
    assert mmd_test(x, y, TestOptions(permutations=10, exact_max_pool=110)).method == "mmd2_permutation_exact"
    assert mmd_test(x, y, TestOptions(permutations=10, exact_max_pool=109)).method.startswith(
        "mmd2_permutation_rff"
    )


@pytest.mark.parametrize("test", [mmd_exact_test, mmd_rff_test, novelty_test])
def test_false_alarm_rate_of_each_test_is_at_most_alpha_on_synthetic_nulls(test: StatTest) -> None:
    rng = np.random.default_rng(6)
    rejections = [
        test(
            _sphere(rng, 80), _sphere(rng, 40), TestOptions(permutations=99, rff_frequencies=32, seed=i)
        ).p_value
        < 0.05
        for i in range(150)
    ]
    # 150 draws: alpha + 3 binomial standard deviations
    assert np.mean(rejections) <= 0.05 + 3 * np.sqrt(0.05 * 0.95 / 150)


def _around(rng: np.random.Generator, n: int, axis: int, d: int = 16) -> np.ndarray:
    x = rng.standard_normal((n, d)).astype(np.float32) * 0.5
    x[:, axis] += 2.0
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def test_novelty_test_detects_a_small_far_away_subpopulation() -> None:
    rng = np.random.default_rng(7)
    ref = _around(rng, 400, axis=0)
    cur = np.concatenate([_around(rng, 180, axis=0), _around(rng, 20, axis=1)])
    result = novelty_test(ref, cur, TestOptions())
    assert result.p_value < 1e-3
    assert result.score > 0.05  # excess share of novel texts
    assert result.method == "nn_novelty_scan_conformal_conditional"


def test_holm_adjusts_step_down_and_keeps_input_order() -> None:
    assert holm_adjust([0.01, 0.04, 0.03]) == pytest.approx((0.03, 0.06, 0.06))
    assert holm_adjust([0.5, 0.001]) == pytest.approx((0.5, 0.002))
    assert holm_adjust([]) == ()


def test_weighted_holm_gives_each_test_its_share_of_alpha_and_equal_weights_are_holms() -> None:
    assert holm_adjust([0.01, 0.04, 0.03], [2, 2, 2]) == pytest.approx(holm_adjust([0.01, 0.04, 0.03]))
    # novelty (weight 3) first: 0.02 * 4/3; then MMD alone with the whole alpha
    assert holm_adjust([0.01, 0.02], [1, 3]) == pytest.approx((4 * 0.02 / 3, 4 * 0.02 / 3))
    assert holm_adjust([0.001, 0.5], [1, 3]) == pytest.approx((0.004, 0.5))
    with pytest.raises(ValueError):
        holm_adjust([0.1, 0.2], [1, 0])
    # every null true, independent uniforms: "any rejects" at most alpha
    rng = np.random.default_rng(11)
    weights = [1, 3, 1, 3, 2]
    p = rng.random((20_000, len(weights)))
    any_rejects = np.mean([min(holm_adjust(row, weights)) < 0.05 for row in p])
    assert any_rejects <= 0.05 + 2 * np.sqrt(0.05 * 0.95 / 20_000), any_rejects
    # a report adjusts with its configuration's weights, and says so
    rng = np.random.default_rng(12)
    ref = EmbeddedWindow.from_arrays(_around(rng, 400, axis=0))
    cur = EmbeddedWindow.from_arrays(np.concatenate([_around(rng, 180, axis=0), _around(rng, 20, axis=1)]))
    options = TestOptions(permutations=100)
    for weights in ({"mmd": 1.0, "novelty": 3.0}, {"mmd": 1.0, "novelty": 1.0}):
        tests = run_tests(ref, cur, DetectorConfig(options=options, test_weights=weights))
        raw = [t.p_value for t in tests]
        expected = holm_adjust(raw, [weights[t.test] for t in tests])
        assert [t.p_adjusted for t in tests] == pytest.approx(expected)
    with pytest.raises(ValueError):
        DetectorConfig(test_weights={"mmd": 0.0})
    config = DetectorConfig()
    family = ("mmd", "novelty")
    assert config.first_step_level("novelty", family) == pytest.approx(0.05 * 3 / 4)
    assert config.first_step_level("mmd", family) == pytest.approx(0.05 / 4)


def test_relevance_drop_is_one_sided() -> None:
    rng = np.random.default_rng(8)
    ref = rng.normal(0.6, 0.1, 200)
    assert relevance_drop_test(ref, rng.normal(0.45, 0.1, 100)).p_value < 1e-6
    assert relevance_drop_test(ref, rng.normal(0.75, 0.1, 100)).p_value > 0.5


def test_effect_floor_keeps_a_significant_but_trivial_shift_from_being_drift() -> None:
    rng = np.random.default_rng(9)
    ref = _sphere(rng, 1500, d=8)
    cur = _sphere(rng, 1500, d=8, shift=0.2)  # a small shift, large windows
    floors = {"mmd": 1.0, "novelty": 1.0}
    tests = run_tests(
        EmbeddedWindow.from_arrays(ref),
        EmbeddedWindow.from_arrays(cur),
        DetectorConfig(effect_floors=floors, options=TestOptions(permutations=200)),
    )
    mmd = next(t for t in tests if t.test == "mmd")
    assert mmd.p_adjusted < 0.05 and not mmd.drifted


def test_arrays_of_different_dimension_or_with_nan_are_refused() -> None:
    rng = np.random.default_rng(10)
    with pytest.raises(EmbeddingMismatch):
        mmd_test(_sphere(rng, 10, d=8), _sphere(rng, 10, d=9), TestOptions())
    bad = _sphere(rng, 10)
    bad[0, 0] = np.nan
    with pytest.raises(EmbeddingMismatch):
        novelty_test(_sphere(rng, 10), bad, TestOptions())


def test_config_refuses_an_unknown_test_name() -> None:
    with pytest.raises(UnknownTest, match="valid tests are"):
        DetectorConfig(tests=("mmd", "ks"))
