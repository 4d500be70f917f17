"""EngineAdapter: the embedded runtime's events become statistics and InferenceRecords."""

from __future__ import annotations

import subprocess
import sys

import pytest
from infersight.collectors import EngineAdapter, InferenceStats
from infersight.engine.events import (
    DeployFailed,
    RequestFailed,
    RequestFinished,
    RequestQueued,
    RequestStarted,
    TokenEmitted,
    VersionDeployed,
)
from infersight.monitor.records import InferenceRecord


def _stream(adapter: EngineAdapter, rid: str, *, tokens: list[float], queue_s: float = 0.05) -> None:
    t0 = 1_700_000_000.0
    adapter(RequestQueued(rid, "v1", t0, prompt_tokens=12, priority=0))
    adapter(RequestStarted(rid, "v1", t0 + queue_s, queue_s=queue_s))
    for i, since in enumerate(tokens):
        adapter(TokenEmitted(rid, "v1", t0 + since, index=i, token_id=7, since_start_s=since))


def test_finished_request_gives_ttft_from_first_token_and_tpot_from_token_spacing() -> None:
    stats = InferenceStats()
    records: list[InferenceRecord] = []
    adapter = EngineAdapter(stats, model="mixtral", on_record=records.append)
    _stream(adapter, "r1", tokens=[0.2, 0.25, 0.30, 0.35])
    assert stats.in_flight() == 1 and stats.waiting() == 0
    adapter(
        RequestFinished(
            "r1", "v1", 1_700_000_000.4, prompt_tokens=12, output_tokens=4, queue_s=0.05,
            ttft_s=0.2, duration_s=0.4, finish_reason="stop",
        )
    )  # fmt: skip
    (record,) = records
    assert record.source == "engine" and record.model == "mixtral" and record.model_version == "v1"
    assert record.ttft_s == pytest.approx(0.2) and record.tpot_s == pytest.approx(0.05)
    assert record.queue_s == 0.05 and (record.prompt_tokens, record.output_tokens) == (12, 4)
    assert InferenceRecord.from_json(record.to_json()) == record  # valid on the wire
    assert stats.in_flight() == 0
    assert stats.quantile("ttft", 0.5, 60) == pytest.approx(0.2, rel=0.01)
    assert stats.quantile("queue_time", 0.5, 60) == pytest.approx(0.05, rel=0.01)


def test_queued_requests_count_as_waiting_until_started() -> None:
    stats = InferenceStats()
    adapter = EngineAdapter(stats, model="m")
    for i in range(3):
        adapter(RequestQueued(f"r{i}", "v1", 1.0, prompt_tokens=3, priority=0))
    assert stats.waiting(model="m", model_version="v1") == 3
    adapter(RequestStarted("r0", "v1", 1.1, queue_s=0.1))
    assert stats.waiting() == 2 and stats.in_flight() == 1


def test_failed_request_is_an_error_by_type_and_leaves_the_queue() -> None:
    stats = InferenceStats()
    records: list[InferenceRecord] = []
    adapter = EngineAdapter(stats, model="m", on_record=records.append)
    adapter(RequestQueued("r1", "v1", 10.0, prompt_tokens=50, priority=0))
    adapter(RequestFailed("r1", "v1", 10.5, error_type="GenerationFailed", message="non-finite logits"))
    assert records[0].error_type == "GenerationFailed" and records[0].duration_s == pytest.approx(0.5)
    assert stats.waiting() == 0 and stats.count(60, errors_only=True) == 1


def test_refused_and_hung_up_requests_are_the_clients_outcomes_not_server_errors() -> None:
    stats = InferenceStats()
    records: list[InferenceRecord] = []
    adapter = EngineAdapter(stats, model="m", on_record=records.append)
    adapter(RequestFailed("long", "v1", 10.0, error_type="PromptTooLong", message="5000 > 1024"))
    adapter(RequestQueued("gone", "v1", 10.0, prompt_tokens=5, priority=0))
    adapter(RequestStarted("gone", "v1", 10.1, queue_s=0.1))
    adapter.hung_up("gone")
    adapter(RequestFinished("gone", "v1", 10.15, 5, 1, 0.1, 0.02, 0.15, "cancelled"))
    adapter(
        RequestFinished("stop", "v1", 10.2, 5, 3, 0.0, 0.02, 0.2, "cancelled")
    )  # a stop string, not a hang-up
    assert [r.error_type for r in records] == ["client_error", "cancelled", None]
    assert stats.count(60) == 3 and stats.count(60, errors_only=True) == 0
    assert stats.count(60, outcome="client_error") == 1 and stats.count(60, outcome="cancelled") == 1
    assert stats.client_outcome_counts() == {"client_error": 1, "cancelled": 1} and stats.error_counts() == {}
    assert stats.in_flight() == 0


def test_unknown_or_malformed_events_never_raise_into_the_engine() -> None:
    adapter = EngineAdapter(InferenceStats(), model="m")
    adapter(VersionDeployed(None, "v1", 1.0, reason="start"))
    adapter(DeployFailed("v2", "v1", 2.0, reason="bad checksum"))
    adapter(object())  # type: ignore[arg-type]
    adapter(RequestFinished("x", "", 1.0, 1, 1, 0.0, None, 1.0, "stop"))  # empty version: invalid label
    assert adapter.failures == 1


def test_tracked_requests_are_bounded() -> None:
    stats = InferenceStats()
    adapter = EngineAdapter(stats, model="m", max_tracked=10)
    for i in range(25):
        adapter(RequestQueued(f"r{i}", "v1", 1.0, prompt_tokens=1, priority=0))
    assert adapter.evicted == 15 and stats.waiting() == 10


def test_observing_the_engine_does_not_import_torch() -> None:
    code = (
        "import sys; from infersight.collectors import EngineAdapter, InferenceStats; "
        "EngineAdapter(InferenceStats(), model='m'); print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
