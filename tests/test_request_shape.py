"""Each request's shape (max_tokens, stream flag, finish reason) is stored, and the release
checks compare server errors only within requests of the same shape: a client that moves its
long, streamed requests (whose base error rate is higher) to the new version does not make
a good release look worse, while an unstratified comparison of the same traffic would."""

from __future__ import annotations

import dataclasses
import datetime as dt
import threading
from typing import Any

import pytest
from _store_helpers import database_url
from infersight.alerts.release.canary import CanaryAnalysis, CanaryController, CanaryPolicy
from infersight.alerts.release.post_deploy import AnalysisPolicy, StoreVersionMetrics, _compare
from infersight.engine.events import RequestFailed, RequestFinished
from infersight.monitor.records import InferenceRecord, from_json_many
from infersight.monitor.store.database import connect, upgrade
from infersight.monitor.store.tables import requests
from infersight.monitor.store.writer import RequestWriter
from sqlalchemy import select

T0 = 1_800_000_000.0


def _event(i: int, **changes: Any) -> dict[str, Any]:
    event: dict[str, Any] = {
        "request_id": f"r-{i}", "model": "m", "model_version": "v1", "started_at": T0 + i,
        "duration_s": 0.5, "prompt_tokens": 12, "output_tokens": 40, "source": "sdk",
    }  # fmt: skip
    event.update(changes)
    return event


@pytest.fixture(params=["sqlite", "postgres"])
def db_url(request: pytest.FixtureRequest, tmp_path: Any) -> str:
    return database_url(request, tmp_path)


def test_the_shape_fields_round_trip_through_ingest_validation_and_the_writer(db_url: str) -> None:
    engine = connect(db_url)
    upgrade(engine)
    events = [
        _event(0, max_tokens=64, stream=True, finish_reason="length"),
        _event(1, max_tokens=1, stream=False, finish_reason="content_filter"),
        _event(2),  # all three optional: stored as NULL
        _event(3, max_tokens=0),
        _event(4, max_tokens=2.5),
        _event(5, stream="yes"),
        _event(6, finish_reason="ran_out_of_ideas"),
        _event(7, max_tokens=True),
    ]
    records, refused = from_json_many(events)
    assert [(i, e.field) for i, e in refused] == [
        (3, "max_tokens"), (4, "max_tokens"), (5, "stream"), (6, "finish_reason"), (7, "max_tokens"),
    ]  # fmt: skip
    # the batch path and the one-at-a-time path agree
    assert records == [InferenceRecord.from_json(e) for e in events[:3]]
    writer = RequestWriter(engine)
    try:
        assert writer.submit(records).result(30) == 3
    finally:
        writer.close()
    with engine.connect() as conn:
        rows = conn.execute(
            select(requests.c.request_id, requests.c.max_tokens, requests.c.stream, requests.c.finish_reason)
            .order_by(requests.c.request_id)
        ).all()  # fmt: skip
    engine.dispose()
    assert [tuple(r) for r in rows] == [
        ("r-0", 64, True, "length"), ("r-1", 1, False, "content_filter"), ("r-2", None, None, None),
    ]  # fmt: skip


# Two shapes with different base error rates; both versions are equally good within each.
SHORT = {"max_tokens": 8, "stream": False}  # 2% server errors
LONG = {"max_tokens": 512, "stream": True}  # 20% server errors


def _traffic(n_short: int, n_long: int, *, long_every: int = 5) -> list[tuple[dict[str, Any], bool]]:
    """(shape, failed) per request, errors spread evenly in each stratum: 1 in 50 short
    requests and 1 in `long_every` long ones."""
    short = [(SHORT, i % 50 == 0) for i in range(n_short)]
    long_ = [(LONG, i % long_every == 0) for i in range(n_long)]
    return short + long_


def _store(engine: Any, version: str, traffic: list[tuple[dict[str, Any], bool]], start: float) -> None:
    records = [
        InferenceRecord(
            f"{version}-{i}",
            "m",
            version,
            start + i * 0.01,
            0.2,
            prompt_tokens=10,
            output_tokens=None if failed else 5,
            error_type="GenerationFailed" if failed else None,
            source="engine",
            max_tokens=shape["max_tokens"],
            stream=shape["stream"],
            finish_reason="error" if failed else "stop",
        )
        for i, (shape, failed) in enumerate(traffic)
    ]
    writer = RequestWriter(engine)
    try:
        writer.submit(records).result(30)
    finally:
        writer.close()


