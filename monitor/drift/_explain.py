"""The explanation of one field: what appeared and what disappeared.

Computed on at most `config.explain_max_points` texts per window (a seeded subsample);
it describes the verdict and never changes it.
"""

from __future__ import annotations

import numpy as np

from ._clusters import ClusterModel, cluster_shares
from ._config import DriftConfig
from ._explanation import ExampleText, FieldExplanation, Novelty, NoveltyExample, Projection
from ._kernel import median_widths
from ._neighbours import nearest, split_reference
from ._projection import pca_2d
from ._witness import witness

__all__ = ["explain_field"]


def explain_field(
    field: str,
    reference: tuple[tuple[str, ...], np.ndarray],
    current: tuple[tuple[str, ...], np.ndarray],
    clusters: ClusterModel,
    config: DriftConfig,
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
    config: DriftConfig,
) -> tuple[Novelty, np.ndarray, tuple[int, int]]:
    options = config.options
    bank_rows, cal_rows = split_reference(ref_rows.shape[0], options.calibration_fraction, seed=options.seed)
    bank = ref_rows[bank_rows]
    cal_dist, _ = nearest(ref_rows[cal_rows], bank)
    cur_dist, cur_near = nearest(cur_rows, bank)
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
    ref_rows: np.ndarray, cur_rows: np.ndarray, novel: np.ndarray, config: DriftConfig
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
