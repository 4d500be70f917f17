"""The explanation of one field: what appeared and what disappeared.

Computed on at most `config.explain_max_points` texts per window (a seeded subsample);
it describes the verdict and never changes it.

What it holds are frozen dataclasses (no rendering: `_report_html.py` draws them). The
pieces: the MMD witness function (where the current window has more or less mass than
the reference), reference clusters fitted once with cosine k-means (k-means++ seeding,
deterministic for a seed) and their shares in the two windows, and a 2-D PCA view of
both windows fitted on the reference.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ._mmd import kernel_from_gram, median_widths
from ._novelty import fit_novelty
from ._stat_tests import DetectorConfig, holm_adjust, nearest

__all__ = [
    "NOVEL_CLUSTER",
    "ClusterModel",
    "ClusterShare",
    "ExampleText",
    "FieldExplanation",
    "Novelty",
    "NoveltyExample",
    "Projection",
    "assign",
    "cluster_shares",
    "explain_field",
    "fit_clusters",
    "pca_2d",
    "spherical_kmeans",
    "witness",
]


@dataclass(frozen=True)
class ExampleText:
    text: str
    value: float  # the witness value


@dataclass(frozen=True)
class NoveltyExample:
    text: str
    distance: float  # 1 - cosine to the nearest reference text
    nearest_reference: str


@dataclass(frozen=True)
class Novelty:
    """Share of current texts farther from every (bank) reference text than the reference's
    own `1 - quantile` tail (measured on its calibration scores, the novelty scan's)."""

    rate: float
    reference_rate: float  # the same share among the reference's calibration scores (about 1 - quantile)
    quantile: float
    tail_distance: float
    count: int
    examples: tuple[NoveltyExample, ...]


@dataclass(frozen=True)
class ClusterShare:
    """One k-means cluster of the reference: its share in each window, and Fisher's exact
    two-sided test of equal shares, Holm-adjusted across the clusters.

    Cluster -1 holds the current texts beyond the novelty tail (not forced into the nearest
    reference cluster); its reference share is measured on the reference's calibration scores."""

    cluster: int
    label: str  # the reference text nearest the centroid
    reference_count: int
    current_count: int
    reference_share: float
    current_share: float
    change: float  # current_share - reference_share
    p_value: float
    p_adjusted: float
    significant: bool
    reference_examples: tuple[str, ...]
    current_examples: tuple[str, ...]  # the cluster's current texts with the highest witness


@dataclass(frozen=True)
class Projection:
    """Both windows on the reference's first two principal axes (subsampled)."""

    method: str
    explained_variance: tuple[float, float]
    reference: tuple[tuple[float, float], ...]
    current: tuple[tuple[float, float], ...]
    current_novel: tuple[bool, ...]  # per current point: beyond the novelty tail


@dataclass(frozen=True)
class FieldExplanation:
    field: str
    appeared: tuple[ExampleText, ...]  # current texts with the highest witness
    typical: tuple[ExampleText, ...]  # current texts with the lowest witness
    disappeared: tuple[ExampleText, ...]  # reference texts with the lowest witness
    clusters: tuple[ClusterShare, ...]  # largest share increase first
    novelty: Novelty
    projection: Projection


def witness(
    reference: np.ndarray, current: np.ndarray, widths: tuple[float, ...]
) -> tuple[np.ndarray, np.ndarray]:
    """`(w on the reference rows, w on the current rows)`; both windows as given (callers
    subsample large windows first)."""
    m, k = reference.shape[0], current.shape[0]
    k_xx = kernel_from_gram(reference @ reference.T, widths)  # [m, m]
    k_yy = kernel_from_gram(current @ current.T, widths)  # [k, k]
    k_yx = kernel_from_gram(current @ reference.T, widths)  # [k, m]
    own_x = (k_xx.sum(axis=1) - np.diag(k_xx)) / max(m - 1, 1)
    own_y = (k_yy.sum(axis=1) - np.diag(k_yy)) / max(k - 1, 1)
    w_current = own_y - k_yx.mean(axis=1)
    w_reference = k_yx.mean(axis=0) - own_x
    return w_reference.astype(np.float64), w_current.astype(np.float64)


def _top_axes(centred: np.ndarray, k: int = 2, *, block: int = 4, iterations: int = 60) -> np.ndarray:
    """`[D, k]` orthonormal leading principal axes of the centred rows."""
    d = centred.shape[1]
    b = min(block, d)
    q = np.random.default_rng(0).standard_normal((d, b))
    x = centred.astype(np.float64)
    scatter = x.T @ x  # [D, D]
    for _ in range(iterations):
        q, _ = np.linalg.qr(scatter @ q)
    small = q.T @ scatter @ q  # [b, b]
    values, vectors = np.linalg.eigh(small)
    order = np.argsort(values)[::-1][:k]
    return np.asarray(q @ vectors[:, order])


def pca_2d(reference: np.ndarray, current: np.ndarray) -> tuple[np.ndarray, np.ndarray, tuple[float, float]]:
    """`(reference_xy [m, 2], current_xy [k, 2], explained variance ratio of the two axes)`."""
    mean = reference.mean(axis=0)
    centred = reference - mean
    axes = _top_axes(centred, 2)  # [D, 2]
    for j in range(axes.shape[1]):  # a fixed sign: the largest loading positive
        if axes[np.abs(axes[:, j]).argmax(), j] < 0:
            axes[:, j] *= -1
    ref_xy = centred @ axes
    total = float((centred.astype(np.float64) ** 2).sum())
    ratio = [float((ref_xy[:, j] ** 2).sum() / total) if total > 0 else 0.0 for j in range(2)]
    cur_xy = (current - mean) @ axes
    return ref_xy, cur_xy, (ratio[0], ratio[1])


def assign(rows: np.ndarray, centroids: np.ndarray) -> np.ndarray:
    """Index of the most similar centroid for each unit row."""
    if rows.shape[0] == 0:
        return np.zeros(0, dtype=np.int64)
    return np.asarray((rows @ centroids.T).argmax(axis=1), dtype=np.int64)


def spherical_kmeans(rows: np.ndarray, k: int, *, seed: int = 0, iterations: int = 50) -> np.ndarray:
    """`[k', D]` unit centroids (k' = min(k, number of distinct rows)) of unit `rows`."""
    n = rows.shape[0]
    k = max(1, min(k, n))
    rng = np.random.default_rng(seed)
    centroids = np.empty((k, rows.shape[1]), dtype=np.float32)
    centroids[0] = rows[rng.integers(n)]
    dist = 1.0 - rows @ centroids[0]  # [n] distance to the nearest chosen centroid
    chosen = 1
    while chosen < k:
        weights = np.maximum(dist, 0.0) ** 2
        total = float(weights.sum())
        if total <= 0.0:  # fewer distinct rows than k
            break
        centroids[chosen] = rows[rng.choice(n, p=weights / total)]
        dist = np.minimum(dist, 1.0 - rows @ centroids[chosen])
        chosen += 1
    centroids = centroids[:chosen]
    labels = assign(rows, centroids)
    for _ in range(iterations):
        onehot = np.zeros((centroids.shape[0], n), dtype=np.float32)
        onehot[labels, np.arange(n)] = 1.0
        sums = onehot @ rows  # [k, D]
        norms = np.linalg.norm(sums, axis=1, keepdims=True)
        empty = norms[:, 0] == 0.0
        sums[~empty] /= norms[~empty]
        sums[empty] = centroids[empty]  # an emptied cluster keeps its centroid
        centroids = sums.astype(np.float32)
        new = assign(rows, centroids)
        if np.array_equal(new, labels):
            break
        labels = new
    return centroids


@dataclass(frozen=True, eq=False)
class ClusterModel:
    centroids: np.ndarray  # [k, D] unit rows
    labels: tuple[str, ...]  # per cluster: the reference text nearest its centroid
    examples: tuple[tuple[str, ...], ...]  # per cluster: reference texts nearest its centroid
    reference_assignment: np.ndarray  # [m]


def default_cluster_count(n: int) -> int:
    return int(min(20, max(2, n // 50)))


def fit_clusters(
    texts: tuple[str, ...], rows: np.ndarray, *, k: int | None = None, seed: int = 0, examples: int = 3
) -> ClusterModel:
    centroids = spherical_kmeans(rows, k or default_cluster_count(rows.shape[0]), seed=seed)
    labels = assign(rows, centroids)
    sims = rows @ centroids.T  # [m, k]
    names: list[str] = []
    shown: list[tuple[str, ...]] = []
    for c in range(centroids.shape[0]):
        members = np.flatnonzero(labels == c)
        ordered = members[np.argsort(-sims[members, c], kind="stable")]
        picked = _distinct(texts, ordered, examples)
        names.append(picked[0] if picked else "")
        shown.append(picked)
    return ClusterModel(centroids, tuple(names), tuple(shown), labels)


NOVEL_CLUSTER = -1
NOVEL_LABEL = "(new: farther from the reference than its own 1% tail)"


def cluster_shares(
    model: ClusterModel,
    current_rows: np.ndarray,
    current_texts: tuple[str, ...],
    current_witness: np.ndarray,
    *,
    current_novel: np.ndarray,
    reference_novel: tuple[int, int],
    alpha: float,
    examples: int = 3,
) -> tuple[ClusterShare, ...]:
    """Shares per cluster, largest increase first.

    Current texts flagged `current_novel` form their own row (cluster -1) instead of being
    forced into the nearest reference cluster; that row's reference share is
    `reference_novel = (count, n)` measured on the reference's calibration scores.
    `current_witness` orders each cluster's current examples (highest first). Each row
    gets Fisher's exact two-sided test; Holm across the rows."""
    from scipy.stats import fisher_exact  # slow to import: only when explaining

    k = model.centroids.shape[0]
    cur_labels = assign(current_rows, model.centroids)
    cur_labels[current_novel] = k  # the novel row, last
    ref_counts = np.append(np.bincount(model.reference_assignment, minlength=k), reference_novel[0])
    cur_counts = np.bincount(cur_labels, minlength=k + 1)
    ref_totals = [int(model.reference_assignment.size)] * k + [reference_novel[1]]
    n = int(cur_counts.sum())
    p_values = [
        float(
            fisher_exact(
                [
                    [int(ref_counts[c]), ref_totals[c] - int(ref_counts[c])],
                    [int(cur_counts[c]), n - int(cur_counts[c])],
                ]
            )[1]
        )
        for c in range(k + 1)
    ]
    adjusted = holm_adjust(p_values)
    rows = []
    for c in range(k + 1):
        members = np.flatnonzero(cur_labels == c)
        ordered = members[np.argsort(-current_witness[members], kind="stable")]
        ref_share = ref_counts[c] / ref_totals[c] if ref_totals[c] else 0.0
        cur_share = cur_counts[c] / n if n else 0.0
        novel_row = c == k
        rows.append(
            ClusterShare(
                cluster=NOVEL_CLUSTER if novel_row else c,
                label=NOVEL_LABEL if novel_row else model.labels[c],
                reference_count=int(ref_counts[c]),
                current_count=int(cur_counts[c]),
                reference_share=float(ref_share),
                current_share=float(cur_share),
                change=float(cur_share - ref_share),
                p_value=p_values[c],
                p_adjusted=adjusted[c],
                significant=adjusted[c] < alpha,
                reference_examples=() if novel_row else model.examples[c],
                current_examples=_distinct(current_texts, ordered, examples),
            )
        )
    rows.sort(key=lambda r: (-r.change, r.cluster))
    return tuple(rows)


def _distinct(texts: tuple[str, ...], order: np.ndarray, limit: int) -> tuple[str, ...]:
    seen: list[str] = []
    for i in order:
        text = texts[int(i)]
        if text not in seen:
            seen.append(text)
            if len(seen) == limit:
                break
    return tuple(seen)


def explain_field(
    field: str,
    reference: tuple[tuple[str, ...], np.ndarray],
    current: tuple[tuple[str, ...], np.ndarray],
    clusters: ClusterModel,
    config: DetectorConfig,
) -> FieldExplanation:
    ref_texts, ref_rows = reference
    cur_texts, cur_rows = current
    seed = config.options.seed
    ref_idx = _subsample(ref_rows.shape[0], config.explain_max_points, seed)
    cur_idx = _subsample(cur_rows.shape[0], config.explain_max_points, seed + 1)
    widths = median_widths(ref_rows, config.options.bandwidth_multipliers, seed=seed)
    w_ref, w_cur_sub = witness(ref_rows[ref_idx], cur_rows[cur_idx], widths)
    w_cur = np.full(cur_rows.shape[0], -np.inf)
    w_cur[cur_idx] = w_cur_sub
    n = config.examples
    appeared = _examples(cur_texts, cur_idx, w_cur_sub, n, highest=True)
    typical = _examples(cur_texts, cur_idx, w_cur_sub, n, highest=False)
    disappeared = _examples(ref_texts, ref_idx, w_ref, n, highest=False)
    novelty, novel_flags, ref_novel = _novelty(ref_texts, ref_rows, cur_texts, cur_rows, config)
    shares = cluster_shares(
        clusters,
        cur_rows,
        cur_texts,
        w_cur,
        current_novel=novel_flags,
        reference_novel=ref_novel,
        alpha=config.alpha,
        examples=3,
    )
    projection = _projection(ref_rows, cur_rows, novel_flags, config)
    return FieldExplanation(field, appeared, typical, disappeared, shares, novelty, projection)


def _subsample(n: int, limit: int, seed: int) -> np.ndarray:
    if n <= limit:
        return np.arange(n)
    return np.sort(np.random.default_rng(seed).choice(n, limit, replace=False))


def _examples(
    texts: tuple[str, ...], idx: np.ndarray, values: np.ndarray, n: int, *, highest: bool
) -> tuple[ExampleText, ...]:
    order = np.argsort(-values if highest else values, kind="stable")
    out: list[ExampleText] = []
    seen: set[str] = set()
    for j in order:
        text = texts[int(idx[j])]
        if text in seen:
            continue
        seen.add(text)
        out.append(ExampleText(text, float(values[j])))
        if len(out) == n:
            break
    return tuple(out)


def _novelty(
    ref_texts: tuple[str, ...],
    ref_rows: np.ndarray,
    cur_texts: tuple[str, ...],
    cur_rows: np.ndarray,
    config: DetectorConfig,
) -> tuple[Novelty, np.ndarray, tuple[int, int]]:
    # the scan's own per-item scores and calibration, so the examples are the texts it counts
    calibration = fit_novelty(ref_rows, config.options)
    bank_rows = calibration.bank_rows
    cal_dist = calibration.calibration
    cur_dist, cur_near = nearest(cur_rows, calibration.bank)
    tail = float(np.quantile(cal_dist, config.novelty_quantile))
    novel = cur_dist > tail
    examples: list[NoveltyExample] = []
    seen: set[str] = set()
    for j in np.argsort(-cur_dist, kind="stable"):
        if not novel[j] or len(examples) == config.examples:
            break
        if cur_texts[j] in seen:
            continue
        seen.add(cur_texts[j])
        examples.append(
            NoveltyExample(cur_texts[j], float(cur_dist[j]), ref_texts[int(bank_rows[cur_near[j]])])
        )
    result = Novelty(
        rate=float(novel.mean()),
        reference_rate=float((cal_dist > tail).mean()),
        quantile=config.novelty_quantile,
        tail_distance=tail,
        count=int(novel.sum()),
        examples=tuple(examples),
    )
    return result, novel, (int((cal_dist > tail).sum()), int(cal_dist.size))


def _projection(
    ref_rows: np.ndarray, cur_rows: np.ndarray, novel: np.ndarray, config: DetectorConfig
) -> Projection:
    seed = config.options.seed
    fit_idx = _subsample(ref_rows.shape[0], config.explain_max_points, seed)
    ref_idx = _subsample(ref_rows.shape[0], config.projection_points, seed + 2)
    cur_idx = _subsample(cur_rows.shape[0], config.projection_points, seed + 3)
    _, xy, ratio = pca_2d(ref_rows[fit_idx], np.concatenate([ref_rows[ref_idx], cur_rows[cur_idx]]))
    both = np.round(xy.astype(np.float64), 4)
    ref_pts = tuple((float(a), float(b)) for a, b in both[: ref_idx.size])
    cur_pts = tuple((float(a), float(b)) for a, b in both[ref_idx.size :])
    return Projection("pca", ratio, ref_pts, cur_pts, tuple(bool(novel[i]) for i in cur_idx))
