"""Paired release checks (alerts/release/paired_checks.py) and their use by the canary and the
post-deploy analysis: a regression on the same requests is caught and explained with its
pair counts; clients changing what they ask on one arm cannot make a good release fail."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import math
import random
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from infersight.alerts.actions.runner import ActionRunner
from infersight.alerts.release.canary import CanaryAnalysis, CanaryPolicy
from infersight.alerts.release.paired_checks import PairedAnalysis, PairedEvidence, PairOutcome, PairPolicy
from infersight.alerts.release.post_deploy import (
    REGRESSION_ALERT,
    AnalysisPolicy,
    DeployAnalyzer,
    VersionStats,
)
from infersight.engine.events import PairCompleted
from infersight.monitor.service.pair_feed import PairFeed, TextPair
from infersight.monitor.store import connect, sqlite_url, upgrade
from infersight.monitor.store.tables import alerts, deploy_analyses
from sqlalchemy import select

NEW, OLD = "m_fp32-v1.1", "m_fp32-v1.0"


def _pair(rng: random.Random, *, drop: float = 0.0, similarity: float = 0.97, longer: int = 0) -> PairOutcome:
    """One scored pair: equal versions unless told (the candidate's relevance `drop`, the
    answers' `similarity`, `longer` extra tokens on the candidate's side)."""
    base = rng.gauss(0.45, 0.1)
    same = rng.random() < 0.8  # most answers of a good build are the very same text
    cand = base if same and drop == 0.0 else base - drop + rng.gauss(0.0, 0.05)
    sim = 1.0 if same and similarity > 0.9 else min(1.0, rng.gauss(similarity, 0.05))
    n = rng.randint(4, 12)
    return PairOutcome(NEW, OLD, n + longer, n, "length", "length", cand, base, sim)


def test_equal_versions_never_fail_a_paired_check() -> None:
    failed = 0
    for seed in range(20):
        rng = random.Random(seed)
        analysis = PairedAnalysis(PairPolicy())
        for _ in range(400):
            analysis.observe(_pair(rng))
        failed += bool(analysis.regressions())
    assert failed == 0


def test_a_worse_release_fails_on_few_pairs_and_says_how_the_pairs_went() -> None:
    rng = random.Random(1)
    analysis = PairedAnalysis(PairPolicy())
    n = 0
    while analysis.first_regression is None and n < 200:
        analysis.observe(_pair(rng, drop=0.4, similarity=0.1))
        n += 1
    first = analysis.first_regression
    assert first is not None and n <= 20, n
    assert first.name in ("relevance", "similarity")
    text = first.describe()
    if first.name == "relevance":
        assert (
            text.startswith(f"relevance fell in {first.below} of {first.pairs} pairs") and "mean -0." in text
        )
    else:
        assert f"in {first.below} of {first.pairs} pairs" in text and "mean similarity 0." in text
    assert "always-valid p=" in text


def test_length_and_finish_checks_see_longer_answers_on_the_same_requests() -> None:
    rng = random.Random(2)
    analysis = PairedAnalysis(PairPolicy())
    for _ in range(60):
        p = _pair(rng, longer=20)
        analysis.observe(PairOutcome(p.candidate, p.baseline, p.candidate_tokens, p.baseline_tokens,
                                     "length", "stop", None, None, None))  # fmt: skip
    names = {c.name for c in analysis.regressions()}
    assert names == {"output_length", "finish_agreement"}
    (length,) = [c for c in analysis.checks() if c.name == "output_length"]
    assert "longer in 60 of 60 pairs" in length.describe()


def test_a_paired_canary_cannot_be_steered_by_what_clients_ask_of_each_arm() -> None:
    """Issue 21's attack: clients ask 1 token on the canary arm and 48 on the stable arm. Arm
    against arm, relevance and length differ; on pairs (both versions answer the same
    request) nothing does, and the good canary is not rolled back."""
    rng = random.Random(3)
    unpaired = CanaryAnalysis(CanaryPolicy(requests_per_step=100_000))
    paired = CanaryAnalysis(CanaryPolicy(requests_per_step=100_000), pairs=PairPolicy())
    for i in range(600):
        canary = i % 2 == 0
        tokens = 1 if canary else 48
        relevance = rng.gauss(0.18 if canary else 0.44, 0.1)  # what 1-token answers score
        for analysis in (unpaired, paired):
            analysis.observe(canary, error_type=None, latency_s=None, output_tokens=tokens)
            analysis.observe_relevance(canary, relevance)
        if i % 5 == 0:  # a share of requests answered by both: the same budget on both sides
            same = rng.gauss(0.3, 0.1)
            paired.observe_pair(PairOutcome(NEW, OLD, tokens, tokens, "length", "length", same, same, 1.0))
    assert unpaired.verdict().action == "rollback"
    assert paired.verdict().action == "continue"
    assert {c.name for c in paired.checks()} == {"server_errors", "latency"}  # the quality checks are paired


def test_a_paired_canary_rolls_back_a_bad_release_with_the_pairs_in_the_reason() -> None:
    rng = random.Random(4)
    analysis = CanaryAnalysis(CanaryPolicy(requests_per_step=100_000), pairs=PairPolicy())
    for _ in range(40):
        analysis.observe_pair(_pair(rng, drop=0.5, similarity=0.05))
    verdict = analysis.verdict()
    assert verdict.action == "rollback" and verdict.reason.startswith("paired regression: ")
    assert " pairs" in verdict.reason and "always-valid p=" in verdict.reason


class _Metrics:
    """The store's figures, fixed: enough requests on both sides, the unpaired figures of a
    before/after whose traffic changed at the deploy (lower relevance, different answers)."""

    def stats(self, version: str, since: dt.datetime, until: dt.datetime) -> VersionStats:
        return VersionStats(100, 0.0, 0.5, 0.2 if version == NEW else 0.45)

    def output_drift_p_value(self, new: str, old: str, since: dt.datetime) -> float | None:
        return 1e-14


def _analyzer(tmp_path: Path, pairs: PairedEvidence | None, now: list[float]) -> DeployAnalyzer:
    db = connect(sqlite_url(tmp_path / "s.db"))
    upgrade(db)
    runner = ActionRunner(db, data_dir=tmp_path, clock=lambda: now[0])
    policy = AnalysisPolicy(window_s=100.0, interval_s=10.0, max_failed_checks=2)
    return DeployAnalyzer(db, _Metrics(), runner, policy=policy, clock=lambda: now[0], pairs=pairs)


def test_post_deploy_on_pairs_ignores_a_traffic_mix_change_but_catches_a_paired_regression(
    tmp_path: Path,
) -> None:
    now = [1_000_000.0]
    evidence = PairedEvidence()
    analyzer = _analyzer(tmp_path, evidence, now)
    rng = random.Random(5)
    deployed = dt.datetime.fromtimestamp(now[0], dt.UTC)
    analysis_id = analyzer.on_deploy(NEW, OLD, deployed)
    for _ in range(30):
        evidence.observe(_pair(rng))  # the same requests: the release changed nothing
    for _ in range(11):
        now[0] += 10.0
        results = analyzer.tick()
        assert all(r.verdict == "passed" for r in results), [r.failures for r in results]
    with analyzer.engine.connect() as conn:
        row = conn.execute(select(deploy_analyses).where(deploy_analyses.c.id == analysis_id)).one()
    assert row.state == "passed"
    last = json.loads(row.evidence)[-1]
    assert last["pairs"] == 30 and last["paired"].startswith("30 pairs: relevance fell in")
    # a bad release: the pairs fail, the page names the paired figures and the pair count
    now[0] += 100.0
    bad = analyzer.on_deploy("m_fp32-v1.2", OLD, dt.datetime.fromtimestamp(now[0], dt.UTC))
    for _ in range(25):
        worse = _pair(rng, drop=0.5, similarity=0.05)
        evidence.observe(dataclasses.replace(worse, candidate="m_fp32-v1.2"))
    for _ in range(2):
        now[0] += 10.0
        (result,) = analyzer.tick()
    assert result.verdict == "failed" and result.rollback is not None and result.pairs == 25
    assert any("of 25 pairs" in f for f in result.failures), result.failures
    with analyzer.engine.connect() as conn:
        (page,) = conn.execute(select(alerts).where(alerts.c.alertname == REGRESSION_ALERT)).all()
    annotations = json.loads(page.annotations)
    assert "(25 pairs)" in annotations["summary"] and annotations["pairs"] == "25"
    assert bad != analysis_id


def test_without_pairs_the_verdict_says_the_paired_checks_are_off(tmp_path: Path) -> None:
    now = [1_000_000.0]
    off = PairedEvidence(enabled=False, off_reason="paired checks off: proxy mode has no second version")
    analyzer = _analyzer(tmp_path, off, now)
    analyzer.on_deploy(NEW, OLD, dt.datetime.fromtimestamp(now[0], dt.UTC))
    for _ in range(2):
        now[0] += 10.0
        (result,) = analyzer.tick()
    # unpaired, the mix change reads as a regression: the verdict says what it rested on
    assert result.verdict == "failed" and result.paired.startswith("paired checks off: proxy mode")
    with analyzer.engine.connect() as conn:
        (page,) = conn.execute(select(alerts).where(alerts.c.alertname == REGRESSION_ALERT)).all()
    assert "paired checks off: proxy mode" in json.loads(page.annotations)["summary"]


def test_latency_compares_like_requests_so_asking_one_arm_for_longer_answers_is_not_a_regression() -> None:
    rng = random.Random(6)
    steered = CanaryAnalysis(CanaryPolicy(requests_per_step=100_000), pairs=PairPolicy())
    slow = CanaryAnalysis(CanaryPolicy(requests_per_step=100_000), pairs=PairPolicy())
    for i in range(4000):
        canary = i % 2 == 0
        tokens = (
            rng.choice((4, 48)) if i % 10 == 0 else (48 if canary else 4)
        )  # both shapes on both arms, some
        latency = 0.02 * tokens * rng.lognormvariate(0.0, 0.2)  # the same per-token speed on both versions
        steered.observe(canary, error_type=None, latency_s=latency, output_tokens=tokens, prompt_tokens=30)
        slow.observe(canary, error_type=None, latency_s=latency * (2.0 if canary else 1.0), output_tokens=tokens,
                     prompt_tokens=30)  # fmt: skip
    assert steered.verdict().action == "continue", steered.verdict().reason
    verdict = slow.verdict()  # a truly slower canary is still caught, within like requests
    assert verdict.action == "rollback" and verdict.reason.startswith("regression on latency"), verdict.reason


class _ShapedMetrics(_Metrics):
    """After the deploy clients also ask for long answers (slow, a shape the previous version
    was never asked for); like requests take as long on both versions unless `slower`."""

    def __init__(self, slower: float) -> None:
        self.slower = slower

    def stats(self, version: str, since: dt.datetime, until: dt.datetime) -> VersionStats:
        if version == OLD:
            return VersionStats(100, 0.0, 0.10, 0.45, p99_by_shape=(("out3/prompt5", 100, 0.10),))
        short = 0.10 * self.slower
        return VersionStats(
            100, 0.0, 1.2, 0.45, p99_by_shape=(("out3/prompt5", 40, short), ("out6/prompt5", 60, 1.2))
        )


def test_post_deploy_latency_compares_requests_of_the_same_shape(tmp_path: Path) -> None:
    now = [1_000_000.0]
    for slower, failed in ((1.0, False), (3.0, True)):
        db = connect(sqlite_url(tmp_path / f"s{slower}.db"))
        upgrade(db)
        runner = ActionRunner(db, data_dir=tmp_path, clock=lambda: now[0])
        analyzer = DeployAnalyzer(db, _ShapedMetrics(slower), runner, clock=lambda: now[0], pairs=PairedEvidence(),
                                  policy=AnalysisPolicy(window_s=100.0, interval_s=10.0, max_failed_checks=2))  # fmt: skip
        analyzer.on_deploy(NEW, OLD, dt.datetime.fromtimestamp(now[0], dt.UTC))
        now[0] += 10.0
        (result,) = analyzer.tick()
        latency = [f for f in result.failed_checks if f.check == "p99_latency"]
        assert bool(latency) is failed, result.failures
        if failed:
            assert latency[0].text == (
                "p99 latency 0.300s > 1.5 x previous 0.100s on requests of the same shape (1 of 2 shapes)"
            )


def _timed(rng: random.Random, slower: float, load: float) -> PairOutcome:
    """A pair whose two sides were timed in the same seconds: both steps scaled by the machine's
    `load` (another tenant, a flood of clients), the candidate's also by `slower`."""
    step = 0.004 * load * rng.lognormvariate(0.0, 0.1)
    return dataclasses.replace(
        _pair(rng), candidate_step_s=step * slower * rng.lognormvariate(0.0, 0.05), baseline_step_s=step
    )


