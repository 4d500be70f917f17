"""Issue 10, part 2, replayed against the real service (embedded runtime with the demo
model, uvicorn on a loopback port, SQLite, the demo's signed-webhook receiver as on-call):
a good candidate (the demo's int8 version) deployed with a short post-deploy analysis
while careless clients send over-long prompts (answered 400) and hang up after 50 ms is
neither rolled back nor paged about; a genuinely bad release (the corrupted fp32-v1.1)
still is, and the page and the deploy history name the failed check with its figures."""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from _demo_registry import BAD, GOOD, private_copy, shared_demo_registry
from _service_support import wait_for
from conftest import free_port
from infersight.alerts import REGRESSION_ALERT
from infersight.monitor import data
from infersight.monitor.service import Service, create_app
from infersight.monitor.service.config import (
    AlertingConfig,
    DriftConfig,
    EngineConfig,
    ScheduleConfig,
    ServiceConfig,
)
from infersight.monitor.service.demo.stage import SYSTEM, WebhookReceiver, new_secret, sample, send_chats
from infersight.monitor.store.tables import alerts, deploy_analyses, deploys, requests
from sqlalchemy import select

INT8 = "mixtral_banking_int8-v1.0"
TOKEN = "client-outcomes-token-0123456789"
ANALYSIS_WINDOW_S = 40.0  # checked every 3 s: the checks (output drift) share the CPU with the model
# This test is about what counts as an error. Latency is not comparable between its two
# phases on a shared CI machine (measured: the same good traffic's p99 twice the baseline's
# when other jobs ran), so the latency check is left to test_alerts_actions.py.
P99_RATIO = 100.0
# the release's relevance on the same requests as the previous version (paired: issue 21)
_FIGURES = re.compile(r"relevance fell in \d+ of \d+ pairs \(rose in \d+\), mean -\d\.\d\d")

# ErrorRateSpike as shipped (alerts/default_rules.yaml), with short timings so it would act
# within the test: a live error-rate signal that pages and rolls back.
RULES = """\
groups:
  - name: serving
    interval: 1s
    rules:
      - alert: ErrorRateSpike
        signal: {kind: error_rate, window: 1m, min_requests: 10}
        op: ">"
        threshold: 0.05
        by: [model, model_version]
        labels: {severity: critical}
        annotations: {summary: "{{ $value | humanizePercentage }} of requests fail"}
        actions:
          - {type: rollback, cooldown: 0s, daily_cap: 5}
receivers:
  - name: on-call
    webhook: {url: "HOOK_URL", secret: "HOOK_SECRET"}
route:
  receiver: on-call
  group_by: [alertname, model_version]
  group_wait: 0s
  group_interval: 1s
  repeat_interval: 1h
"""


