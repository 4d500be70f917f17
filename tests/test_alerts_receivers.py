"""Receivers over real HTTP to local servers that check what the real receivers check:
PagerDuty's Events API v2 schema (a local stand-in: PagerDuty's servers are out of reach),
Standard Webhooks signatures, Slack's incoming-webhook message shape."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from infersight.alerts import Dispatcher, HttpxSender, build_receivers
from infersight.alerts.notify.matchers import ReceiverConfig
from infersight.alerts.notify.outbox import Notification, NotifiedAlert, enqueue
from infersight.alerts.notify.receivers import pagerduty_event, sign, verify
from sqlalchemy import Engine
from test_alerts_support import ROUTING_KEY, WHSEC, Clock, LocalReceiver, database


@pytest.fixture
def sqlite_db(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Engine]:
    with database("sqlite", tmp_path, request) as engine:
        yield engine


def notification(receiver: str, status: str = "firing", key: str = "n-1") -> Notification:
    t = dt.datetime(2027, 1, 15, 8, 0, tzinfo=dt.UTC)
    alert = NotifiedAlert(
        status=status,  # type: ignore[arg-type]
        labels=(
            ("alertname", "TailLatencyOverSLA"),
            ("model", "bank"),
            ("model_version", "mixtral_bank_int8-v1.2"),
            ("severity", "critical"),
            ("team", "ml-platform"),
        ),
        annotations=(
            ("runbook_url", "https://runbooks.example.org/x"),
            ("summary", "p99 is 3.1s, over the 2s SLA"),
        ),
        starts_at=t,
        ends_at=None if status == "firing" else t + dt.timedelta(minutes=5),
        fingerprint="f1",
        value=3.1,
    )
    return Notification(
        key, "group-abc", receiver, status, (("alertname", "TailLatencyOverSLA"),), (alert,), t
    )  # type: ignore[arg-type]


def deliver(engine: Engine, config: ReceiverConfig, *notes: Notification) -> list:
    clock = Clock(time.time())  # the receivers check timestamps against their own clock
    with engine.begin() as conn:
        for n in notes:
            enqueue(conn, n, clock.now)
    sender = HttpxSender()
    try:
        return Dispatcher(engine, build_receivers({config.name: config}), sender, clock=clock).run_once()
    finally:
        sender.close()


def test_pagerduty_trigger_then_resolve_share_the_dedup_key(sqlite_db: Engine) -> None:
    with LocalReceiver(kind="pagerduty") as pd:
        config = ReceiverConfig("pd", "pagerduty", pd.url, secret=ROUTING_KEY)
        results = deliver(sqlite_db, config, notification("pd"), notification("pd", "resolved", "n-2"))
    assert [r.outcome for r in results] == ["delivered", "delivered"], [r.error for r in results]
    trigger, resolve = (r.json() for r in pd.requests)
    assert trigger["event_action"] == "trigger" and resolve["event_action"] == "resolve"
    assert trigger["dedup_key"] == resolve["dedup_key"] == "group-abc"
    p = trigger["payload"]
    assert p["summary"] == "p99 is 3.1s, over the 2s SLA" and p["severity"] == "critical"
    assert (p["source"], p["component"], p["group"], p["class"]) == (
        "mixtral_bank_int8-v1.2",
        "bank",
        "ml-platform",
        "TailLatencyOverSLA",
    )
    assert p["custom_details"]["firing"][0]["value"] == 3.1
    assert trigger["links"] == [{"href": "https://runbooks.example.org/x", "text": "Runbook"}]
    assert pd.requests[0].headers["idempotency-key"] == "n-1"


def test_invalid_pagerduty_event_is_refused_by_the_schema_check() -> None:
    event = pagerduty_event(notification("pd"), routing_key="short", source="x")
    from test_alerts_support import pagerduty_errors

    assert "routing_key must be a 32-character string" in pagerduty_errors(event)
    assert pagerduty_errors(pagerduty_event(notification("pd"), routing_key=ROUTING_KEY, source="x")) == []


def test_webhook_is_signed_per_standard_webhooks(sqlite_db: Engine) -> None:
    with LocalReceiver(kind="webhook", secret=WHSEC) as hook:
        config = ReceiverConfig("hook", "webhook", hook.url, secret=WHSEC)
        [result] = deliver(sqlite_db, config, notification("hook"))
    assert result.outcome == "delivered"
    [req] = hook.requests
    assert req.status == 200 and req.headers["webhook-id"] == "n-1"
    assert req.headers["webhook-signature"].startswith("v1,")
    body = req.json()
    assert (
        body["version"] == "4" and body["groupKey"] == "group-abc" and body["alerts"][0]["status"] == "firing"
    )
    # what a consumer checks: the signature covers the exact bytes, and the timestamp is fresh
    ts = int(req.headers["webhook-timestamp"])
    with pytest.raises(ValueError, match="no valid v1 signature"):
        verify(WHSEC, req.headers, req.body.replace(b"firing", b"resolved"), now=ts)
    with pytest.raises(ValueError, match="tolerance"):
        verify(WHSEC, req.headers, req.body, now=ts + 3600)


def test_signature_matches_the_specification_example() -> None:
    # The example of the Standard Webhooks specification.
    secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
    body = b'{"test": 2432232314}'
    assert sign(secret, "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, body) == (
        "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
    )


def test_webhook_with_wrong_secret_is_refused_and_not_retried(sqlite_db: Engine) -> None:
    with LocalReceiver(kind="webhook", secret=WHSEC) as hook:
        other = "whsec_" + "QUJDREVGR0hJSktMTU5PUFFSU1RVVldYWVo="
        config = ReceiverConfig("hook", "webhook", hook.url, secret=other)
        [result] = deliver(sqlite_db, config, notification("hook"))
    assert (result.outcome, result.status) == ("dead", 401)


def test_slack_message_has_text_and_blocks(sqlite_db: Engine) -> None:
    with LocalReceiver(kind="slack", secret=None) as slack:
        config = ReceiverConfig("chat", "slack", slack.url)
        deliver(sqlite_db, config, notification("chat"))
    [req] = slack.requests
    body = json.loads(req.body)
    assert body["text"].startswith(":red_circle: [FIRING:1] TailLatencyOverSLA")
    assert "p99 is 3.1s" in body["text"] and "<https://runbooks.example.org/x|runbook>" in body["text"]
    assert body["blocks"][0]["type"] == "header"


def test_slack_escapes_label_values_so_they_cannot_link_mention_or_format(sqlite_db: Engine) -> None:
    hostile = "<!channel> *bold* _it_ ~st~ `code` a&b <https://evil.example|click>"
    base = notification("chat")
    alert = dataclasses.replace(
        base.alerts[0],
        labels=(("alertname", "Slow_*model*"), ("model_version", hostile)),
        annotations=(("runbook_url", "https://runbooks.example.org/x?a=1&b=<2>|x"),),
    )
    note = dataclasses.replace(base, group_labels=(("alertname", "Slow_*model*"),), alerts=(alert,))
    with LocalReceiver(kind="slack", secret=None) as slack:
        deliver(sqlite_db, ReceiverConfig("chat", "slack", slack.url), note)
    body = json.loads(slack.requests[0].body)
    section = body["blocks"][1]["text"]["text"]
    for text in (body["text"], section):
        line = text.splitlines()[-1]
        assert "<!channel>" not in line and "<https://evil" not in line  # no mention, no link of theirs
        assert "&lt;!channel&gt;" in line and "a&amp;b" in line
        for marker in "*_~`":  # every marker coming from a value is preceded by a zero-width space
            value_part = line.split("* ", 1)[1]  # after the receiver's own "• *firing* "
            assert all(value_part[i - 1] == "\u200b" for i, c in enumerate(value_part) if c == marker)
        # the one link left is the runbook's, its target unable to end early
        assert line.count("<") == 1 and "|runbook>" in line and "%7Cx" in line
    assert body["text"].startswith(":red_circle: [FIRING:1] Slow\u200b_\u200b*model\u200b*")
    assert body["blocks"][0]["text"]["text"].endswith("Slow_*model*")  # plain text shows it as is


def test_acknowledged_notification_is_a_pagerduty_acknowledge(sqlite_db: Engine) -> None:
    note = notification("pd")
    ack = Notification(
        "n-3", note.group_key, "pd", "acknowledged", note.group_labels, note.alerts, note.created_at
    )
    with LocalReceiver(kind="pagerduty") as pd:
        config = ReceiverConfig("pd", "pagerduty", pd.url, secret=ROUTING_KEY)
        [result] = deliver(sqlite_db, config, ack)
    assert result.outcome == "delivered"
    assert pd.requests[0].json() == {
        "routing_key": ROUTING_KEY,
        "event_action": "acknowledge",
        "dedup_key": "group-abc",
    }
