"""Streaming mode: CUSUM thresholds calibrated by simulation to a target run length, and
prompt drift flagged within a bounded delay (real Banking77 and hotel embeddings)."""

from __future__ import annotations

import numpy as np
import pytest
from _drift_helpers import Pool, real_pool
from infersight.monitor.drift import StreamingDetector
from infersight.monitor.drift._streaming import TailCusum, design_cusum
from infersight.monitor.drift._windows import EmbeddedWindow


@pytest.fixture(scope="module")
def pool() -> Pool:
    return real_pool()


def _run_lengths(detector: StreamingDetector, stream: np.ndarray) -> list[int]:
    lengths, last = [], -1
    for update in detector.observe_many(stream):
        if update.alarm:
            lengths.append(update.index - last)
            last = update.index
    return lengths


def test_simulated_threshold_gives_the_target_run_length_on_in_control_bits() -> None:
    rng = np.random.default_rng(0)
    scores = rng.random(600)
    design = design_cusum(scores, target_arl=300)
    chart = TailCusum(design)
    stream = rng.choice(scores, 120_000)
    alarms = sum(chart.update(float(s))[1] for s in stream)
    empirical = stream.size / alarms
    assert 0.8 * 300 <= empirical <= 1.25 * 300, empirical


def test_false_alarms_on_unseen_banking77_traffic_come_at_least_target_apart_for_each_reference(
    pool: Pool,
) -> None:
    rng = np.random.default_rng(1)
    means = []
    for _ in range(4):
        idx = rng.permutation(len(pool.banking))
        reference = EmbeddedWindow.from_arrays(pool.banking[idx[:800]])
        detector = StreamingDetector(reference, target_arl=250)
        held_out = pool.banking[idx[800:]]  # texts the reference never saw
        lengths = _run_lengths(detector, held_out[rng.integers(0, held_out.shape[0], 20_000)])
        means.append(float(np.mean(lengths)) if lengths else np.inf)
    # The chart is designed for the upper 99% bound of its reference's exceedance rate, so
    # the target holds for each reference, not only on average (measured 1.6x-4.6x of
    # target here; before issue 11, 0.5x-1.2x). It must not be so conservative that it
    # never fires: 20,000 requests give each reference dozens of alarms at most 8x target.
    assert all(m >= 250 for m in means), means
    assert all(m <= 8 * 250 for m in means), means


def test_hotel_utterances_entering_the_stream_are_flagged_within_a_bounded_delay(pool: Pool) -> None:
    rng = np.random.default_rng(2)
    idx = rng.permutation(len(pool.banking))
    reference = EmbeddedWindow.from_arrays(pool.banking[idx[:800]])
    held_out = pool.banking[idx[800:]]
    delays = []
    for _ in range(20):
        detector = StreamingDetector(reference, target_arl=1000)
        detector.observe_many(held_out[rng.integers(0, held_out.shape[0], 100)])
        detector.reset()  # the change starts with a clean chart (worst case for the delay: none)
        mixed = np.where(
            (rng.random(600) < 0.3)[:, None],
            pool.hotels[rng.integers(0, pool.hotels.shape[0], 600)],
            held_out[rng.integers(0, held_out.shape[0], 600)],
        )
        first = next((u.index for u in detector.observe_many(mixed) if u.alarm), None)
        assert first is not None, "a 30% hotel stream was never flagged in 600 requests"
        delays.append(first - 100 + 1)
    # 30% of requests from a new topic: flagged after a median of at most 60 requests
    assert float(np.median(delays)) <= 60, delays
    assert max(delays) <= 200, delays


def test_relevance_chart_flags_answers_that_stop_matching_their_questions(pool: Pool) -> None:
    rng = np.random.default_rng(3)
    prompts = pool.banking[:600]
    # a response close to its own prompt: the prompt's embedding plus noise
    noise = rng.standard_normal(prompts.shape).astype(np.float32) * 0.04
    responses = prompts + noise
    reference = EmbeddedWindow.from_arrays(prompts[:400], responses[:400])
    detector = StreamingDetector(reference, target_arl=1000)
    assert detector.relevance_design is not None
    unrelated = pool.banking[rng.permutation(600)]  # the answer to some other question
    updates = detector.observe_many(prompts[400:600], unrelated[:200])
    fired = [u for u in updates if "relevance" in u.signals]
    assert fired and fired[0].index < 30
    assert all(u.relevance is not None for u in updates)
