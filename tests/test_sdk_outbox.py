"""Sampled records: the bounded queue, delivery, payload checks, bad input, exit and fork."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from infersight.monitor.records import InferenceRecord
from infersight.monitor.sdk import Monitor


def _answer(monitor: Monitor, **track: Any) -> Any:
    @monitor.track(model="m", model_version="v1", **track)
    def answer(prompt: Any) -> Any:
        return f"re: {prompt}"

    return answer


def test_sampled_calls_reach_the_sink_in_batches_as_valid_records() -> None:
    batches: list[list[InferenceRecord]] = []
    monitor = Monitor(sink=lambda records: batches.append(list(records)), sample_rate=1.0, batch_size=10)
    answer = _answer(monitor)
    for i in range(25):
        answer(f"q{i}")
    assert monitor.flush(5)
    records = [r for b in batches for r in b]
    assert [r.prompt for r in records] == [f"q{i}" for i in range(25)]
    assert all(len(b) <= 10 for b in batches)
    assert len({r.request_id for r in records}) == 25
    for r in records:
        assert InferenceRecord.from_json(json.loads(json.dumps(r.to_json()))) == r
        assert r.source == "sdk" and r.response == f"re: {r.prompt}" and abs(r.started_at - time.time()) < 60
    assert monitor.counters.sent_total() == 25


def test_sample_rate_picks_about_that_fraction_and_zero_sends_nothing() -> None:
    got: list[InferenceRecord] = []
    monitor = Monitor(sink=got.extend, sample_rate=0.25)
    answer = _answer(monitor)
    for i in range(800):
        answer(str(i))
    monitor.flush(5)
    assert 120 <= len(got) <= 280  # binomial(800, 0.25): mean 200, sd 12
    none = _answer(monitor, sample_rate=0.0)
    got.clear()
    none("x")
    monitor.flush(5)
    assert got == [] and monitor.stats.count(60) == 801


def test_full_queue_drops_and_counts_and_never_blocks_the_caller() -> None:
    release = threading.Event()
    monitor = Monitor(sink=lambda records: release.wait(10), sample_rate=1.0, queue_size=50, batch_size=10)
    answer = _answer(monitor)
    slowest = 0.0
    for i in range(500):
        t0 = time.perf_counter()
        assert answer(i) == f"re: {i}"
        slowest = max(slowest, time.perf_counter() - t0)
    assert slowest < 5.0  # a stalled sink (10 s) never stalls the call; 5 s holds on a loaded machine
    dropped = monitor.counters.value("dropped", "queue_full")
    assert 500 - 50 - 10 <= dropped <= 500 - 50  # one batch may be in the sink's hands
    assert monitor.stats.count(60) == 500  # statistics are never dropped
    release.set()
    assert monitor.flush(5)


def test_failing_sink_is_counted_as_dropped_not_raised() -> None:
    def sink(records: Any) -> None:
        raise ConnectionError("down")

    monitor = Monitor(sink=sink, sample_rate=1.0)
    _answer(monitor)("x")
    assert monitor.flush(5)
    assert monitor.counters.value("dropped", "sink_error") == 1


def test_redaction_runs_before_text_leaves_and_a_failing_redactor_sends_no_text() -> None:
    got: list[InferenceRecord] = []
    monitor = Monitor(sink=got.extend, sample_rate=1.0, redact=lambda t: t.replace("4111", "****"))
    _answer(monitor)("card 4111 stolen")
    monitor.flush(5)
    assert got[0].prompt == "card **** stolen" and got[0].response == "re: card **** stolen"

    def broken(text: str) -> str:
        raise ValueError("regex bug")

    monitor.configure(redact=broken)
    got.clear()
    _answer(monitor)("card 4111")
    monitor.flush(5)
    assert got[0].prompt is None and got[0].response is None
    assert monitor.counters.value("rejected", "redaction_failed") == 2


def test_long_text_is_truncated_and_huge_text_rejected_both_counted() -> None:
    got: list[InferenceRecord] = []
    monitor = Monitor(sink=got.extend, sample_rate=1.0, max_text_chars=100, max_payload_chars=10_000)
    answer = _answer(monitor, extract_response=lambda result: "ok")
    answer("x" * 5_000)
    answer("y" * 50_000)
    monitor.flush(5)
    assert got[0].prompt == "x" * 100 and got[1].prompt is None
    assert got[1].duration_s >= 0 and got[1].response == "ok"  # the record survives without its text
    assert monitor.counters.value("truncated", "prompt") == 1
    assert monitor.counters.value("rejected", "payload_too_large") == 1


def test_non_string_payload_is_rejected_and_counted() -> None:
    got: list[InferenceRecord] = []
    monitor = Monitor(sink=got.extend, sample_rate=1.0)
    answer = _answer(monitor, extract_prompt=lambda args, kwargs: {"messages": args[0]})
    assert answer(["hi"]) == "re: ['hi']"
    monitor.flush(5)
    assert got[0].prompt is None and got[0].response == "re: ['hi']"
    assert monitor.counters.value("rejected", "non_string_payload") == 1


@pytest.mark.parametrize(
    ("value", "reason"),
    [(float("nan"), "nan_duration"), (-0.5, "negative_duration"), ("slow", "invalid_number")],
)
def test_manual_api_rejects_bad_durations_clearly_and_counts_them(value: Any, reason: str) -> None:
    monitor = Monitor()
    assert monitor.record(model="m", duration_s=value) is False
    assert monitor.record(model="m", duration_s=1.0, ttft_s=value) is False
    assert monitor.counters.value("rejected", reason) == 2
    assert monitor.record(model="m", duration_s=1.0, ttft_s=0.1, output_tokens=3) is True
    assert monitor.stats.count(60) == 1


def test_manual_api_samples_records_with_text() -> None:
    got: list[InferenceRecord] = []
    monitor = Monitor(sink=got.extend, sample_rate=1.0)
    assert monitor.record(model="m", duration_s=0.2, prompt="p", response=b"bytes")
    monitor.flush(5)
    assert (got[0].prompt, got[0].response, got[0].duration_s) == ("p", None, 0.2)
    assert monitor.counters.value("rejected", "non_string_payload") == 1


def _run(code: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )


def test_pending_records_are_flushed_at_interpreter_exit(tmp_path: Path) -> None:
    out = _run(
        """
        import json
        from infersight.monitor import configure, track
        def sink(records):
            with open("delivered.jsonl", "a") as f:
                for r in records:
                    f.write(json.dumps(r.to_json()) + "\\n")
        configure(sink=sink, sample_rate=1.0, flush_interval_s=3600)

        @track(model="m")
        def answer(prompt):
            return prompt

        for i in range(7):
            answer(f"q{i}")
        """,
        tmp_path,
    )
    assert out.returncode == 0, out.stderr
    lines = (tmp_path / "delivered.jsonl").read_text().splitlines()
    assert [json.loads(line)["prompt"] for line in lines] == [f"q{i}" for i in range(7)]


def test_a_forked_child_delivers_its_own_records_and_not_the_parents(tmp_path: Path) -> None:
    out = _run(
        """
        import json, os, threading
        from infersight.monitor.sdk import Monitor
        release = threading.Event()
        def sink(records):
            release.wait(1)
            with open(f"delivered-{os.getpid()}.jsonl", "a") as f:
                for r in records:
                    f.write(r.prompt + "\\n")
        monitor = Monitor(sink=sink, sample_rate=1.0)
        answer = monitor.track(model="m")(lambda prompt: prompt)
        answer("parent-1")
        with monitor.stats.series("m", "unknown")._lock:   # a lock held across fork
            pid = os.fork()
            if pid == 0:
                pass
        if pid == 0:
            answer("child-1")
            answer("child-2")
            ok = monitor.flush(5)
            os._exit(0 if ok and monitor.stats.count(60) >= 2 else 3)
        _, status = os.waitpid(pid, 0)
        release.set()
        monitor.flush(5)
        print(pid, os.getpid(), os.waitstatus_to_exitcode(status))
        """,
        tmp_path,
    )
    assert out.returncode == 0, out.stderr
    child, parent, code = map(int, out.stdout.split())
    assert code == 0
    assert (tmp_path / f"delivered-{child}.jsonl").read_text().split() == ["child-1", "child-2"]
    assert (tmp_path / f"delivered-{parent}.jsonl").read_text().split() == ["parent-1"]