@dataclass
class Served:
    base: str
    service: Service
    hook: WebhookReceiver

    def analysis(self, version: str) -> Any:
        with self.service.db.connect() as conn:
            return conn.execute(
                select(deploy_analyses)
                .where(deploy_analyses.c.to_version == version)
                .order_by(deploy_analyses.c.id.desc())
            ).first()

    def deploy(self, version: str) -> None:
        r = httpx.post(f"{self.base}/api/v1/models/deploy", json={"version": version},
                       headers={"Authorization": f"Bearer {TOKEN}"}, timeout=120)  # fmt: skip
        assert r.status_code == 200, r.text

    def serving(self) -> str:
        return str(httpx.get(f"{self.base}/api/v1/models", timeout=30).json()["serving_version"])


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    import uvicorn

    tmp = tmp_path_factory.mktemp("client-outcomes")
    registry = private_copy(shared_demo_registry(tmp_path_factory), tmp / "registry")
    reference = tmp / "reference.jsonl"
    reference.write_text("".join(json.dumps({"prompt": t}) + "\n" for t in
                                 sample([u.text for u in data.banking77("train")], 200, seed=1)))  # fmt: skip
    secret = new_secret()
    with WebhookReceiver(secret) as hook:
        rules = tmp / "rules.yaml"
        rules.write_text(RULES.replace("HOOK_URL", hook.url).replace("HOOK_SECRET", secret))
        port = free_port()
        cfg = ServiceConfig(
            data_dir=tmp / "service", port=port, token=TOKEN,
            engine=EngineConfig(registry=registry, version=GOOD, max_batch_size=8, max_seq_len=512,
                                max_prompt_tokens=256, max_tokens_limit=32),
            # no hold past the window: this test is about what fails a check, and its traffic stops
            # with the window (holding for undecided divergence: tests/test_paired_checks.py)
            alerting=AlertingConfig(rules=rules, analysis_window_s=ANALYSIS_WINDOW_S, analysis_interval_s=3.0,
                                    analysis_failed_checks=2, analysis_min_requests=15,
                                    analysis_p99_ratio=P99_RATIO, analysis_max_hold_s=0.0),
            drift=DriftConfig(reference=reference, alpha=0.01, window=60, min_window=30),
            schedule=ScheduleConfig(timeseries_s=1.0, timeseries_window_s=20.0, embed_s=1.0, drift_s=3600.0,
                                    rules_s=0.5, outbox_s=0.5, post_deploy_s=1.0),
            text_sample_rate=1.0,
        )  # fmt: skip
        service = Service(cfg)
        service.start()
        server = uvicorn.Server(uvicorn.Config(create_app(cfg, service=service), host="127.0.0.1", port=port,
                                               log_level="warning", access_log=False))  # fmt: skip
        thread = threading.Thread(target=server.run, name="client-outcomes-uvicorn", daemon=True)
        thread.start()
        try:
            wait_for(lambda: server.started, 60, "the HTTP server started")
            yield Served(f"http://127.0.0.1:{port}", service, hook)
        finally:
            server.should_exit = True
            thread.join(30)
            service.stop()


def _over_long_prompts(base: str, n: int) -> list[int]:
    body = {"messages": [{"role": "user", "content": "card " * 400}], "max_tokens": 8}
    with httpx.Client(base_url=base, timeout=60) as client:
        return [client.post("/v1/chat/completions", json=body).status_code for _ in range(n)]


def _hang_ups(base: str, utterances: list[str], after_s: float = 0.0) -> int:
    """Clients that start a streamed answer and go away `after_s` after its first bytes (at once by
    default: a 50-ms wait let a busy machine's client see whole 32-token answers); how many got a 200."""
    started = 0
    for text in utterances:
        body = {"messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": text}],
                "max_tokens": 32, "stream": True}  # fmt: skip
        with (
            httpx.Client(base_url=base, timeout=60) as client,
            client.stream("POST", "/v1/chat/completions", json=body) as r,
        ):
            started += r.status_code == 200
            t0 = time.monotonic()
            for _ in r.iter_raw():
                if time.monotonic() - t0 >= after_s:
                    break
        # leaving the block closes the connection mid-answer: the client hung up
    return started


def _outcomes(served: Served, version: str) -> dict[str | None, int]:
    assert served.service.writer is not None
    served.service.writer.flush()
    out: dict[str | None, int] = {}
    with served.service.db.connect() as conn:
        for (error_type,) in conn.execute(
            select(requests.c.error_type).where(requests.c.model_version == version)
        ):
            out[error_type] = out.get(error_type, 0) + 1
    return out


def _firing(served: Served) -> list[tuple[str, dict[str, str], dict[str, str]]]:
    with served.service.db.connect() as conn:
        rows = conn.execute(select(alerts).where(alerts.c.state == "firing")).all()
    return [(r.alertname, json.loads(r.labels), json.loads(r.annotations)) for r in rows]


