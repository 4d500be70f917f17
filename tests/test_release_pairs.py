"""Issue 21 replayed against the real service (embedded runtime with the demo model, uvicorn
on a loopback port, SQLite, the demo's signed-webhook receiver as on-call), with paired
release checks: a share of live requests is also answered by the other version, and the
quality checks compare the two answers to the same request.

- Clients that steer their arm (1 token asked on the canary's users, 24 on the stable's:
  the issue's attack, here even knowing the assignment) do not roll back a good 50% canary.
- The corrupted demo release as a 10% canary is rolled back having served under 15% of the
  requests, and the page names the paired check with its pair counts.
- After a good deploy, clients that change their `max_tokens` and prompts, send over-long
  prompts (400) and hang up on non-streamed answers after 50 ms do not roll it back, and
  nobody is paged; the analysis rested on pairs.
(The plain deploy of the corrupted release is rolled back within the window:
test_post_deploy_client_outcomes.py.)"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from _demo_registry import BAD, GOOD, private_copy, shared_demo_registry
from _service_support import wait_for
from conftest import free_port
from infersight.alerts import CANARY_ALERT, REGRESSION_ALERT
from infersight.engine.runtime_canary import user_bucket
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
from infersight.monitor.store.tables import alerts, deploy_analyses
from sqlalchemy import select

INT8 = "mixtral_banking_int8-v1.0"
TOKEN = "release-pairs-token-0123456789ab"
WINDOW_S = 25.0
RULES = """\
groups: []
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

    def post(self, path: str, body: dict[str, Any]) -> Any:
        r = httpx.post(
            f"{self.base}{path}", json=body, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=120
        )
        assert r.status_code == 200, r.text
        return r.json()

    def canary(self) -> Any:
        return httpx.get(f"{self.base}/api/v1/models/canary", timeout=30).json()

    def firing(self) -> list[str]:
        with self.service.db.connect() as conn:
            return [r.alertname for r in conn.execute(select(alerts).where(alerts.c.state == "firing"))]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    import uvicorn

    tmp = tmp_path_factory.mktemp("release-pairs")
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
                                max_prompt_tokens=256, max_tokens_limit=64, pair_share=0.5),
            # no hold past the window: these tests are about what fails a check, and their traffic
            # stops with the window (holding for undecided divergence: tests/test_paired_checks.py)
            alerting=AlertingConfig(rules=rules, analysis_window_s=WINDOW_S, analysis_interval_s=2.0,
                                    analysis_failed_checks=2, analysis_min_requests=15, analysis_p99_ratio=100.0,
                                    analysis_max_hold_s=0.0),
            drift=DriftConfig(reference=reference, alpha=0.01, window=60, min_window=30),
            schedule=ScheduleConfig(timeseries_s=1.0, timeseries_window_s=20.0, embed_s=1.0, drift_s=3600.0,
                                    rules_s=0.5, outbox_s=0.5, post_deploy_s=1.0),
            text_sample_rate=1.0,
        )  # fmt: skip
        service = Service(cfg)
        service.start()
        server = uvicorn.Server(uvicorn.Config(create_app(cfg, service=service), host="127.0.0.1", port=port,
                                               log_level="warning", access_log=False))  # fmt: skip
        thread = threading.Thread(target=server.run, name="release-pairs-uvicorn", daemon=True)
        thread.start()
        try:
            wait_for(lambda: server.started, 60, "the HTTP server started")
            yield Served(f"http://127.0.0.1:{port}", service, hook)
        finally:
            server.should_exit = True
            thread.join(30)
            service.stop()


def _chat(base: str, text: str, max_tokens: int, user: str) -> str:
    body = {"messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": text}],
            "max_tokens": max_tokens, "user": user}  # fmt: skip
    r = httpx.post(f"{base}/v1/chat/completions", json=body, timeout=120)  # no token
    assert r.status_code == 200, r.text
    assert "x-infersight-version" not in r.headers
    return str(r.json()["model"])


def _pairs(served: Served) -> int:
    """Scored pairs the running canary's analysis has seen."""
    controller = served.service.parts.backend.canary_controller  # type: ignore[union-attr]
    analysis = controller.analysis
    return 0 if analysis is None or analysis.pairs is None else analysis.pairs.pairs