def test_the_step_check_catches_a_slower_release_whatever_the_load_and_not_a_loaded_machine() -> None:
    for load in (1.0, 3.0):
        rng = random.Random(int(load))
        good, slow = PairedAnalysis(PairPolicy()), PairedAnalysis(PairPolicy())
        for i in range(200):
            busy = load if i >= 100 else 1.0  # the machine gets busy half way: both sides alike
            good.observe(_timed(rng, 1.1, busy))  # a little slower (int8 against fp32 may be either)
            slow.observe(_timed(rng, 2.0, busy))
        assert not good.regressions(), [c.describe() for c in good.regressions()]
        first = slow.first_regression
        assert first is not None and first.name == "step_time" and first.pairs == 10
        assert first.describe().startswith(
            "decode steps slower than 1.5x in 10 of 10 pairs, mean step ratio "
        )
        assert first.mean is not None and abs(math.exp(first.mean) - 2.0) < 0.15, first.describe()
    untimed = PairedAnalysis(PairPolicy())  # proxy pairs: no step times, no step check
    untimed.observe(_pair(random.Random(0)))
    (step,) = [c for c in untimed.checks() if c.name == "step_time"]
    assert step.pairs == 0 and step.describe() == "step_time: no pairs yet"


def test_with_timed_pairs_the_post_deploy_latency_rests_on_them_not_on_before_against_after(
    tmp_path: Path,
) -> None:
    """The machine got 3x slower after the deploy (requests of the same shape 0.3 s against
    0.1 s before): the before-against-after p99 reads it as the release's; the pairs, both sides
    timed under that same load at equal steps, say it is not."""
    now = [1_000_000.0]
    rng = random.Random(9)
    for step_times, failed in ((True, False), (False, True)):
        db = connect(sqlite_url(tmp_path / f"t{step_times}.db"))
        upgrade(db)
        runner = ActionRunner(db, data_dir=tmp_path, clock=lambda: now[0])
        evidence = PairedEvidence(step_times=step_times)
        analyzer = DeployAnalyzer(db, _ShapedMetrics(3.0), runner, clock=lambda: now[0], pairs=evidence,
                                  policy=AnalysisPolicy(window_s=100.0, interval_s=10.0, max_failed_checks=2))  # fmt: skip
        analyzer.on_deploy(NEW, OLD, dt.datetime.fromtimestamp(now[0], dt.UTC))
        for _ in range(20):
            evidence.observe(_timed(rng, 1.0, 3.0))
        now[0] += 10.0
        (result,) = analyzer.tick()
        assert any(f.check == "p99_latency" for f in result.failed_checks) is failed, result.failures
        assert "decode steps slower than 1.5x in 0 of 20 pairs" in result.paired, result.paired