def test_careless_clients_neither_roll_back_a_good_release_nor_page(served: Served) -> None:
    traffic = sample([u.text for u in data.banking77("test")], 200, seed=2)
    baseline = send_chats(served.base, traffic[:40])
    assert baseline.ok == baseline.sent == 40, baseline.errors
    served.deploy(INT8)
    good = send_chats(served.base, traffic[40:70])
    assert _over_long_prompts(served.base, 15) == [400] * 15
    assert _hang_ups(served.base, traffic[70:85]) == 15
    good2 = send_chats(served.base, traffic[85:100])
    assert good.ok + good2.ok == good.sent + good2.sent == 45, good.errors + good2.errors
    done = wait_for(lambda: (a := served.analysis(INT8)) is not None and a.state != "running" and a,
                 ANALYSIS_WINDOW_S + 60, "the post-deploy analysis of the good release ended")  # fmt: skip
    checks = json.loads(done.evidence)
    assert done.state == "passed", checks[-3:]
    assert done.failed_checks == 0 and any(c["verdict"] == "passed" for c in checks), checks
    last = checks[-1]["new"]
    assert last["error_rate"] == 0.0 and last["client_errors"] == 15 and last["cancelled"] >= 10
    assert served.serving() == INT8
    with served.service.db.connect() as conn:
        assert conn.execute(select(deploys).where(deploys.c.reason == "rollback")).all() == []
    assert _firing(served) == [] and served.hook.received == []  # on-call was not paged
    # what the clients caused is recorded, under its own label, and shown to the dashboards
    outcomes = wait_for(
        lambda: (o := _outcomes(served, INT8)).get("cancelled", 0) >= 10 and o, 30, "hang-ups recorded"
    )
    assert outcomes.get("client_error") == 15 and outcomes.get(None, 0) >= 45
    assert set(outcomes) <= {None, "client_error", "cancelled"}  # nothing the server did wrong
    metrics = httpx.get(f"{served.base}/metrics", timeout=30).text  # what the dashboards read
    for outcome in ("client_error", "cancelled"):
        assert f'model_version="{INT8}",outcome="{outcome}"' in metrics
    assert (
        f'gen_ai_server_request_errors_total{{model="mixtral_banking",model_version="{INT8}"' not in metrics
    )


def test_a_bad_release_still_rolls_back_and_the_page_names_the_failed_check(served: Served) -> None:
    assert served.serving() == INT8  # after the test above
    served.deploy(BAD)
    traffic = sample([u.text for u in data.banking77("test")], 400, seed=3)
    stop = threading.Event()

    def keep_sending() -> None:  # users keep asking while the analysis decides
        i = 0
        while not stop.is_set() and i < 12:
            send_chats(served.base, traffic[i * 25 : (i + 1) * 25])
            i += 1

    worker = threading.Thread(target=keep_sending, daemon=True)
    worker.start()
    try:
        done = wait_for(lambda: (a := served.analysis(BAD)) is not None and a.state != "running" and a,
                     ANALYSIS_WINDOW_S + 60, "the post-deploy analysis of the bad release ended")  # fmt: skip
    finally:
        stop.set()
        worker.join(120)
    assert done.state == "rolled_back", json.loads(done.evidence)[-3:]
    assert wait_for(lambda: served.serving() == INT8, 30, "serving the previous version again")
    [(_name, labels, annotations)] = [f for f in _firing(served) if f[0] == REGRESSION_ALERT]
    failed = labels["failed_checks"].split(",")
    assert "relevance" in failed and "error_rate" not in failed, labels
    assert _FIGURES.search(annotations["failed_checks"]), annotations

    def rollback_row() -> dict[str, Any] | None:  # the rollback's row in the history, with its detail
        deploys = httpx.get(f"{served.base}/api/v1/models", timeout=30).json()["deploys"]
        return next((d for d in deploys if d["reason"] == "rollback" and d["detail"]), None)

    try:
        row = wait_for(rollback_row, 30, "history")
    except AssertionError:
        raise AssertionError(
            httpx.get(f"{served.base}/api/v1/models", timeout=30).json()["deploys"]
        ) from None
    assert (row["from_version"], row["to_version"], row["reason"]) == (BAD, INT8, "rollback")
    assert "post-deploy analysis" in row["detail"] and _FIGURES.search(row["detail"]), row
    wait_for(lambda: REGRESSION_ALERT in served.hook.alertnames(), 30, "the page reached on-call")
