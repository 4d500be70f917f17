"""Hot deploys on a real tiny Mixtral: validation, swap between steps, drain, rollback, load."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import _engine_serving_support as support
import pytest
import torch
from _engine_serving_support import V1, V2, Recorder, perturbed_copy, prompt
from infersight.engine.errors import (
    CheckpointRejected,
    ChecksumMismatch,
    DeployRefused,
    NonFiniteWeights,
    NoPreviousVersion,
    WarmupFailed,
)
from infersight.engine.events import DeployFailed, VersionDeployed
from infersight.engine.registry import Registry
from infersight.engine.requests import Completion
from infersight.engine.runtime import Runtime

Greedy = Callable[[str, list[int], int], list[int]]
tiny_checkpoints, registry, greedy, runtime = (
    support.tiny_checkpoints,
    support.registry,
    support.greedy,
    support.runtime,
)  # fixtures


def _wait_for(predicate: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_deploy_swaps_versions_and_in_flight_requests_finish_on_their_own(
    runtime: Runtime, greedy: Greedy
) -> None:
    events = Recorder()
    runtime.subscribe(events)
    old_prompt, new_prompt = prompt(40, 6), prompt(41, 6)
    in_flight = runtime.submit(old_prompt, max_new_tokens=50)
    stream = iter(in_flight)
    next(stream)
    outcome = runtime.deploy(V2)
    assert (outcome.from_version, outcome.to_version, outcome.reason) == (V1, V2, "deploy")
    assert runtime.serving_version == V2
    fresh = runtime.submit(new_prompt, max_new_tokens=8)
    assert runtime.draining_versions in ([V1], [])  # the old replica drains in parallel
    old_done, new_done = in_flight.result(timeout=60), fresh.result(timeout=60)
    assert old_done.model_version == V1 and old_done.token_ids == tuple(greedy(V1, old_prompt, 50))
    assert new_done.model_version == V2 and new_done.token_ids == tuple(greedy(V2, new_prompt, 8))
    assert greedy(V1, new_prompt, 8) != greedy(V2, new_prompt, 8)  # the two versions differ
    _wait_for(lambda: not runtime.draining_versions)
    _wait_for(lambda: bool(events.of(VersionDeployed)))
    deployed = events.of(VersionDeployed)[-1]
    assert (deployed.from_version, deployed.to_version, deployed.reason) == (V1, V2, "deploy")
    last = runtime.history()[-1]
    assert (last.from_version, last.to_version, last.outcome) == (V1, V2, "deployed")


def test_checksum_mismatch_refuses_the_deploy_and_keeps_serving(
    tmp_path: Path, registry: Registry, tiny_checkpoints: dict[str, Path], greedy: Greedy
) -> None:
    ckpt = perturbed_copy(tiny_checkpoints[V1], tmp_path / "tampered", lambda n, t: t)
    bad = "mixtral_tiny_fp32-v2.0"
    registry.register(bad, ckpt)
    data = bytearray((ckpt / "model.safetensors").read_bytes())
    data[-4:] = b"\x00\x00\xc0\x7f"  # the last float becomes NaN after registration
    (ckpt / "model.safetensors").write_bytes(bytes(data))
    _assert_refused_and_serving(registry, bad, ChecksumMismatch, "sha256", greedy)


def test_nan_weights_refuse_the_deploy_and_keep_serving(
    tmp_path: Path, registry: Registry, tiny_checkpoints: dict[str, Path], greedy: Greedy
) -> None:
    def poison(name: str, t: torch.Tensor) -> torch.Tensor:
        if name.endswith("layers.1.self_attn.o_proj.weight"):
            t = t.clone()
            t[0, 0] = float("nan")
        return t

    bad = "mixtral_tiny_fp32-v2.1"
    registry.register(bad, perturbed_copy(tiny_checkpoints[V1], tmp_path / "nan", poison))
    error = _assert_refused_and_serving(registry, bad, CheckpointRejected, "NaN", greedy)
    assert isinstance(error.__cause__, NonFiniteWeights)


def test_finite_weights_with_overflowing_logits_fail_the_warm_up(
    tmp_path: Path, registry: Registry, tiny_checkpoints: dict[str, Path], greedy: Greedy
) -> None:
    def overflow(name: str, t: torch.Tensor) -> torch.Tensor:
        big = name in ("lm_head.weight", "model.norm.weight")
        return t * 1e20 if big else t  # every weight finite, but 1e20 * 1e20 overflows fp32

    bad = "mixtral_tiny_fp32-v2.2"
    registry.register(bad, perturbed_copy(tiny_checkpoints[V1], tmp_path / "inf", overflow))
    _assert_refused_and_serving(registry, bad, WarmupFailed, "non-finite logits", greedy)


def test_unknown_version_is_refused_and_keeps_serving(registry: Registry, greedy: Greedy) -> None:
    _assert_refused_and_serving(registry, "mixtral_tiny_fp32-v9.9", DeployRefused, "no version", greedy)


def _assert_refused_and_serving(
    registry: Registry, version: str, kind: type[DeployRefused], why: str, greedy: Greedy
) -> DeployRefused:
    rt = Runtime(registry, max_batch_size=2, max_prompt_tokens=32, max_seq_len=64)
    events = Recorder()
    rt.subscribe(events)
    rt.start(V1)
    try:
        p = prompt(42, 5)
        during = rt.submit(p, max_new_tokens=30)
        with pytest.raises(kind, match=why) as info:
            rt.deploy(version)
        assert rt.serving_version == V1
        assert during.result(timeout=60).token_ids == tuple(greedy(V1, p, 30))
        assert rt.submit(p, max_new_tokens=3).result(timeout=60).model_version == V1
        _wait_for(lambda: bool(events.of(DeployFailed)))
    finally:
        rt.stop(drain=False)
    failed = events.of(DeployFailed)[0]
    assert failed.version == version and failed.serving_version == V1 and why in failed.reason
    record = registry.history.records()[-1]
    assert (record.to_version, record.outcome) == (version, "refused") and why in record.message
    assert registry.history.last_good() == V1
    return info.value


def test_rollback_returns_to_the_previous_good_version_and_a_restart_remembers(
    registry: Registry, greedy: Greedy
) -> None:
    rt = Runtime(registry, max_batch_size=2, max_prompt_tokens=32, max_seq_len=64)
    events = Recorder()
    rt.subscribe(events)
    rt.start(V1)
    try:
        with pytest.raises(NoPreviousVersion):
            rt.rollback()
        rt.deploy(V2)
        assert registry.history.previous_good() == V1
        outcome = rt.rollback()
        assert (outcome.from_version, outcome.to_version, outcome.reason) == (V2, V1, "rollback")
        p = prompt(43, 5)
        assert rt.submit(p, max_new_tokens=5).result(timeout=60).token_ids == tuple(greedy(V1, p, 5))
        rt.failover(V2)
        _wait_for(lambda: len(events.of(VersionDeployed)) == 4)
    finally:
        rt.stop()
    reasons = [(e.from_version, e.to_version, e.reason) for e in events.of(VersionDeployed)]
    assert reasons == [(None, V1, "start"), (V1, V2, "deploy"), (V2, V1, "rollback"), (V1, V2, "failover")]
    restarted = Runtime(registry, max_batch_size=2, max_prompt_tokens=32, max_seq_len=64)
    restarted.start()  # no version given: the last good one of the persisted history
    try:
        assert restarted.serving_version == V2
        assert restarted.rollback().to_version == V1
    finally:
        restarted.stop()


def test_deploy_and_rollback_under_concurrent_load_drop_no_request(
    registry: Registry, greedy: Greedy
) -> None:
    rt = Runtime(registry, max_batch_size=4, max_prompt_tokens=32, max_seq_len=64)
    rt.start(V1)
    results: list[tuple[list[int], int, Completion]] = []
    errors: list[BaseException] = []
    stop = threading.Event()
    lock = threading.Lock()

    def client(worker: int) -> None:  # until told to stop: a slow deploy never outlasts the load
        i = 0
        while not stop.is_set():
            p, n = prompt(100 + 3 * worker + i % 3, 3 + (i % 4)), 4 + (i % 3)
            try:
                done = rt.submit(p, max_new_tokens=n, priority=i % 3).result(timeout=120)
            except BaseException as exc:
                with lock:
                    errors.append(exc)
                return
            with lock:
                results.append((p, n, done))
            i += 1

    threads = [threading.Thread(target=client, args=(w,)) for w in range(4)]
    try:
        for t in threads:
            t.start()
        # phases by counted results (the timeouts only end a run that is stuck)
        _wait_for(lambda: len(results) >= 6, timeout=300)
        rt.deploy(V2)
        _wait_for(lambda: sum(r[2].model_version == V2 for r in results) >= 6, timeout=300)
        rt.rollback()
        count = len(results)
        _wait_for(lambda: sum(r[2].model_version == V1 for r in results[count:]) >= 6, timeout=300)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=120)
        rt.stop()
    assert not errors
    assert len(results) >= 18
    versions = [done.model_version for _, _, done in results]
    assert V2 in versions[:count] and V1 in versions[count:]  # served on both sides of each swap
    assert V1 in versions[:6]
    expected: dict[tuple[str, tuple[int, ...], int], tuple[int, ...]] = {}
    for p, n, done in results:  # every request completed whole, on one version, exactly
        key = (done.model_version, tuple(p), n)
        if key not in expected:
            expected[key] = tuple(greedy(done.model_version, p, n))
        assert done.finish_reason == "length"
        assert done.token_ids == expected[key]
