"""What the explanation of one field holds: frozen dataclasses, no rendering."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ClusterShare", "ExampleText", "FieldExplanation", "Novelty", "NoveltyExample", "Projection"]


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
    own `1 - quantile` tail (measured on its held-out part)."""

    rate: float
    reference_rate: float  # the same share among held-out reference texts (about 1 - quantile)
    quantile: float
    tail_distance: float
    count: int
    examples: tuple[NoveltyExample, ...]


@dataclass(frozen=True)
class ClusterShare:
    """One k-means cluster of the reference: its share in each window, and Fisher's exact
    two-sided test of equal shares, Holm-adjusted across the clusters.

    Cluster -1 holds the current texts beyond the novelty tail (not forced into the nearest
    reference cluster); its reference share is measured on the held-out reference."""

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
