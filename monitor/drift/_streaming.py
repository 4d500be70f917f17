"""Streaming drift for the service: per-request novelty and relevance into CUSUM charts.

Novelty of a request is its prompt's distance (1 - cosine) to the nearest text of the
reference's bank half, the same score as the batch novelty test; the chart's in-control
scores are the held-out half's distances to the bank. Relevance (when the reference has
responses) is charted on its negative, so a drop is the anomalous side. Both charts are
designed for the upper `reference_confidence` bound of their in-control exceedance rate
(`design_cusum`), so the run length between false alarms holds for the reference in use,
not only on average over references.
With both charts each gets `2 × target_arl` (alone, the novelty chart gets `target_arl`),
so false alarms of either come on average about `target_arl` requests apart (union bound
on the alarm rates).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ._cusum import CusumDesign, TailCusum, design_cusum
from ._kernel import as_unit_rows
from ._neighbours import nearest, split_reference
from ._stat import TestOptions
from ._windows import EmbeddedWindow

__all__ = ["StreamUpdate", "StreamingDetector"]


@dataclass(frozen=True)
class StreamUpdate:
    index: int  # 0-based position of the request in the stream
    novelty: float  # distance to the nearest reference (bank) text
    novel: bool  # beyond the novelty chart's cut
    relevance: float | None  # prompt-response cosine, None without a response
    novelty_statistic: float  # CUSUM value after this request (0 right after an alarm)
    relevance_statistic: float | None
    alarm: bool
    signals: tuple[str, ...]  # which charts alarmed: "novelty", "relevance"


class StreamingDetector:
    def __init__(
        self,
        reference: EmbeddedWindow,
        *,
        target_arl: float = 2000.0,
        tail: float = 0.05,
        factor: float = 3.0,
        options: TestOptions | None = None,
        min_responses: int = 20,
    ) -> None:
        opts = options or TestOptions()
        bank_rows, cal_rows = split_reference(
            len(reference.prompts), opts.calibration_fraction, seed=opts.seed
        )
        rows = reference.prompt_embeddings
        self._bank = rows[bank_rows]
        cal_scores, _ = nearest(rows[cal_rows], self._bank)
        charts = 2 if len(reference.relevance) >= min_responses else 1
        per_chart = charts * target_arl  # union bound: alarm rates add up across charts
        self.novelty_design: CusumDesign = design_cusum(
            cal_scores,
            tail=tail,
            factor=factor,
            target_arl=per_chart,
            seed=opts.seed,
            reference_confidence=opts.reference_confidence,
        )
        self.relevance_design: CusumDesign | None = None
        if charts == 2:
            self.relevance_design = design_cusum(
                -reference.relevance,
                tail=tail,
                factor=factor,
                target_arl=per_chart,
                seed=opts.seed + 1,
                reference_confidence=opts.reference_confidence,
            )
        self.target_arl = float(target_arl)
        self._novelty = TailCusum(self.novelty_design)
        self._relevance = TailCusum(self.relevance_design) if self.relevance_design else None
        self._index = 0

    def observe(
        self, prompt_embedding: np.ndarray, response_embedding: np.ndarray | None = None
    ) -> StreamUpdate:
        """One request: its prompt embedding `[D]` and, when it has one, its response's."""
        p = as_unit_rows(np.asarray(prompt_embedding).reshape(1, -1), "prompt embedding")
        distance = float(nearest(p, self._bank)[0][0])
        novel, novelty_alarm = self._novelty.update(distance)
        relevance: float | None = None
        relevance_alarm = False
        if response_embedding is not None:
            r = as_unit_rows(np.asarray(response_embedding).reshape(1, -1), "response embedding")
            relevance = float(p[0] @ r[0])
            if self._relevance is not None:
                _, relevance_alarm = self._relevance.update(-relevance)
        signals = tuple(
            name for name, fired in (("novelty", novelty_alarm), ("relevance", relevance_alarm)) if fired
        )
        update = StreamUpdate(
            index=self._index,
            novelty=distance,
            novel=novel,
            relevance=relevance,
            novelty_statistic=self._novelty.statistic,
            relevance_statistic=self._relevance.statistic if self._relevance is not None else None,
            alarm=bool(signals),
            signals=signals,
        )
        self._index += 1
        return update

    def observe_many(
        self, prompt_embeddings: np.ndarray, response_embeddings: np.ndarray | None = None
    ) -> tuple[StreamUpdate, ...]:
        """Several requests in order (`[N, D]`, responses row-for-row or None)."""
        prompts = np.asarray(prompt_embeddings)
        if response_embeddings is None:
            return tuple(self.observe(p) for p in prompts)
        return tuple(
            self.observe(p, r) for p, r in zip(prompts, np.asarray(response_embeddings), strict=True)
        )

    def reset(self) -> None:
        self._novelty.reset()
        if self._relevance is not None:
            self._relevance.reset()
