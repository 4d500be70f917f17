"""The contract of a statistical test, and the MMD two-sample test on embeddings.

A test is a pure function `(reference, current, options) -> StatResult`. The MMD test
runs on the exact kernel up to a pooled size, on random Fourier features above.

Embedding checks and the averaged Gaussian kernel shared by the MMD test and the witness.

On unit vectors the squared distance is `2 - 2 cos`, so every kernel here is a function of
a Gram matrix of dot products. Widths are fixed from the reference alone (median
heuristic) and several are averaged, which keeps the kernel characteristic at every scale
without choosing one from the data being tested.

Permutations as indicator matrices, so a whole block of them is one matrix product.

Row 0 of the first block is the observed split (the first `m` pooled rows are the
reference); every other row is a uniformly random relabelling. The p-value counts the
observed statistic among the permuted ones: `(b + 1) / (P + 1)`, valid at any P.

MMD² permutation test on the exact kernel, computed once for the pooled windows.

With `K` the `[n, n]` kernel (zero diagonal) and `s` a 0/1 labelling of the reference
rows, the within- and between-group sums of a labelling are
`sxx = sᵀKs`, `sxy = sᵀK1 - sᵀKs`, `syy = 1ᵀK1 - 2 sᵀK1 + sᵀKs`,
so a block of permutations `S` costs one product `K @ S` and nothing per permutation.

MMD² permutation test on random Fourier features: linear in the pooled size.

Each Gaussian width `w` gets `F` frequencies `ω ~ N(0, 2/w · I)`; the features
`[cos(Zω), sin(Zω)] / sqrt(B·F)` have `φ(x)·φ(y) ≈ k(x, y)` and `‖φ(x)‖² = 1` exactly.
The approximate kernel is fixed before the labels are looked at, so the permutation
p-value stays exact for it; only power can differ from the exact kernel's.
A block of permutations costs one product `S @ Φ`.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from .errors import EmbeddingMismatch, WindowTooSmall

__all__ = [
    "BANDWIDTH_MULTIPLIERS",
    "StatResult",
    "StatTest",
    "TestOptions",
    "as_unit_rows",
    "check_pair",
    "fourier_features",
    "kernel_from_gram",
    "median_widths",
    "mmd2_from_sums",
    "mmd_exact_test",
    "mmd_rff_test",
    "mmd_test",
    "permutation_blocks",
    "permutation_p_value",
]


# Each width is `median squared distance x multiplier`; the kernel is exp(-d² / width).
BANDWIDTH_MULTIPLIERS: tuple[float, ...] = (0.25, 0.5, 1.0, 2.0, 4.0)


def as_unit_rows(x: np.ndarray, what: str) -> np.ndarray:
    """`x` as C-contiguous float32 rows of unit length; refuses non-finite or zero rows."""
    arr = np.asarray(x, dtype=np.float32)
    if arr.ndim != 2 or arr.shape[1] == 0:
        raise EmbeddingMismatch(f"{what}: expected an [N, D] array, got shape {arr.shape}")
    if not np.isfinite(arr).all():
        raise EmbeddingMismatch(f"{what}: embeddings contain NaN or infinity")
    norms = np.linalg.norm(arr, axis=1, keepdims=True)
    if arr.shape[0] and float(norms.min()) == 0.0:
        raise EmbeddingMismatch(f"{what}: an embedding is all zeros")
    if arr.shape[0] and np.abs(norms - 1.0).max() > 1e-3:
        arr = arr / norms
    return np.ascontiguousarray(arr, dtype=np.float32)


def check_pair(reference: np.ndarray, current: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    x = as_unit_rows(reference, "reference")
    y = as_unit_rows(current, "current")
    if x.shape[1] != y.shape[1]:
        raise EmbeddingMismatch(f"reference has dimension {x.shape[1]}, current {y.shape[1]}")
    return x, y


def median_widths(
    reference: np.ndarray,
    multipliers: tuple[float, ...] = BANDWIDTH_MULTIPLIERS,
    *,
    max_points: int = 1000,
    seed: int = 0,
) -> tuple[float, ...]:
    """Kernel widths from the reference's median pairwise squared distance (a subsample of
    at most `max_points` rows, chosen with `seed`)."""
    x = reference
    if x.shape[0] > max_points:
        x = x[np.random.default_rng(seed).choice(x.shape[0], max_points, replace=False)]
    gram = x @ x.T
    d2 = np.maximum(2.0 - 2.0 * gram[np.triu_indices(x.shape[0], 1)], 0.0)
    median = float(np.median(d2)) if d2.size else 1.0
    if median <= 1e-6:  # a reference of (near) duplicates: fall back to the sphere's scale
        median = 1.0
    return tuple(median * m for m in multipliers)


def kernel_from_gram(gram: np.ndarray, widths: tuple[float, ...]) -> np.ndarray:
    """Mean over `widths` of exp(-d² / w) with d² = 2 - 2·gram (unit rows), float32.

    Consumes `gram` (it is overwritten). Widths that halve one another are computed by
    squaring the previous term instead of another exp, which is where the time goes.
    """
    d2 = gram
    d2 *= -2.0
    d2 += 2.0
    np.maximum(d2, 0.0, out=d2)
    ordered = sorted(widths, reverse=True)
    term = np.exp(d2 / np.float32(-ordered[0]))
    total = term.copy()
    for prev, width in itertools.pairwise(ordered):
        if abs(prev / width - 2.0) < 1e-9:
            np.multiply(term, term, out=term)
        else:
            np.exp(d2 / np.float32(-width), out=term)
        total += term
    total /= np.float32(len(ordered))
    return total


@dataclass(frozen=True)
class TestOptions:
    """Knobs shared by the tests; every default is what `infersight drift` uses."""

    __test__ = False  # not a pytest class

    permutations: int = 1000
    seed: int = 0
    bandwidth_multipliers: tuple[float, ...] = BANDWIDTH_MULTIPLIERS
    # Exact MMD (an [n, n] kernel) while reference + current <= exact_max_pool, else
    # random Fourier features with `rff_frequencies` frequencies per bandwidth.
    exact_max_pool: int = 4000
    rff_frequencies: int = 128
    permutation_chunk: int = 128  # permutations per matrix product (bounds memory)
    # Nearest-neighbour novelty: how the reference calibrates the per-item scores.
    # "jackknife": every reference text is both bank and calibration (each scored against
    # the rest of the reference), so the tail is read off the whole reference and a few odd
    # texts weigh half as much as in a held-out half; "split": a seeded share
    # (`calibration_fraction`) held out and scored against the rest (the bank).
    novelty_calibration: str = "jackknife"
    calibration_fraction: float = 0.5
    novelty_tail: float = 0.01  # the single cut of `novelty_single`
    # The novelty scan counts beyond several cuts at once, from the largest held-out score
    # out to this tail (see _novelty).
    novelty_scan_tail: float = 0.01
    # With "split" calibration, the splits of the reference the scan runs on (seeds seed,
    # seed + 1, ...), Bonferroni across them: more than one keeps an unlucky held-out part (a few odd texts at its top) from
    # deciding alone, but costs the other references more than it gains on real utterances
    # (docs/benchmarks/drift-power.md), so one is the default.
    novelty_splits: int = 1
    # Tests that bound the reference's own sampling error first (novelty, relevance, the
    # streaming charts) hold their level for at least this share of references (the conditional calibration in _stat_tests).
    reference_confidence: float = 0.99

    def __post_init__(self) -> None:
        if self.permutations < 1:
            raise ValueError("permutations must be at least 1")
        if not 0.0 < self.calibration_fraction < 1.0:
            raise ValueError("calibration_fraction must be in (0, 1)")
        if not 0.0 < self.novelty_tail < 0.5:
            raise ValueError("novelty_tail must be in (0, 0.5)")
        if not 0.0 < self.novelty_scan_tail < 0.5:
            raise ValueError("novelty_scan_tail must be in (0, 0.5)")
        if self.novelty_calibration not in ("jackknife", "split"):
            raise ValueError("novelty_calibration must be 'jackknife' or 'split'")
        if not 1 <= self.novelty_splits <= 8:
            raise ValueError("novelty_splits must be between 1 and 8")
        if not 0.5 <= self.reference_confidence < 1.0:
            raise ValueError("reference_confidence must be in [0.5, 1)")
        if self.exact_max_pool < 0 or self.rff_frequencies < 1 or self.permutation_chunk < 1:
            raise ValueError("exact_max_pool, rff_frequencies and permutation_chunk must be positive")
        if not self.bandwidth_multipliers or min(self.bandwidth_multipliers) <= 0:
            raise ValueError("bandwidth_multipliers must be positive")


@dataclass(frozen=True)
class StatResult:
    """What one test measured on one field.

    `statistic` is the test's raw statistic (MMD², a count, U); `score` its effect size in
    the unit the test documents (compared with an effect floor); `p_value` is unadjusted.
    """

    test: str
    method: str
    statistic: float
    score: float
    p_value: float
    n_reference: int
    n_current: int
    permutations: int  # 0 when the p-value is exact in closed form


class StatTest(Protocol):
    def __call__(self, reference: np.ndarray, current: np.ndarray, options: TestOptions) -> StatResult: ...


def permutation_blocks(n: int, m: int, permutations: int, *, seed: int, chunk: int) -> Iterator[np.ndarray]:
    """Blocks of `[c, n]` float32 0/1 rows marking the `m` rows labelled "reference":
    the observed labelling first, then `permutations` random ones, at most `chunk` rows a block."""
    rng = np.random.default_rng(seed)
    observed = np.zeros(n, dtype=np.float32)
    observed[:m] = 1.0
    remaining = permutations + 1
    first = True
    while remaining > 0:
        c = min(chunk, remaining)
        block = rng.permuted(np.broadcast_to(observed, (c, n)).copy(), axis=1)
        if first:
            block[0] = observed
            first = False
        remaining -= c
        yield block


def mmd2_from_sums(sxx: np.ndarray, syy: np.ndarray, sxy: np.ndarray, m: int, k: int) -> np.ndarray:
    """Unbiased MMD² from the off-diagonal kernel sums within and between the two groups."""
    return sxx / (m * (m - 1)) + syy / (k * (k - 1)) - 2.0 * sxy / (m * k)


def permutation_p_value(statistics: np.ndarray) -> tuple[float, float]:
    """`(observed, p)` from `[observed, permuted...]`; ties count against drift."""
    observed = float(statistics[0])
    permuted = statistics[1:]
    tolerance = 1e-7 * max(1.0, abs(observed))
    exceed = int(np.count_nonzero(permuted >= observed - tolerance))
    return observed, (exceed + 1) / (permuted.size + 1)


METHOD = "mmd2_permutation_exact"


def mmd_exact_test(reference: np.ndarray, current: np.ndarray, options: TestOptions) -> StatResult:
    """Unbiased MMD² (averaged Gaussian kernel, widths from the reference) and its permutation p.

    Effect size (`score`) is the MMD² itself, in kernel units."""
    x, y = check_pair(reference, current)
    m, k = x.shape[0], y.shape[0]
    _require(m, k)
    widths = median_widths(x, options.bandwidth_multipliers, seed=options.seed)
    z = np.concatenate([x, y])
    kernel = kernel_from_gram(z @ z.T, widths)  # [n, n]
    np.fill_diagonal(kernel, 0.0)
    row_sums = kernel.sum(axis=1, dtype=np.float64)  # [n]
    total = float(row_sums.sum())
    parts = []
    for block in permutation_blocks(
        z.shape[0], m, options.permutations, seed=options.seed + 1, chunk=options.permutation_chunk
    ):  # [c, n]
        ks = kernel @ block.T  # [n, c]
        quad = np.einsum("ij,ji->i", block, ks, dtype=np.float64)  # sᵀKs  [c]
        lin = block.astype(np.float64) @ row_sums  # sᵀK1  [c]
        parts.append(mmd2_from_sums(quad, total - 2.0 * lin + quad, lin - quad, m, k))
    observed, p_value = permutation_p_value(np.concatenate(parts))
    return StatResult("mmd", METHOD, observed, observed, p_value, m, k, options.permutations)


def _require(m: int, k: int) -> None:
    if m < 2:
        raise WindowTooSmall("reference", m, 2)
    if k < 2:
        raise WindowTooSmall("current", k, 2)


def fourier_features(z: np.ndarray, widths: tuple[float, ...], frequencies: int, *, seed: int) -> np.ndarray:
    """`[n, 2·B·F]` float32 features whose dot products approximate the averaged kernel."""
    rng = np.random.default_rng(seed)
    dim = z.shape[1]
    omega = np.concatenate(
        [rng.standard_normal((dim, frequencies)) * np.sqrt(2.0 / w) for w in widths], axis=1
    ).astype(np.float32)  # [d, B·F]
    proj = z @ omega  # [n, B·F]
    scale = np.float32(1.0 / np.sqrt(len(widths) * frequencies))
    return np.concatenate([np.cos(proj), np.sin(proj)], axis=1) * scale


def mmd_rff_test(reference: np.ndarray, current: np.ndarray, options: TestOptions) -> StatResult:
    """As `mmd_exact_test`, on the random-feature kernel (score: its unbiased MMD²)."""
    x, y = check_pair(reference, current)
    m, k = x.shape[0], y.shape[0]
    _require(m, k)
    widths = median_widths(x, options.bandwidth_multipliers, seed=options.seed)
    phi = fourier_features(np.concatenate([x, y]), widths, options.rff_frequencies, seed=options.seed + 2)
    total = phi.sum(axis=0, dtype=np.float64)  # [D]
    parts = []
    for block in permutation_blocks(
        phi.shape[0], m, options.permutations, seed=options.seed + 1, chunk=options.permutation_chunk
    ):  # [c, n]
        tx = (block @ phi).astype(np.float64)  # Σ_ref φ  [c, D]
        ty = total - tx  # Σ_cur φ  [c, D]
        sxx = np.einsum("ij,ij->i", tx, tx) - m  # ‖φ‖² = 1 removes the diagonal
        syy = np.einsum("ij,ij->i", ty, ty) - k
        sxy = np.einsum("ij,ij->i", tx, ty)
        parts.append(mmd2_from_sums(sxx, syy, sxy, m, k))
    observed, p_value = permutation_p_value(np.concatenate(parts))
    method = f"mmd2_permutation_rff(features={phi.shape[1]})"
    return StatResult("mmd", method, observed, observed, p_value, m, k, options.permutations)


def mmd_test(reference: np.ndarray, current: np.ndarray, options: TestOptions) -> StatResult:
    """`mmd_exact_test` while `len(reference) + len(current) <= options.exact_max_pool`,
    else `mmd_rff_test`; the result's `method` says which ran."""
    if reference.shape[0] + current.shape[0] <= options.exact_max_pool:
        return mmd_exact_test(reference, current, options)
    return mmd_rff_test(reference, current, options)