def test_clients_steering_their_arm_do_not_roll_back_a_good_canary(served: Served) -> None:
    served.post("/api/v1/models/canary", {"version": INT8, "weight": 0.5})
    texts = sample([u.text for u in data.banking77("test")], 200, seed=4)
    users = [f"client-{i}" for i in range(len(texts))]
    # the attack of the issue, at its strongest: each client knows its arm (here from the
    # assignment's hash) and asks the canary for 1 token, the stable version for 24
    budget = {u: 1 if user_bucket(u, INT8) < 0.5 else 24 for u in users}
    with ThreadPoolExecutor(6) as pool:
        models = list(pool.map(lambda i: _chat(served.base, texts[i], budget[users[i]], users[i]), range(72)))
    assert set(models) == {"mixtral_banking"}  # no answer names its version to a client without the token
    wait_for(lambda: _pairs(served) >= 20, 60, "20 scored pairs")
    status = served.canary()
    assert status["version"] == INT8 and status["weight"] == 0.5, status  # still running, not rolled back
    assert [d for d in status["decisions"] if d["action"] == "rollback"] == []
    assert CANARY_ALERT not in served.firing() and served.hook.received == []
    served.post("/api/v1/models/canary/abort", {})


def test_a_corrupted_canary_is_rolled_back_on_pairs_having_served_under_15_percent(served: Served) -> None:
    served.post("/api/v1/models/canary", {"version": BAD, "weight": 0.1})
    traffic = sample([u.text for u in data.banking77("test")], 400, seed=5)
    stop = threading.Event()

    def keep_sending() -> None:
        i = 0
        while not stop.is_set() and i < 16:
            users = [f"user-{j}" for j in range(i * 20, (i + 1) * 20)]
            send_chats(served.base, traffic[i * 20 : (i + 1) * 20], max_tokens=8, users=users, workers=6)
            i += 1

    worker = threading.Thread(target=keep_sending, daemon=True)
    worker.start()
    try:
        status = wait_for(
            lambda: (s := served.canary())["version"] is None and s, 120, "the bad canary rolled back"
        )
    finally:
        stop.set()
        worker.join(120)
    (decision,) = [d for d in status["decisions"] if d["version"] == BAD]
    assert decision["action"] == "rollback" and decision["reason"].startswith("paired regression: ")
    assert " of " in decision["reason"] and " pairs" in decision["reason"], decision["reason"]
    served_by_bad = decision["canary_requests"] / (decision["canary_requests"] + decision["stable_requests"])
    assert served_by_bad < 0.15, decision
    wait_for(lambda: CANARY_ALERT in served.hook.alertnames(), 30, "the page reached on-call")
    with served.service.db.connect() as conn:
        (page,) = conn.execute(select(alerts).where(alerts.c.alertname == CANARY_ALERT)).all()
    assert "pairs" in json.loads(page.annotations)["summary"]


def test_hang_ups_over_long_prompts_and_a_new_mix_do_not_roll_back_a_good_deploy(served: Served) -> None:
    texts = [u.text for u in data.banking77("test")]
    before = send_chats(served.base, sample(texts, 30, seed=6), max_tokens=6)
    assert before.ok == before.sent == 30, before.errors
    pages_before = list(served.hook.received)
    served.post("/api/v1/models/deploy", {"version": INT8})
    # at the deploy the clients change: other prompts, other budgets, careless clients
    stop = threading.Event()

    def careless() -> None:
        with httpx.Client(base_url=served.base, timeout=60) as client:
            long_body = {"messages": [{"role": "user", "content": "card " * 400}], "max_tokens": 8}
            while not stop.is_set():
                assert client.post("/v1/chat/completions", json=long_body).status_code == 400
                body = {"messages": [{"role": "user", "content": "why was my card declined abroad"}],
                        "max_tokens": 64}  # fmt: skip
                with contextlib.suppress(httpx.TimeoutException):  # it hangs up after 50 ms
                    client.post("/v1/chat/completions", json=body, timeout=0.05)

    worker = threading.Thread(target=careless, daemon=True)
    worker.start()
    try:
        after = send_chats(served.base, sample(texts[::-1], 60, seed=7), max_tokens=16, workers=6)
        assert after.ok == after.sent == 60, after.errors

        def ended() -> Any:
            with served.service.db.connect() as conn:
                row = conn.execute(select(deploy_analyses).where(deploy_analyses.c.to_version == INT8)
                                   .order_by(deploy_analyses.c.id.desc())).first()  # fmt: skip
            return row is not None and row.state != "running" and row

        done = wait_for(ended, WINDOW_S + 60, "the analysis of the good deploy ended")
    finally:
        stop.set()
        worker.join(60)
    checks = json.loads(done.evidence)
    assert done.state == "passed" and done.failed_checks == 0, checks[-3:]
    assert checks[-1]["pairs"] >= 10 and checks[-1]["paired"].startswith(f"{checks[-1]['pairs']} pairs: ")
    assert checks[-1]["new"]["cancelled"] >= 1 and checks[-1]["new"]["client_errors"] >= 1
    assert REGRESSION_ALERT not in served.firing() and served.hook.received == pages_before
    assert httpx.get(f"{served.base}/api/v1/models", timeout=30).json()["serving_version"] == INT8
