"""Each pair's answers read by both versions: the runtime sums the log-probability of every
token a pair's two sides sample, then reads each answer by the other version (one forward
pass each) in a step where no live request waits, and tells the four sums with the pair;
the divergence check (alerts/release/paired_checks.py) is built on them."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import _engine_serving_support as support
import pytest
import torch
from _engine_serving_support import V1, Recorder, perturbed_copy, prompt
from infersight.alerts.release.paired_checks import PairOutcome
from infersight.engine import MoEModel, load
from infersight.engine.events import PairCompleted
from infersight.engine.registry import Registry
from infersight.engine.runtime import Runtime
from infersight.engine.runtime_shadow import ShadowControl

tiny_checkpoints = support.tiny_checkpoints  # fixture

TWIN = "mixtral_tiny_fp32-v1.2"  # the very same weights as V1
NOISY = "mixtral_tiny_fp32-v1.3"  # V1 with noise on its output head


@pytest.fixture(scope="module")
def checkpoints(
    tiny_checkpoints: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Path]:
    g = torch.Generator().manual_seed(7)

    def noise(name: str, t: torch.Tensor) -> torch.Tensor:
        if name != "lm_head.weight":
            return t
        return t + torch.randn(t.shape, generator=g) * t.std()

    noisy = perturbed_copy(tiny_checkpoints[V1], tmp_path_factory.mktemp("noisy") / "v", noise)
    return {V1: tiny_checkpoints[V1], TWIN: tiny_checkpoints[V1], NOISY: noisy}


@pytest.fixture(scope="module")
def models(checkpoints: dict[str, Path]) -> dict[str, MoEModel]:
    return {name: load(path) for name, path in checkpoints.items()}


@pytest.fixture
def runtime(tmp_path: Path, checkpoints: dict[str, Path]) -> Iterator[Runtime]:
    registry = Registry(tmp_path / "registry")
    registry.register(V1, checkpoints[V1])
    registry.register(TWIN, checkpoints[TWIN], parent=V1)
    registry.register(NOISY, checkpoints[NOISY], parent=V1)
    rt = Runtime(registry, max_batch_size=4, max_prompt_tokens=32, max_seq_len=64)
    rt.start(V1)
    try:
        yield rt
    finally:
        rt.stop(drain=False)


def _read(model: MoEModel, prompt_ids: tuple[int, ...], answer: tuple[int, ...]) -> float:
    """The reference: `answer`'s log-probabilities after `prompt_ids` from the full-sequence logits."""
    ids = torch.tensor([[*prompt_ids, *answer]])
    lsm = torch.log_softmax(model.logits(ids)[0].double(), dim=-1)
    return sum(float(lsm[len(prompt_ids) - 1 + i, t]) for i, t in enumerate(answer))


def _pairs(recorder: Recorder, n: int, timeout: float = 60.0) -> list[PairCompleted]:
    return support.completed_pairs(recorder, n, timeout)


def _sampled_pairs(
    runtime: Runtime, candidate: str, n: int, *, own_prompts: bool = False
) -> list[PairCompleted]:
    """`own_prompts`: each version sees its own prompt (as a chat in two templates would)."""
    recorder = Recorder()
    runtime.subscribe(recorder)
    runtime.shadow.configure(share=1.0)
    runtime.canary.start(candidate, 0.5)
    for i in range(n):  # one at a time: its shadow is never dropped for want of room
        prompts = {V1: prompt(i, 6), candidate: prompt(100 + i, 9)} if own_prompts else None
        runtime.submit(
            prompt(i, 6), max_new_tokens=8, temperature=1.0, user=f"u{i}", prompts_by_version=prompts
        ).result(timeout=60)
    return _pairs(recorder, n)


def _divergence(pair: PairCompleted) -> float | None:
    outcome = PairOutcome(pair.live_version, pair.other_version, len(pair.live_tokens), len(pair.other_tokens),
                          pair.live_finish, pair.other_finish, candidate_logprob=pair.live_logprob,
                          baseline_logprob=pair.other_logprob, candidate_under_baseline=pair.live_under_other,
                          baseline_under_candidate=pair.other_under_live)  # fmt: skip
    return outcome.divergence()


def test_a_pair_carries_each_answer_read_by_its_own_and_the_other_version(
    runtime: Runtime, models: dict[str, MoEModel]
) -> None:
    pairs = _sampled_pairs(runtime, NOISY, 4, own_prompts=True)
    for pair in pairs:
        live, other = models[pair.live_version], models[pair.other_version]
        assert pair.prompt_ids != pair.other_prompt_ids
        # each version reads both answers after its own prompt
        mine, theirs = pair.prompt_ids, pair.other_prompt_ids
        want = {
            "live_logprob": _read(live, mine, pair.live_tokens),
            "other_logprob": _read(other, theirs, pair.other_tokens),
            "live_under_other": _read(other, theirs, pair.live_tokens),
            "other_under_live": _read(live, mine, pair.other_tokens),
        }
        for name, value in want.items():
            got = getattr(pair, name)
            assert got is not None and got == pytest.approx(value, rel=1e-4), name
    assert {p.live_version for p in pairs} | {p.other_version for p in pairs} == {V1, NOISY}
    assert runtime.shadow.stats().unread == 0


