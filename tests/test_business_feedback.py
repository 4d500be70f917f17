"""Users' feedback reaches its request by HTTP, by the SDK and by OTLP evaluation results,
whether it comes after the request (late) or before it (early); bad feedback is a 422
naming the field with nothing stored; the request's own row is never altered; orphans
expire after the TTL; comment text is redacted."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from _service_support import TOKEN, auth, config, event, running
from _store_helpers import database_url, request_row
from infersight.monitor.business import (
    environment_at,
    expire_orphans,
    joined_feedback,
    parse_feedback,
    record_environment,
    store_feedback,
)
from infersight.monitor.sdk import HttpSink, Monitor
from infersight.monitor.store.database import connect, upgrade
from infersight.monitor.store.tables import feedback, requests
from sqlalchemy import func, insert, select

T0 = 1_800_000_000.0


class Clock:
    def __init__(self) -> None:
        self.t = T0

    def __call__(self) -> float:
        return self.t


def _ingest(client: Any, *events: dict[str, Any]) -> None:
    answer = client.post("/api/v1/events", json={"events": list(events)}, headers=auth())
    assert answer.status_code == 200 and answer.json()["accepted"] == len(events), answer.text


def _feedback_rows(app: Any) -> list[Any]:
    with app.state.service.db.connect() as conn:
        return list(conn.execute(select(feedback).order_by(feedback.c.id)))


def _request_row(app: Any, request_id: str) -> Any:
    with app.state.service.db.connect() as conn:
        return conn.execute(select(requests).where(requests.c.request_id == request_id)).one()


def test_http_feedback_joins_its_request_late_and_early(tmp_path: Any) -> None:
    clock = Clock()
    with running(config(tmp_path), clock=clock) as (app, client):
        _ingest(client, event(1, started_at=T0 - 10))
        before = _request_row(app, "r-1")
        clock.t += 3 * 3600  # hours later
        late = client.post("/api/v1/feedback", json={"request_id": "r-1", "thumbs": "up", "kind": "helpful"},
                           headers=auth())  # fmt: skip
        assert late.json() == {"accepted": 1, "joined": 1}
        early = client.post("/api/v1/feedback", json={"request_id": "r-2", "rating": 2, "user": "u-7"},
                            headers=auth())  # fmt: skip
        assert early.json() == {"accepted": 1, "joined": 0}  # kept: its request is not there yet
        _ingest(client, event(2, started_at=clock.t - 5))
        db = app.state.service.db
        joined = {j.request_id: j.score for j in joined_feedback(db)}
        assert joined == {"r-1": 1.0, "r-2": 0.25}  # rating 2 of 1-5 -> 0.25
        rows = _feedback_rows(app)
        assert [(r.given, r.source, r.user) for r in rows] == [("up", "http", None), ("2/5", "http", "u-7")]
        assert _request_row(app, "r-1") == before  # the request's own record is untouched


def test_bad_feedback_is_refused_naming_the_field_and_nothing_is_stored(tmp_path: Any) -> None:
    with running(config(tmp_path)) as (app, client):
        cases = [
            ({"request_id": "r-1", "score": 1.5}, "body.score"),
            ({"request_id": "r-1", "thumbs": "sideways"}, "body.thumbs"),
            ({"request_id": "r-1", "rating": 6}, "body.rating"),
            ({"request_id": "r-1", "rating": 4.5}, "body.rating"),
            ({"score": 0.5}, "body.request_id"),
            ({"request_id": "r-1"}, "body.score"),  # no value at all
            ({"request_id": "r-1", "score": 0.5, "thumbs": "up"}, "body.score"),  # two values
            ({"request_id": "r-1", "score": 0.5, "stars": 3}, "body.stars"),
            ({"request_id": "r-1", "score": 0.5, "comment": "x" * 5000}, "body.comment"),
            ({"feedback": [{"request_id": "a", "score": 1}, {"request_id": "b", "score": -1}]},
             "body.feedback[1].score"),
        ]  # fmt: skip
        for body, field in cases:
            answer = client.post("/api/v1/feedback", json=body, headers=auth())
            assert answer.status_code == 422, (body, answer.text)
            assert answer.json()["error"]["field"] == field, (body, answer.json())
        not_json = client.post("/api/v1/feedback", content=b"{not json", headers={**auth(), "Content-Type": "application/json"})
        assert not_json.status_code == 422 and not_json.json()["error"]["field"] == "body"
        unauthorized = client.post("/api/v1/feedback", json={"request_id": "r", "score": 1})
        assert unauthorized.status_code == 401
        assert _feedback_rows(app) == []  # the good first item of the bad batch was not kept either


def test_orphan_feedback_expires_after_the_ttl_and_joined_feedback_stays(tmp_path: Any) -> None:
    clock = Clock()
    with running(config(tmp_path, feedback_ttl_s=3600.0), clock=clock) as (app, client):
        _ingest(client, event(1, started_at=T0 - 1))
        for rid in ("r-1", "never-arrives"):
            assert client.post("/api/v1/feedback", json={"request_id": rid, "score": 0.9},
                               headers=auth()).status_code == 200  # fmt: skip
        business = app.state.service.parts.business
        clock.t += 1800
        business.refresh()
        assert len(_feedback_rows(app)) == 2  # within the TTL: still waiting for its request
        clock.t += 3600
        business.refresh()
        assert [r.request_id for r in _feedback_rows(app)] == ["r-1"]


def test_comment_text_is_redacted_and_kept_at_the_text_sample_rate(tmp_path: Any) -> None:
    with running(config(tmp_path)) as (app, client):
        comment = "slow answer, see https://user:hunter2@example.org/x?token=abc"
        client.post("/api/v1/feedback", json={"request_id": "r-1", "thumbs": "down", "comment": comment},
                    headers=auth())  # fmt: skip
        kept = _feedback_rows(app)[0].comment
        assert kept.startswith("slow answer") and "hunter2" not in kept and "abc" not in kept
    with running(config(tmp_path / "b", text_sample_rate=0.0)) as (app, client):
        client.post("/api/v1/feedback", json={"request_id": "r-1", "thumbs": "down", "comment": comment},
                    headers=auth())  # fmt: skip
        row = _feedback_rows(app)[0]
        assert row.comment is None and row.score == 0.0  # the score is kept, the text is not


def test_sdk_feedback_is_sent_in_the_background_and_joins_its_request(tmp_path: Any) -> None:
    with running(config(tmp_path)) as (app, client):
        sink = HttpSink("http://testserver/api/v1/events", token=TOKEN, transport=client._transport)
        monitor = Monitor(sink=sink)
        try:
            assert monitor.feedback("r-5", score=0.75, kind="accuracy", comment="fine") is True
            assert monitor.feedback("", score=0.5) is False  # bad shape: counted, never raised
            assert monitor.feedback("r-5", score=float("nan")) is False
            assert monitor.feedback("r-5", thumbs="up", rating=3) is False
            assert monitor.feedback(None, rating=9) is False  # type: ignore[arg-type]
            assert monitor.flush(10.0)
            _ingest(client, event(5))  # the request arrives after its feedback
        finally:
            monitor.close(5.0)
        rows = _feedback_rows(app)
        assert [(r.request_id, r.score, r.kind, r.source, r.comment) for r in rows] == [
            ("r-5", 0.75, "accuracy", "sdk", None)  # the SDK's default sample_rate keeps no text
        ]
        assert [j.request_id for j in joined_feedback(app.state.service.db)] == ["r-5"]
        assert monitor.counters.value("rejected", "feedback_value") == 2
        assert monitor.counters.value("rejected", "feedback_request_id") == 2


class _Answer:
    """The shape of an OpenAI-compatible answer that matters here: its `id`."""

    def __init__(self, id: str, text: str) -> None:
        self.id = id
        self.text = text


def test_feedback_on_a_tracked_call_joins_its_record_by_the_answers_id(tmp_path: Any) -> None:
    with running(config(tmp_path)) as (app, client):
        sink = HttpSink("http://testserver/api/v1/events", token=TOKEN, transport=client._transport)
        monitor = Monitor(sink=sink, sample_rate=1.0, extract_response=lambda a: a.text)
        try:

            @monitor.track(model="chat", model_version="v2", request_id=lambda answer: answer.id)
            def ask(prompt: str) -> _Answer:
                return _Answer("chatcmpl-abc123", prompt.upper())

            answer = ask("hello")
            assert monitor.flush(10.0)  # the record is in
            assert monitor.feedback(answer.id, thumbs="down", kind="helpful") is True
            assert monitor.flush(10.0)
        finally:
            monitor.close(5.0)
        row = _request_row(app, "chatcmpl-abc123")
        assert (row.model, row.model_version, row.response) == ("chat", "v2", "HELLO")
        joined = joined_feedback(app.state.service.db)
        assert [(j.request_id, j.score) for j in joined] == [("chatcmpl-abc123", 0.0)]
        assert monitor.counters.value("internal", "request_id") == 0


def _kv(key: str, value: Any) -> dict[str, Any]:
    kind = "doubleValue" if isinstance(value, float) else "stringValue"
    return {"key": key, "value": {kind: value}}


def _span(trace: str, span: str, *, parent: str | None = None, attrs: list[Any], events: list[Any] = ()) -> dict:  # type: ignore[assignment]
    start = int((T0 - 30) * 1e9)
    out: dict[str, Any] = {"traceId": trace, "spanId": span, "name": "chat m", "kind": 3,
                           "startTimeUnixNano": str(start), "endTimeUnixNano": str(start + 800_000_000),
                           "attributes": attrs, "events": list(events)}  # fmt: skip
    if parent:
        out["parentSpanId"] = parent
    return out


def _export(client: Any, *spans: dict[str, Any]) -> None:
    body = {"resourceSpans": [{"resource": {"attributes": []}, "scopeSpans": [{"spans": list(spans)}]}]}
    answer = client.post("/v1/traces", json=body, headers=auth())
    assert answer.status_code == 200, answer.text


def test_otlp_evaluation_results_join_the_request_of_their_trace(tmp_path: Any) -> None:
    trace_a, trace_b = "a" * 32, "b" * 32
    call = [_kv("gen_ai.operation.name", "chat"), _kv("gen_ai.request.model", "m")]
    with running(config(tmp_path)) as (app, client):
        # an evaluation event on the call's own span (late: with the call)
        rating = {"name": "gen_ai.evaluation.result", "timeUnixNano": str(int(T0 * 1e9)),
                  "attributes": [_kv("gen_ai.evaluation.name", "user_rating"),
                                 _kv("gen_ai.evaluation.score.value", 0.8)]}  # fmt: skip
        _export(client, _span(trace_a, "1" * 16, attrs=call, events=[rating]))
        # an evaluation span of its own, exported before the call it judges (early)
        judge = [_kv("gen_ai.evaluation.name", "relevance"), _kv("gen_ai.evaluation.score.label", "irrelevant")]
        _export(client, _span(trace_b, "3" * 16, parent="2" * 16, attrs=judge))
        _export(client, _span(trace_b, "2" * 16, attrs=call))
        # a judged answer named by its response id
        by_id = [_kv("gen_ai.evaluation.name", "thumbs"), _kv("gen_ai.evaluation.score.label", "pass"),
                 _kv("gen_ai.response.id", "r-9")]  # fmt: skip
        _export(client, _span("c" * 32, "4" * 16, attrs=by_id))
        _ingest(client, event(9))
        assert app.state.service.writer is not None
        app.state.service.writer.flush()
        joined = {(j.request_id, j.score) for j in joined_feedback(app.state.service.db)}
        assert joined == {(f"otlp-{trace_a}-{'1' * 16}", 0.8), (f"otlp-{trace_b}-{'2' * 16}", 0.0), ("r-9", 1.0)}
        with app.state.service.db.connect() as conn:
            assert conn.execute(select(func.count()).select_from(requests)).scalar() == 3  # no span of a judge
        assert {r.source for r in _feedback_rows(app)} == {"otlp"}


@pytest.fixture(params=["sqlite", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path: Any) -> Any:
    engine = connect(database_url(request, tmp_path))
    upgrade(engine)
    yield engine
    engine.dispose()


def test_the_store_joins_expires_and_records_on_sqlite_and_postgresql(store: Any) -> None:
    now = dt.datetime.fromtimestamp(T0, dt.UTC)
    with store.begin() as conn:
        conn.execute(insert(requests), [request_row(1, at=now - dt.timedelta(hours=2), path="fast")])
    items = [parse_feedback({"request_id": "req-1", "rating": 5, "user": "u"}),
             parse_feedback({"request_id": "req-404", "thumbs": "down"})]  # fmt: skip
    assert store_feedback(store, items, source="http", now=now) == 2
    assert [(j.request_id, j.score, j.path) for j in joined_feedback(store)] == [("req-1", 1.0, "fast")]
    assert expire_orphans(store, now=now + dt.timedelta(hours=2), ttl_s=3600) == 1
    with store.connect() as conn:
        assert [r.request_id for r in conn.execute(select(feedback))] == ["req-1"]
    record_environment(store, {"torch": "2.3.0"}, reason="start", now=now)
    record_environment(store, {"torch": "2.4.0"}, reason="deploy", now=now + dt.timedelta(minutes=5))
    at = environment_at(store, now + dt.timedelta(minutes=1))
    assert at is not None and at.versions == {"torch": "2.3.0"}