def _read_pair(rng: random.Random, divergence: float, *, logprobs: bool = True) -> PairOutcome:
    """A pair whose answers each version reads `divergence` nats per token worse than their own
    version did on average, with the per-token scatter of sampled text (a token's log-ratio
    varies about as much as its mean is large, and never by less than a tenth of a nat)."""
    sides = []
    for _ in range(2):
        n = rng.randint(4, 24)
        own = sum(-abs(rng.gauss(2.0, 1.0)) for _ in range(n))
        spread = max(0.1, 2.0 * divergence)
        cross = own - sum(rng.gauss(divergence, spread) for _ in range(n))
        sides.append((n, own, cross))
    (c_n, c_own, c_cross), (b_n, b_own, b_cross) = sides
    if not logprobs:
        return PairOutcome(NEW, OLD, c_n, b_n, "length", "length")
    return PairOutcome(NEW, OLD, c_n, b_n, "length", "length", candidate_logprob=c_own,
                       baseline_logprob=b_own, candidate_under_baseline=c_cross,
                       baseline_under_candidate=b_cross)  # fmt: skip


def test_divergence_is_the_mean_per_token_log_perplexity_increase_of_the_two_answers() -> None:
    pair = PairOutcome(NEW, OLD, 4, 2, "length", "stop", candidate_logprob=-8.0, baseline_logprob=-3.0,
                       candidate_under_baseline=-10.0, baseline_under_candidate=-4.0)  # fmt: skip
    assert pair.divergence() == 0.5 * (2.0 / 4 + 1.0 / 2)
    # an answer of no tokens says nothing: the other answer alone
    empty = dataclasses.replace(pair, baseline_tokens=0, baseline_logprob=0.0, baseline_under_candidate=0.0)
    assert empty.divergence() == 0.5
    assert dataclasses.replace(pair, candidate_under_baseline=None).divergence() is None