def test_two_identical_versions_diverge_by_nothing_and_a_perturbed_one_clearly(runtime: Runtime) -> None:
    same = [_divergence(p) for p in _sampled_pairs(runtime, TWIN, 4)]
    assert all(x is not None and abs(x) < 1e-4 for x in same), same
    runtime.canary.abort()
    noisy = [_divergence(p) for p in _sampled_pairs(runtime, NOISY, 4)[-4:]]
    assert all(x is not None for x in noisy)
    assert sum(x for x in noisy if x is not None) / len(noisy) > 0.2, noisy  # well over the 0.05 line


class _Watch:
    """The loop's idle work, watched: for each pair read, 1 if live requests waited then, else 0."""

    def __init__(self, runtime: Runtime, shadow: ShadowControl) -> None:
        self.state = runtime._state
        self.shadow = shadow
        self.waiting_at_jobs: list[int] = []

    def run_one(self, *, overdue_only: bool = False) -> bool:
        # the loop asks with overdue_only exactly when live requests wait (its own reading
        # of the queues, in the same step: a count taken here could race a new submit)
        did = self.shadow.run_one(overdue_only=overdue_only)
        if did:
            self.waiting_at_jobs.append(int(overdue_only))
        return did

    def give_up(self) -> None:
        self.shadow.give_up()


def _waves(runtime: Runtime) -> None:
    # 4 slots per replica and waves of 6: live requests wait while earlier pairs complete
    for wave in range(3):
        handles = [
            runtime.submit(prompt(i, 6), max_new_tokens=6, user=f"u{i}")
            for i in range(6 * wave, 6 * wave + 6)
        ]
        for h in handles:
            h.result(timeout=60)


def test_pairs_are_read_only_in_steps_where_no_live_request_waits(runtime: Runtime) -> None:
    runtime.shadow.overdue_s = 1e9  # never overdue: the idle steps alone read pairs
    watch = _Watch(runtime, runtime.shadow)
    runtime._state.idle_work = watch
    recorder = Recorder()
    runtime.subscribe(recorder)
    runtime.shadow.configure(share=1.0)
    runtime.canary.start(NOISY, 0.5)
    _waves(runtime)
    stats = runtime.shadow.stats()
    pairs = _pairs(recorder, stats.paired)
    assert watch.waiting_at_jobs and set(watch.waiting_at_jobs) == {0}
    scored = [p for p in pairs if p.live_under_other is not None]
    assert len(scored) == len(watch.waiting_at_jobs) and stats.unread == 0


def test_a_full_scoring_queue_tells_the_pair_without_the_cross_sums_and_counts_it(runtime: Runtime) -> None:
    runtime.shadow.max_scoring = 0  # no room: every pair goes out at once, unread
    pairs = _sampled_pairs(runtime, NOISY, 3)
    for pair in pairs:
        assert pair.live_logprob is not None and pair.other_logprob is not None  # free: summed as sampled
        assert pair.live_under_other is None and pair.other_under_live is None
        assert _divergence(pair) is None
    stats = runtime.shadow.stats()
    assert stats.unread == 3 and stats.completed == 3


class _Held:
    """The loop's idle work, held: pairs pile up unread until the test reads them itself."""

    def run_one(self, *, overdue_only: bool = False) -> bool:
        return False

    def give_up(self) -> None:
        pass


def test_a_busy_loop_reads_a_pair_only_once_it_is_overdue(runtime: Runtime) -> None:
    # while live requests keep waiting, the loop asks with overdue_only: a pair younger than
    # overdue_s stays queued, an older one is read (one a step), so a steadily busy service
    # still tells its pairs with their cross sums
    shadow = runtime.shadow
    runtime._state.idle_work = _Held()
    recorder = Recorder()
    runtime.subscribe(recorder)
    shadow.configure(share=1.0)
    runtime.canary.start(NOISY, 0.5)
    for h in [runtime.submit(prompt(i, 6), max_new_tokens=6, user=f"u{i}") for i in range(2)]:
        h.result(timeout=60)
    deadline = time.monotonic() + 30
    while len(shadow._scoring) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(shadow._scoring) == 2
    shadow.overdue_s = 1e9
    assert shadow.run_one(overdue_only=True) is False and len(shadow._scoring) == 2
    shadow.overdue_s = 0.0
    assert shadow.run_one(overdue_only=True) is True and len(shadow._scoring) == 1
    assert shadow.run_one() is True and not shadow._scoring
    runtime._state.wake.set()
    pairs = _pairs(recorder, 2)
    assert all(p.live_under_other is not None for p in pairs) and shadow.stats().unread == 0


def test_a_pair_not_read_within_read_wait_s_is_told_without_the_cross_sums(runtime: Runtime) -> None:
    shadow = runtime.shadow
    runtime._state.idle_work = _Held()
    recorder = Recorder()
    runtime.subscribe(recorder)
    shadow.configure(share=1.0)
    shadow.read_wait_s = 0.0  # any wait is too long
    runtime.canary.start(NOISY, 0.5)
    for h in [runtime.submit(prompt(i, 6), max_new_tokens=6, user=f"u{i}") for i in range(2)]:
        h.result(timeout=60)
    deadline = time.monotonic() + 30
    while shadow.stats().completed < 2 and time.monotonic() < deadline:  # both sides of both pairs done
        time.sleep(0.01)
    time.sleep(0.01)
    shadow.run_one()  # finds what is still queued stale: told as it is
    runtime._state.wake.set()
    pairs = _pairs(recorder, 2)
    assert all(p.live_under_other is None and p.live_logprob is not None for p in pairs)
    assert shadow.stats().unread == 2
