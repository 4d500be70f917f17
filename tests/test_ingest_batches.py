"""Ingest's batch paths give what the one-at-a-time paths give: the records validated and
refused (`from_json_many`), the statistics (`observe_many`) and the rows stored (SQLite
timestamps as `datetime` formats them, NUL replaced)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
import random
from typing import Any

import pytest
from _store_helpers import database_url
from infersight.collectors import InferenceStats, InvalidObservation
from infersight.monitor.records import InferenceRecord, InvalidRecord, from_json_many
from infersight.monitor.store.database import connect, upgrade
from infersight.monitor.store.tables import by_start, requests, started_in, time_bucket
from infersight.monitor.store.writer import COLUMNS, RequestWriter, _postgres_rows, _sqlite_rows
from prometheus_client import CollectorRegistry, generate_latest
from sqlalchemy import select


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class Label(str):
    pass


def _event(**changes: Any) -> dict[str, Any]:
    event: dict[str, Any] = {
        "request_id": "r-1", "model": "m", "model_version": "v1", "started_at": 1_700_000_000.25,
        "duration_s": 0.5, "ttft_s": 0.1, "tpot_s": 0.01, "queue_s": None, "prompt_tokens": 12,
        "output_tokens": 40, "error_type": None, "prompt": "hi", "response": None, "source": "sdk",
    }  # fmt: skip
    event.update(changes)
    return event


EVENTS: list[Any] = [
    _event(),
    _event(duration_s=2, started_at=1_700_000_000, ttft_s=0),  # ints as seconds: accepted
    _event(model=Label("m2")),  # a str subclass: accepted
    _event(path="fast", system_prompt="be brief", error_type="TimeoutError", source="proxy"),
    _event(prompt_tokens=True),
    _event(duration_s=float("nan")),
    _event(ttft_s=-1.0),
    _event(tpot_s=float("inf")),
    _event(output_tokens=2**31),
    _event(started_at=1e12),
    _event(model=""),
    _event(model_version="v" * 257),
    _event(prompt="x" * 40_000),
    _event(source="browser"),
    _event(source=None),
    _event(colour="blue"),
    {"request_id": "r-2"},
    ["not", "an", "object"],
    None,
]


def test_a_batch_is_validated_as_each_event_alone_would_be() -> None:
    records, refused = from_json_many(EVENTS)
    expected_records, expected_refused = [], []
    for i, event in enumerate(EVENTS):
        try:
            expected_records.append(InferenceRecord.from_json(event))
        except InvalidRecord as exc:
            expected_refused.append((i, exc.field, exc.reason))
    assert records == expected_records and len(records) == 4
    assert [(i, e.field, e.reason) for i, e in refused] == expected_refused
    assert [type(r.duration_s) for r in records] == [float] * 4


def test_a_batch_observed_at_once_counts_as_the_same_records_one_by_one() -> None:
    rng = random.Random(5)
    records = [
        InferenceRecord(
            request_id=f"r{i}",
            model=rng.choice(["a", "b"]),
            model_version="v",
            started_at=1.7e9,
            duration_s=rng.lognormvariate(-2, 1),
            ttft_s=rng.choice([None, 0.05]),
            tpot_s=None,
            queue_s=rng.choice([None, 0.001]),
            prompt_tokens=rng.randint(1, 90),
            output_tokens=None,
            error_type=rng.choice([None, None, "TimeoutError", "client_error"]),
        )
        for i in range(500)
    ]
    registries = CollectorRegistry(), CollectorRegistry()
    one, many = (InferenceStats(r, clock=Clock()) for r in registries)
    for record in records:
        one.observe(record)
    many.observe_many(records)
    assert generate_latest(registries[0]) == generate_latest(registries[1])
    for model in ("a", "b"):
        for q in (0.5, 0.99):
            assert many.quantile("request_duration", q, 60, model=model) == one.quantile(
                "request_duration", q, 60, model=model
            )
    assert many.error_counts() == one.error_counts() and many.count(60) == 500


def test_a_bad_record_in_a_batch_is_left_out_and_named_after_the_others_are_added() -> None:
    stats = InferenceStats(clock=Clock())
    good = InferenceRecord(request_id="a", model="m", model_version="v", started_at=1.0, duration_s=0.2)
    bad = InferenceRecord(request_id="b", model="m", model_version="v", started_at=1.0, duration_s=-1.0)
    with pytest.raises(InvalidObservation) as info:
        stats.observe_many([good, bad, good])
    assert info.value.reason == "negative_duration"
    assert stats.count(60) == 2


def _old_stamp(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, dt.UTC).strftime("%Y-%m-%d %H:%M:%S.%f")


def test_sqlite_rows_carry_the_timestamp_datetime_would_format_and_no_nul() -> None:
    rng = random.Random(9)
    stamps = [rng.uniform(0, 4e9) for _ in range(2000)] + [1_700_000_000 + k / 1e6 + 5e-7 for k in range(50)]
    stamps += [1_700_000_000.9999996, 1_700_000_000.9999994, 0.0, 86_399.9999999, math.floor(1.7e9)]
    records = [
        InferenceRecord(request_id=f"r{i}", model="m", model_version="v", started_at=t, duration_s=0.1)
        for i, t in enumerate(stamps)
    ]
    full, short = _sqlite_rows(records)  # no optional field: every row short
    assert full == [] and [row[3] for row in short] == [_old_stamp(t) for t in stamps]
    nul = InferenceRecord(
        request_id="r\x00", model="m", model_version="v", started_at=1.0, duration_s=0.1, prompt="a\x00b"
    )
    (row,), short = _sqlite_rows([nul])
    assert short == []
    assert row[0] == "r\ufffd" and row[11] == "a\ufffdb" and "\x00" not in "".join(str(v) for v in row)


def test_the_writers_rows_put_every_record_field_in_the_tables_column_of_that_name() -> None:
    # the column list is the table's; the rows are tuples written out by hand, in its order
    names = [f.name for f in dataclasses.fields(InferenceRecord)]
    assert sorted(COLUMNS) == sorted([*names, "started_bucket"])
    assert set(COLUMNS) | {"id", "relevance"} == {c.name for c in requests.columns}
    full = InferenceRecord(
        request_id="r", model="m", model_version="v", started_at=1_700_000_000.5, duration_s=0.25,
        ttft_s=0.125, tpot_s=0.0625, queue_s=0.03125, prompt_tokens=11, output_tokens=13,
        error_type="TimeoutError", prompt="p", response="q", source="proxy", path="fast",
        system_prompt="s", max_tokens=17, stream=True, finish_reason="length",
    )  # fmt: skip
    assert all(getattr(full, name) is not None for name in names)  # every column told apart
    short = dataclasses.replace(
        full, error_type=None, prompt=None, response=None, path=None, system_prompt=None,
        max_tokens=None, stream=None, finish_reason=None,
    )  # fmt: skip
    stamp = "2023-11-14 22:13:20.500000"
    (row,), _ = _sqlite_rows([full])
    _, (short_row,) = _sqlite_rows([short])
    (pg_row,) = _postgres_rows([full])
    want = {name: getattr(full, name) for name in names}
    assert dict(zip(COLUMNS, row, strict=True)) == {
        **want,
        "started_at": stamp,
        "started_bucket": 170_000_000,
    }
    at = dt.datetime.fromtimestamp(full.started_at, dt.UTC)
    assert dict(zip(COLUMNS, pg_row, strict=True)) == {
        **want,
        "started_at": at,
        "started_bucket": 170_000_000,
    }
    kept = {name: getattr(short, name) for name in names if getattr(short, name) is not None}
    short_columns = [c for c in COLUMNS if c in kept or c == "started_bucket"]
    assert dict(zip(short_columns, short_row, strict=True)) == {
        **kept,
        "started_at": stamp,
        "started_bucket": 170_000_000,
    }


@pytest.fixture(params=["sqlite", "postgres"])
def writer_url(request: pytest.FixtureRequest, tmp_path: Any) -> str:
    return database_url(request, tmp_path)


def test_the_writer_commits_every_row_once_as_given_on_both_backends(writer_url: str) -> None:
    engine = connect(writer_url)
    upgrade(engine)
    writer = RequestWriter(engine)
    try:
        rng = random.Random(2)
        records = [
            InferenceRecord(
                request_id=f"r{i}",
                model="m",
                model_version="v\x00" if i == 3 else "v",
                started_at=1_700_000_000 + rng.uniform(0, 100),
                duration_s=rng.uniform(0, 2),
                ttft_s=None if i % 2 else 0.1,
                prompt_tokens=i,
                prompt="a\x00b" if i == 5 else None,
                error_type="TimeoutError" if i == 7 else None,
                stream=True if i % 10 == 9 else None,  # a row with an optional field among rows without
                max_tokens=64 if i % 10 == 9 else None,
            )
            for i in range(300)
        ]
        assert writer.submit(records[:200]).result(30) == 200
        assert writer.submit(records[100:]).result(30) == 200  # 100 already stored: ignored
        with engine.connect() as conn:
            rows = {r.request_id: r for r in conn.execute(select(requests))}
    finally:
        writer.close()
        engine.dispose()
    assert len(rows) == 300
    for record in records:
        row = rows[record.request_id]
        assert abs(row.started_at.timestamp() - record.started_at) < 1e-5
        assert (row.duration_s, row.ttft_s, row.prompt_tokens, row.error_type, row.stream, row.max_tokens) == (
            record.duration_s, record.ttft_s, record.prompt_tokens, record.error_type, record.stream,
            record.max_tokens,
        )  # fmt: skip
        assert row.prompt == (None if record.prompt is None else record.prompt.replace("\x00", "\ufffd"))
    assert rows["r3"].model_version == "v\ufffd" and rows["r5"].prompt == "a\ufffdb"


def test_the_writer_buckets_each_row_by_its_stored_start_and_windows_find_it(writer_url: str) -> None:
    # stamps a rounding away from a 10-second boundary: the bucket must follow the stored value
    edges = [
        1_700_000_009.9999996,
        1_700_000_009.9999994,
        1_700_000_010.0,
        1_700_000_019.999999,
        1_700_000_020.0000004,
    ]
    rng = random.Random(4)
    stamps = edges + [1_700_000_000 + rng.uniform(0, 60) for _ in range(200)]
    records = [
        InferenceRecord(request_id=f"b{i}", model="m", model_version="v", started_at=t, duration_s=0.1)
        for i, t in enumerate(stamps)
    ]
    engine = connect(writer_url)
    upgrade(engine)
    writer = RequestWriter(engine)
    try:
        assert writer.submit(records).result(30) == len(records)
        with engine.connect() as conn:
            rows = conn.execute(
                select(requests.c.request_id, requests.c.started_at, requests.c.started_bucket)
            ).all()
            stored = sorted(row.started_at for row in rows)
            windows = []
            for since, until in [(stored[1], stored[3]), (stored[2], stored[2]), (stored[0], stored[-1])]:
                for inclusive in (False, True):
                    q = select(requests.c.started_at).where(
                        *started_in(since, until, until_inclusive=inclusive)
                    )
                    got = [r.started_at for r in conn.execute(q.order_by(*by_start()))]
                    want = [t for t in stored if since <= t and (t <= until if inclusive else t < until)]
                    windows.append((got, want))
    finally:
        writer.close()
        engine.dispose()
    assert len(rows) == len(records)
    assert all(row.started_bucket == time_bucket(row.started_at) for row in rows)
    assert {time_bucket(row.started_at) for row in rows if row.request_id in ("b0", "b2")} == {170_000_001}
    for got, want in windows:
        assert got == want


def test_a_write_the_database_refuses_fails_alone_and_the_next_ones_commit(writer_url: str) -> None:
    """A row the database refuses (here a count past its integer column, which the HTTP
    validation would have refused first) fails its own submission, not the others committed
    with it, and the writer goes on: on PostgreSQL through the same staging table again."""
    engine = connect(writer_url)
    upgrade(engine)
    writer = RequestWriter(engine)

    def record(i: int, tokens: int = 5) -> InferenceRecord:
        return InferenceRecord(request_id=f"w{i}", model="m", model_version="v", started_at=1_700_000_000 + i,
                               duration_s=0.1, prompt_tokens=tokens, prompt="hi" if i % 2 else None)  # fmt: skip

    try:
        # the first write of a new connection fails: on PostgreSQL its staging table goes with
        # the rollback, and the writes after it must make it again
        bad = [record(2), record(3, tokens=2**70)]  # no integer column holds it
        good = [record(4), record(5)]
        futures = [writer.submit(bad), writer.submit(good)]  # likely one commit: retried alone
        assert futures[1].result(30) == 2
        with pytest.raises(Exception):  # noqa: B017 - each backend names it its own way
            futures[0].result(30)
        assert writer.submit([record(0), record(1)]).result(30) == 2
        with pytest.raises(Exception):  # noqa: B017
            writer.submit(bad).result(30)
        assert writer.submit([record(6), record(7)]).result(30) == 2
        with engine.connect() as conn:
            stored = sorted(r.request_id for r in conn.execute(select(requests.c.request_id)))
    finally:
        writer.close()
        engine.dispose()
    assert stored == ["w0", "w1", "w4", "w5", "w6", "w7"]


def test_a_lone_surrogate_in_a_records_text_is_replaced_and_fails_no_row_beside_it(writer_url: str) -> None:
    # text that Python's JSON let through (an upstream's answer, a client's field) may hold a
    # lone surrogate, which neither SQLite nor PostgreSQL can encode
    engine = connect(writer_url)
    upgrade(engine)
    writer = RequestWriter(engine)
    try:
        records = [
            InferenceRecord(request_id=f"s{i}", model="m", model_version="v", started_at=1_700_000_000.0 + i,
                            duration_s=0.1, prompt="fine", response="a\ud800b" if i == 1 else "ok")
            for i in range(3)
        ]
        assert writer.submit(records).result(30) == 3
        with engine.connect() as conn:
            got = dict(conn.execute(select(requests.c.request_id, requests.c.response)).all())
        assert got == {"s0": "ok", "s1": "a\ufffdb", "s2": "ok"}
    finally:
        writer.close()
        engine.dispose()