def test_a_release_that_reads_the_other_answers_worse_fails_on_divergence_within_few_pairs() -> None:
    for seed in range(10):
        rng = random.Random(seed)
        analysis = PairedAnalysis(PairPolicy())
        n = 0
        while analysis.first_regression is None and n < 200:
            analysis.observe(_read_pair(rng, 0.2))
            n += 1
        first = analysis.first_regression
        assert first is not None and first.name == "divergence" and n <= 20, (seed, n)
        text = first.describe()
        assert "nats/token worse" in text and "in perplexity" in text
        assert f"in {first.above} of {first.pairs} pairs" in text


def test_a_release_within_the_divergence_line_never_fails_it() -> None:
    failed = 0
    for seed in range(40):
        rng = random.Random(seed)
        analysis = PairedAnalysis(PairPolicy())
        for _ in range(400):
            analysis.observe(_read_pair(rng, 0.005))
        failed += any(c.name == "divergence" for c in analysis.regressions())
    assert failed == 0


def test_pairs_without_log_probabilities_leave_the_divergence_check_waiting() -> None:
    rng = random.Random(3)
    analysis = PairedAnalysis(PairPolicy())
    for _ in range(30):
        analysis.observe(_read_pair(rng, 0.5, logprobs=False))
    (divergence,) = [c for c in analysis.checks() if c.name == "divergence"]
    assert divergence.pairs == 0 and not divergence.regressed and analysis.pairs == 30
    assert divergence.describe() == "divergence: no pairs yet"