def test_post_deploy_error_rate_compares_within_shapes_so_a_change_of_mix_does_not_fail_it(
    tmp_path: Any,
) -> None:
    engine = connect(f"sqlite:///{tmp_path}/shape.sqlite")
    upgrade(engine)
    deployed = T0 + 1000
    _store(engine, "old", _traffic(400, 100), T0)  # before: mostly short requests
    _store(engine, "good", _traffic(100, 400), deployed)  # after: clients moved to long, streamed ones
    _store(engine, "bad", _traffic(100, 400, long_every=2), deployed)  # long ones fail 50%, not 20%
    metrics = StoreVersionMetrics(engine)
    at = dt.datetime.fromtimestamp(deployed, dt.UTC)
    old = metrics.stats("old", at - dt.timedelta(seconds=1800), at)
    good = metrics.stats("good", at, at + dt.timedelta(seconds=60))
    bad = metrics.stats("bad", at, at + dt.timedelta(seconds=60))
    engine.dispose()
    policy = AnalysisPolicy()
    assert (old.error_rate, good.error_rate) == (pytest.approx(28 / 500), pytest.approx(82 / 500))
    assert _compare(policy, good, old, None) == ()  # the same within each shape: passes
    # the same figures compared unstratified (as before shapes were stored) fail it
    unstratified = [dataclasses.replace(s, errors_by_shape=()) for s in (good, old)]
    [failed] = _compare(policy, *unstratified, None)
    assert failed.check == "error_rate" and failed.value == pytest.approx(82 / 500)
    # a release worse within a shape still fails, with the standardised figures
    [failed] = _compare(policy, bad, old, None)
    assert failed.check == "error_rate" and "same shape (2 of 2 shapes)" in failed.text
    assert failed.value > failed.limit


def _canary(stratified: bool) -> CanaryAnalysis:
    """A canary as good as the stable, asked mostly for long, streamed answers by its clients."""
    analysis = CanaryAnalysis(CanaryPolicy(requests_per_step=10_000))
    canary, stable = _traffic(100, 400), _traffic(400, 100)
    for (c_shape, c_failed), (s_shape, s_failed) in zip(canary[::-1], stable, strict=True):  # interleaved
        for arm, shape, failed in ((True, c_shape, c_failed), (False, s_shape, s_failed)):
            asked = shape if stratified else {"max_tokens": None, "stream": None}
            analysis.observe(arm, error_type="GenerationFailed" if failed else None, latency_s=None, **asked)
    return analysis


def test_canary_server_errors_compare_within_shapes_so_arm_steering_does_not_roll_back() -> None:
    stratified = _canary(stratified=True)
    errors = stratified.checks()[0]
    assert errors.name == "server_errors" and (errors.canary_n, errors.stable_n) == (500, 500)
    assert not errors.regressed and stratified.verdict().action == "continue"
    # the same requests without their shapes: the canary's raw error rate is three times the stable's
    unstratified = _canary(stratified=False)
    verdict = unstratified.verdict()
    assert verdict.action == "rollback" and "server_errors" in verdict.reason


class _Control:
    """Stands in for `Runtime.canary` (the real one: test_engine_canary.py): records aborts."""

    def __init__(self) -> None:
        self.aborted = threading.Event()

    class status:  # the shape of CanaryStatus the controller reads
        version = "v-new"

    def set_weight(self, weight: float) -> None: ...

    def promote(self, message: str = "") -> None: ...

    def abort(self, message: str = "") -> None:
        self.aborted.set()


def _steered_canary(note_shapes: bool) -> tuple[CanaryController, _Control]:
    """The engine's own events for a canary its clients send long, streamed requests (the
    stable: short ones); with `note_shapes` the backend told the controller each shape."""
    control = _Control()
    controller = CanaryController(control, CanaryPolicy(requests_per_step=10_000))
    controller.begin("v-new", "v-old", 0.5)
    canary, stable = _traffic(100, 400), _traffic(400, 100)
    for i, ((c_shape, c_failed), (s_shape, s_failed)) in enumerate(zip(canary[::-1], stable, strict=True)):
        for version, shape, failed in (("v-new", c_shape, c_failed), ("v-old", s_shape, s_failed)):
            rid = f"{version}-{i}"
            if note_shapes:
                controller.note_shape(rid, shape["max_tokens"], shape["stream"])
            if failed:
                controller.on_event(RequestFailed(rid, version, 0.0, "GenerationFailed", "boom"))
            else:
                controller.on_event(RequestFinished(rid, version, 0.0, 10, 5, 0.0, 0.01, 0.2, "stop"))
    return controller, control


def test_the_canary_controller_stratifies_by_the_shapes_the_backend_notes() -> None:
    controller, control = _steered_canary(note_shapes=True)
    assert controller.analysis is not None and controller.analysis.verdict().action == "continue"
    assert not control.aborted.is_set() and controller._shapes == {}  # every noted shape was used
    controller, control = _steered_canary(note_shapes=False)  # shapes unknown: one stratum
    assert control.aborted.wait(30)  # the unstratified comparison rolls the good canary back