def _sampled_pair(
    rng: random.Random, divergence: float, similarity: float, *, logprobs: bool = True
) -> PairOutcome:
    """A pair of answers sampled at temperature 1 with one seed: the two versions read each
    other's answers `divergence` worse, and the answers are `similarity` alike on average
    (coupled until the two distributions first part, unrelated after)."""
    pair = _read_pair(rng, divergence, logprobs=logprobs)
    sim = 1.0 if rng.random() < similarity - 0.2 else max(0.0, rng.gauss(0.2, 0.15))
    return dataclasses.replace(pair, similarity=sim)


def test_with_similarity_deciding_only_without_divergence_a_faithful_release_passes_a_bad_one_not() -> None:
    """A faithful quantization parts from the baseline's tokens often enough that its sampled
    answers average under the similarity line, while both versions read each other's answers
    well within the divergence line: the "always" mode rolls it back on similarity, and
    "without_divergence" (the default) leaves the verdict to divergence on the runtime's pairs."""
    always, without = PairPolicy(similarity_decides="always"), PairPolicy()
    assert without.similarity_decides == "without_divergence"
    failed_always = failed_without = 0
    for seed in range(10):
        a, w = PairedAnalysis(always), PairedAnalysis(without)
        rng_a, rng_w = random.Random(seed), random.Random(seed)
        for _ in range(300):
            a.observe(_sampled_pair(rng_a, 0.02, 0.5))
            w.observe(_sampled_pair(rng_w, 0.02, 0.5))
        failed_always += [c.name for c in a.regressions()] == ["similarity"]
        failed_without += bool(w.regressions())
        (similarity,) = [c for c in w.checks() if c.name == "similarity"]
        assert similarity.reported_only and similarity.mean is not None and similarity.mean < 0.6
        assert similarity.describe().endswith("(reported only: divergence decides on these pairs)")
    assert failed_always >= 8 and failed_without == 0
    # a quietly bad release still fails, on divergence
    rng = random.Random(11)
    bad = PairedAnalysis(without)
    for _ in range(40):
        bad.observe(_sampled_pair(rng, 0.3, 0.3))
    assert bad.first_regression is not None and bad.first_regression.name == "divergence"
    # pairs without the runtime's log-probabilities (a proxy's): similarity decides as before
    rng = random.Random(12)
    proxy = PairedAnalysis(without)
    for _ in range(60):
        proxy.observe(_sampled_pair(rng, 0.3, 0.2, logprobs=False))
    assert [c.name for c in proxy.regressions()] == ["similarity"]
    with pytest.raises(ValueError, match="similarity_decides"):
        PairPolicy(similarity_decides="sometimes")


def test_the_pair_feed_reads_the_canary_as_the_candidate_whichever_side_it_answered() -> None:
    tokenizer = SimpleNamespace(decode=lambda ids, skip_special_tokens: " ".join(map(str, ids)))
    runtime = SimpleNamespace(
        tokenizer=tokenizer, canary=SimpleNamespace(status=SimpleNamespace(version=NEW))
    )
    evidence = PairedEvidence(PairPolicy())
    feed = PairFeed(runtime, evidence)
    # the stable version answered live, the canary the shadow: 2 tokens against 4
    feed.on_event(
        PairCompleted("r1", OLD, NEW, 0.0, (1, 2), (1, 2), 4, (5, 6), (7, 8, 9, 10), "length", "length",
                      live_logprob=-3.0, other_logprob=-8.0, live_under_other=-4.0, other_under_live=-10.0)
    )  # fmt: skip
    assert feed.score() == 1
    ((candidate, baseline, pairs, checks),) = evidence.comparisons()
    (divergence,) = [c for c in checks if c.name == "divergence"]
    assert (candidate, baseline, pairs) == (NEW, OLD, 1)
    # the canary's answer (4 tokens) read 2 nats worse, the stable's (2 tokens) 1 nat worse
    assert divergence.pairs == 1 and divergence.mean == 0.5 * (2.0 / 4 + 1.0 / 2)
    # a proxy pair has no log-probabilities: the check waits
    feed.on_event(TextPair("p", "a b", "a c", NEW, OLD, 2, 2, "stop", "stop"))
    assert feed.score() == 1
    ((_, _, pairs, checks),) = evidence.comparisons()
    assert pairs == 2 and [c.pairs for c in checks if c.name == "divergence"] == [1]


def test_the_always_valid_interval_ends_where_the_mixture_ratio_reaches_one_over_alpha() -> None:
    from infersight.alerts.release.sequential import msprt_lambda, msprt_radius

    for variance, tau, alpha in ((0.01, 0.2, 0.001), (0.0004, 0.05, 0.01), (0.5, 0.3, 0.05)):
        r = msprt_radius(variance, tau, alpha)
        assert math.isclose(msprt_lambda(r, variance, tau), 1.0 / alpha, rel_tol=1e-9)
        assert msprt_lambda(0.99 * r, variance, tau) < 1.0 / alpha


def test_a_faithful_release_is_cleared_on_divergence_and_a_terse_one_never_is() -> None:
    cleared_at = []
    for seed in range(20):
        rng = random.Random(seed)
        good, bad = PairedAnalysis(PairPolicy()), PairedAnalysis(PairPolicy())
        for n in range(1, 201):
            good.observe(_read_pair(rng, 0.003))
            bad.observe(_read_pair(rng, 0.4))
            (g,) = [c for c in good.checks() if c.name == "divergence"]
            if g.cleared and len(cleared_at) == seed:
                cleared_at.append(n)
        (g,) = [c for c in good.checks() if c.name == "divergence"]
        (b,) = [c for c in bad.checks() if c.name == "divergence"]
        assert g.cleared and not g.regressed
        assert b.regressed and not b.cleared
    assert max(cleared_at) <= 60, cleared_at


def test_a_canary_step_waits_until_divergence_is_decided_not_just_for_min_pairs() -> None:
    rng = random.Random(7)
    # a step needs only 5 canary requests: what holds it is the paired evidence
    analysis = CanaryAnalysis(CanaryPolicy(steps=(0.5, 1.0), requests_per_step=5), pairs=PairPolicy())
    for _ in range(20):
        analysis.observe(True, error_type=None, latency_s=0.1, output_tokens=8)
        analysis.observe(False, error_type=None, latency_s=0.1, output_tokens=8)
    for _ in range(PairPolicy().min_pairs):  # min_pairs of a borderline release: not decided yet
        analysis.observe_pair(_read_pair(rng, 0.05))
    verdict = analysis.verdict()
    assert verdict.action == "continue" and "divergence not decided after 10 pairs" in verdict.reason
    # the step is left once the cap of pairs is reached, whatever the check says by then
    capped = CanaryAnalysis(CanaryPolicy(steps=(0.5, 1.0), requests_per_step=5),
                            pairs=PairPolicy(max_pairs=12))  # fmt: skip
    for _ in range(20):
        capped.observe(True, error_type=None, latency_s=0.1, output_tokens=8)
        capped.observe(False, error_type=None, latency_s=0.1, output_tokens=8)
    for _ in range(12):
        capped.observe_pair(_read_pair(rng, 0.05))
    assert capped.verdict().action in ("promote", "rollback")


def test_a_canary_step_is_left_once_a_faithful_release_is_cleared() -> None:
    rng = random.Random(8)
    analysis = CanaryAnalysis(CanaryPolicy(steps=(0.5, 1.0), requests_per_step=5), pairs=PairPolicy())
    for _ in range(20):
        analysis.observe(True, error_type=None, latency_s=0.1, output_tokens=8)
        analysis.observe(False, error_type=None, latency_s=0.1, output_tokens=8)
    n = 0
    while analysis.verdict().action == "continue" and n < 100:
        analysis.observe_pair(_read_pair(rng, 0.002))
        n += 1
    verdict = analysis.verdict()
    assert verdict.action == "promote" and n < 100, (n, verdict.reason)


def test_post_deploy_holds_its_verdict_past_the_window_until_divergence_is_decided(tmp_path: Path) -> None:
    """A short window that ends with divergence undecided (a borderline release's first pairs)
    keeps the analysis running, saying why, instead of passing it; more pairs of a quietly
    worse release then fail it and roll it back. A faithful release passes at the window's end
    once cleared, and an undecided one passes after `max_hold_s`, saying it stayed undecided."""
    now = [1_000_000.0]
    evidence = PairedEvidence()
    analyzer = _analyzer(tmp_path, evidence, now)  # window 100 s, checks every 10 s, rollback after 2
    rng = random.Random(11)

    def state(analysis_id: int) -> tuple[str, dict[str, Any]]:
        with analyzer.engine.connect() as conn:
            row = conn.execute(select(deploy_analyses).where(deploy_analyses.c.id == analysis_id)).one()
        return row.state, json.loads(row.evidence)[-1]

    def ticks(runner: DeployAnalyzer, n: int) -> None:
        for _ in range(n):
            now[0] += 10.0
            runner.tick()

    def deployed(
        runner: DeployAnalyzer, version: str, worse_by: float, pairs: int, n: int
    ) -> tuple[str, dict[str, Any]]:
        """A deploy 100 s later, `pairs` pairs of it `worse_by` nats/token, `n` ticks: its state."""
        now[0] += 100.0
        analysis = runner.on_deploy(version, OLD, dt.datetime.fromtimestamp(now[0], dt.UTC))
        for _ in range(pairs):
            evidence.observe(dataclasses.replace(_read_pair(rng, worse_by), candidate=version))
        ticks(runner, n)
        return state(analysis)

    worse = analyzer.on_deploy(NEW, OLD, dt.datetime.fromtimestamp(now[0], dt.UTC))
    for _ in range(PairPolicy().min_pairs):  # a few pairs near the line: neither regressed nor cleared
        evidence.observe(_read_pair(rng, 0.05))
    ticks(analyzer, 11)
    held, last = state(worse)
    assert held == "running" and last["verdict"] == "passed"
    assert last["held"].startswith("divergence not decided after 10 pairs: held past the window")
    for _ in range(40):  # the release is worse than the line: more pairs show it
        evidence.observe(_read_pair(rng, 0.3))
    results = []
    while state(worse)[0] == "running" and len(results) < 10:
        now[0] += 10.0
        results += analyzer.tick()
    # the rollback was asked for (this test's runner has no deployer to carry it out)
    assert results[-1].verdict == "failed" and results[-1].rollback is not None
    assert state(worse)[0] not in ("running", "passed")
    assert any("nats/token" in f for f in results[-1].failures)

    # a faithful release: cleared within the window, passed at its end with nothing held
    passed, last = deployed(analyzer, "m_fp32-v1.2", 0.0, pairs=60, n=11)
    assert passed == "passed" and "held" not in last

    # undecided to the end of the hold: passed, saying so
    short = DeployAnalyzer(analyzer.engine, _Metrics(), analyzer.runner, clock=lambda: now[0], pairs=evidence,
                           policy=AnalysisPolicy(window_s=100.0, interval_s=10.0, max_failed_checks=2,
                                                 max_hold_s=50.0))  # fmt: skip
    ended, last = deployed(short, "m_fp32-v1.3", 0.05, pairs=12, n=17)
    assert ended == "passed" and last["held"] == "divergence still undecided after 12 pairs: passed"
