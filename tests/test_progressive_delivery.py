"""The controllers' side of the verdict: Flagger's webhooks, Argo Rollouts' web and Job metrics,
and `infersight releases wait`, against a running service (uvicorn on a loopback port).

The controllers themselves (Argo Rollouts, Flagger) run in a cluster we do not have here, so
small stand-ins named for them play their part, reading the worked examples in
deploy/kubernetes/ as the controllers would: `ArgoStandIn` evaluates an AnalysisTemplate's
`jsonPath` and `successCondition` / `failureCondition` (a small evaluator for the subset of
Argo's expression language the example uses: comparisons, `&&`, `||`, `!`, `result.x`,
`result[i]`); `FlaggerStandIn` posts a Canary's webhooks and reads their status codes as
Flagger does. The service's pairs are fed through its real pair evidence (the listener that
keeps the verdicts current), with pairs of the shapes a good and a bad release give.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
import yaml
from _service_support import TOKEN, config, wait_for
from conftest import free_port
from infersight.alerts.release.paired_checks import PairOutcome
from infersight.monitor.cli import main
from infersight.monitor.cli._releases import wait_for_verdict
from infersight.monitor.service import Service, UpstreamConfig, create_app
from infersight.monitor.service.config import ShadowUpstreamConfig
from infersight.monitor.store.tables import deploys
from sqlalchemy import select

DEPLOY = Path(__file__).resolve().parent.parent / "deploy" / "kubernetes"
CANARY_HASH, STABLE_HASH = "5c8b7d4f6", "7d9f8c6b5"


@dataclass
class Served:
    base: str
    service: Service

    def release(self, candidate: str, baseline: str, state: str) -> None:
        """The comparison's pairs afresh: `inconclusive` (3 good pairs), `pass` (10 good),
        `fail` (12 whose candidate answers a word where the baseline answers a sentence)."""
        evidence = self.service.parts.backend.pair_feed.evidence  # type: ignore[union-attr]
        evidence.forget(candidate, baseline)
        n, tokens = {"inconclusive": (3, 9), "pass": (10, 9), "fail": (12, 1)}[state]
        for _ in range(n):
            evidence.observe(PairOutcome(candidate, baseline, tokens, 9, "stop", "stop"))


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    port = free_port()
    cfg = config(
        tmp_path_factory.mktemp("progressive"), port=port,
        upstream=UpstreamConfig(url=f"http://127.0.0.1:{free_port()}", model="llama", metrics_url=""),
        shadow_upstream=ShadowUpstreamConfig(url=f"http://127.0.0.1:{free_port()}", share=1.0),
    )  # fmt: skip
    service = Service(cfg)
    server = uvicorn.Server(uvicorn.Config(create_app(cfg, service=service), host="127.0.0.1", port=port,
                                           log_level="warning"))  # fmt: skip
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        wait_for(lambda: server.started, 60, "the service started")
        yield Served(f"http://127.0.0.1:{port}", service)
    finally:
        server.should_exit = True
        thread.join(30)


# ---- a stand-in for Argo Rollouts' web metric provider -----------------------------------------------


class ArgoStandIn:
    """Argo's reading of a web metric's answer: `jsonPath` picks the result, and
    `successCondition` / `failureCondition` (Argo's expression language, the subset here)
    judge it: Successful, Failed, or Inconclusive when neither holds."""

    _TOKEN = re.compile(
        r'\s*(?:(\d+(?:\.\d+)?)|"([^"]*)"|\'([^\']*)\'|(==|!=|>=|<=|&&|\|\||[<>!()\[\].])|(\w+))'
    )

    @staticmethod
    def json_path(path: str, data: Any) -> Any:
        """Kubernetes JSONPath of the form `{$.a.b}`."""
        match = re.fullmatch(r"\{\$((?:\.\w+)*)\}", path)
        assert match, f"the stand-in reads {{$.a.b}} paths only, not {path}"
        for key in match.group(1).split(".")[1:]:
            data = data[key]
        return data

    def evaluate(self, expression: str, result: Any) -> bool:
        self.tokens = self._tokens(expression)
        self.result = result
        value = self._or()
        assert not self.tokens, f"unread: {self.tokens}"
        return bool(value)

    def _tokens(self, text: str) -> list[tuple[str, Any]]:
        out, pos = [], 0
        while pos < len(text.rstrip()):
            m = self._TOKEN.match(text, pos)
            assert m and m.end() > pos, f"the stand-in cannot read {text[pos:]!r}"
            number, dq, sq, op, name = m.groups()
            if number is not None:
                out.append(("value", float(number)))
            elif dq is not None or sq is not None:
                out.append(("value", dq if dq is not None else sq))
            elif op is not None:
                out.append(("op", op))
            else:
                out.append(("name", name))
            pos = m.end()
        return out

    def _take(self, op: str) -> bool:
        if self.tokens and self.tokens[0] == ("op", op):
            self.tokens.pop(0)
            return True
        return False

    def _or(self) -> Any:
        value = self._and()
        while self._take("||"):
            value = self._and() or value
        return value

    def _and(self) -> Any:
        value = self._compare()
        while self._take("&&"):
            right = self._compare()
            value = value and right
        return value

    def _compare(self) -> Any:
        left = self._unary()
        for op in ("==", "!=", ">=", "<=", ">", "<"):
            if self._take(op):
                right = self._unary()
                return {"==": left == right, "!=": left != right, ">=": left >= right,
                        "<=": left <= right, ">": left > right, "<": left < right}[op]  # fmt: skip
        return left

    def _unary(self) -> Any:
        if self._take("!"):
            return not self._unary()
        if self._take("("):
            value = self._or()
            assert self._take(")")
            return value
        kind, token = self.tokens.pop(0)
        if kind == "value":
            return token
        assert kind == "name", token
        if token in ("true", "false"):
            return token == "true"
        assert token == "result", f"the stand-in knows `result` only, not {token}"
        value = self.result
        while True:
            if self._take("."):
                value = value[self.tokens.pop(0)[1]]
            elif self._take("["):
                value = value[int(self.tokens.pop(0)[1])]
                assert self._take("]")
            else:
                return value


def _template() -> dict[str, Any]:
    (doc,) = yaml.safe_load_all((DEPLOY / "argo-rollouts" / "analysis-template.yaml").read_text())
    return dict(doc)


def _args(text: str, served: Served) -> str:
    values = {"canary-hash": CANARY_HASH, "stable-hash": STABLE_HASH, "api-token": TOKEN}
    text = re.sub(r"\{\{args\.([\w-]+)\}\}", lambda m: values[m.group(1)], text)
    return text.replace("http://llm-canary:8000", served.base)  # the Service's address, here


@pytest.mark.parametrize(("state", "phase"), [("pass", "Successful"), ("fail", "Failed"),
                                              ("inconclusive", "Inconclusive")])  # fmt: skip
def test_the_argo_web_metric_reads_pass_fail_and_inconclusive_as_argo_does(
    served: Served, state: str, phase: str
) -> None:
    (metric,) = [m for m in _template()["spec"]["metrics"] if "web" in m["provider"]]
    web = metric["provider"]["web"]
    served.release(CANARY_HASH, STABLE_HASH, state)
    headers = {h["key"]: _args(h["value"], served) for h in web["headers"]}
    r = httpx.get(_args(web["url"], served), headers=headers, timeout=web["timeoutSeconds"])
    assert r.status_code == 200, r.text
    argo = ArgoStandIn()
    result = argo.json_path(web["jsonPath"], r.json())
    succeeded = argo.evaluate(metric["successCondition"], result)
    failed = argo.evaluate(metric["failureCondition"], result)
    assert not (succeeded and failed)
    assert ("Successful" if succeeded else "Failed" if failed else "Inconclusive") == phase, r.json()


def test_the_argo_stand_in_reads_its_language_subset() -> None:
    argo = ArgoStandIn()
    assert argo.evaluate('result == "pass" && !(result != "pass")', "pass")
    assert argo.evaluate("result[0] >= 1 || result[0] < 0", [1.0])
    assert not argo.evaluate('result.verdict == "fail"', {"verdict": "pass"})
    assert argo.json_path("{$.checks.output_length}", {"checks": {"output_length": 3}}) == 3


@pytest.mark.parametrize(("state", "code"), [("pass", 0), ("fail", 1), ("inconclusive", 2)])
def test_the_argo_job_metric_exits_as_the_job_provider_reads_it(
    served: Served, state: str, code: int, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (metric,) = [m for m in _template()["spec"]["metrics"] if "job" in m["provider"]]
    (container,) = metric["provider"]["job"]["spec"]["template"]["spec"]["containers"]
    assert container["command"][0] == "infersight"
    argv = [_args(a, served) for a in container["command"][1:]]
    if state == "inconclusive":  # the example waits 15 minutes; here, a moment
        argv = [a for a in argv if not a.startswith(("--timeout", "--interval"))] + [
            "--timeout=1",
            "--interval=0.2",
        ]
    monkeypatch.setenv("INFERSIGHT_TOKEN", TOKEN)  # from the Secret, as the Job's env says
    served.release(CANARY_HASH, STABLE_HASH, state)
    assert main(argv) == code
    line = capsys.readouterr().out.strip()
    assert line.startswith(f"{state} {CANARY_HASH} against {STABLE_HASH}: "), line


# ---- a stand-in for Flagger ----------------------------------------------------------------------------


class FlaggerStandIn:
    """Posts a Canary's webhooks with Flagger's payload and reads them as Flagger does:
    `rollout` non-2xx is a failed check, `confirm-promotion` promotes on 2xx only,
    `rollback` 2xx rolls the canary back."""

    def __init__(self, canary: dict[str, Any], base: str) -> None:
        self.canary = canary
        self.base = base

    def call(self, hook_type: str, **metadata: str) -> httpx.Response:
        (hook,) = [h for h in self.canary["spec"]["analysis"]["webhooks"] if h["type"] == hook_type]
        url = re.sub(r"^http://[^/]+", self.base, hook["url"])
        body = {"name": self.canary["metadata"]["name"], "namespace": "default", "phase": "Progressing",
                "checksum": "8d6f5c", "metadata": {**hook["metadata"], "token": TOKEN, **metadata}}  # fmt: skip
        return httpx.post(url, json=body, timeout=10)

    def reads(self) -> dict[str, tuple[int, str]]:
        meaning = {"rollout": ("advance", "failed check"), "confirm-promotion": ("promote", "hold"),
                   "rollback": ("roll back", "go on")}  # fmt: skip
        out = {}
        for hook_type, (ok, not_ok) in meaning.items():
            r = self.call(hook_type)
            out[hook_type] = (r.status_code, ok if 200 <= r.status_code < 300 else not_ok)
        return out


def _canary() -> dict[str, Any]:
    (doc,) = yaml.safe_load_all((DEPLOY / "flagger" / "canary.yaml").read_text())
    return dict(doc)


def _flagger_rows(served: Served) -> list[tuple[str, str]]:
    with served.service.db.connect() as conn:
        rows = conn.execute(
            select(deploys).where(deploys.c.reason.like("flagger_%")).order_by(deploys.c.id)
        ).all()
    return [(r.reason, r.outcome) for r in rows if (r.to_version, r.from_version) == ("llm", "llm-primary")]


def test_flaggers_webhooks_answer_each_verdict_as_flagger_reads_them_and_record_each_change(
    served: Served,
) -> None:
    flagger = FlaggerStandIn(_canary(), served.base)
    expected = {
        "inconclusive": {"rollout": (200, "advance"), "confirm-promotion": (425, "hold"),
                         "rollback": (425, "go on")},
        "pass": {"rollout": (200, "advance"), "confirm-promotion": (200, "promote"), "rollback": (412, "go on")},
        "fail": {"rollout": (412, "failed check"), "confirm-promotion": (412, "hold"),
                 "rollback": (200, "roll back")},
    }  # fmt: skip
    for state, reads in expected.items():
        served.release("llm", "llm-primary", state)
        assert flagger.reads() == reads, state
        assert flagger.reads() == reads, state  # asked again every interval: the same answers
    failed = flagger.call("rollout").json()
    assert (
        failed["verdict"] == "fail" and "output shorter in 12 and longer in 0 of 12 pairs" in failed["reason"]
    )
    assert failed["error"]["message"].startswith("fail: ")
    # each change of a hook's answer is in the deploy history, a repeat is not
    hooks = ("flagger_check", "flagger_gate", "flagger_rollback")
    assert _flagger_rows(served) == [(h, s) for s in ("inconclusive", "pass", "fail") for h in hooks]
    history = httpx.get(f"{served.base}/api/v1/models", timeout=10).json()["deploys"]
    latest = next(d for d in history if d["reason"] == "flagger_rollback")
    assert latest["outcome"] == "fail" and latest["detail"].startswith(
        "200 to Flagger's rollback hook for default/llm"
    )


def test_flaggers_webhooks_refuse_what_they_cannot_answer_naming_the_field(served: Served) -> None:
    served.release("llm", "llm-primary", "pass")
    url = f"{served.base}/api/v1/releases/flagger/gate"
    body: dict[str, Any] = {"name": "llm", "namespace": "default", "metadata": {"candidate": "llm",
                                                                              "baseline": "llm-primary"}}  # fmt: skip
    assert httpx.post(url, json=body, timeout=10).status_code == 401
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    assert httpx.post(url, json=body, headers=bearer, timeout=10).status_code == 200  # the header also serves
    cases = [
        ({"baseline": "llm-primary"}, 422, "body.metadata.candidate"),
        ({"candidate": "llm", "baseline": "llm primary"}, 422, "body.metadata.baseline"),
        (
            {"candidate": "llm", "baseline": "llm-primary", "min_pairs": "many"},
            422,
            "body.metadata.min_pairs",
        ),
        ({"candidate": "llm", "baseline": "llm-primary", "min_pairs": "2"}, 422, "body.metadata.min_pairs"),
        ({"candidate": "never-deployed", "baseline": "llm-primary"}, 404, "body.metadata.candidate"),
    ]
    for metadata, status, field in cases:
        r = httpx.post(url, json=body | {"metadata": metadata}, headers=bearer, timeout=10)
        assert r.status_code == status and r.json()["error"]["field"] == field, (metadata, r.text)
    assert httpx.post(f"{served.base}/api/v1/releases/flagger/promote", json=body, headers=bearer,
                      timeout=10).status_code == 422  # fmt: skip
    # the caller's min_pairs above the pairs so far: the gate holds
    more = body | {"metadata": {**body["metadata"], "min_pairs": "50"}}
    assert httpx.post(url, json=more, headers=bearer, timeout=10).status_code == 425


# ---- infersight releases wait -----------------------------------------------------------------------


def test_releases_wait_waits_for_a_version_not_seen_yet_and_stops_at_the_verdict() -> None:
    now = [0.0]
    answers = iter([
        (0, {"detail": "cannot reach http://llm-canary:8000: ConnectError: [Errno 111] Connection refused"}),
        (404, {"error": {"field": "query.candidate", "message": "no version 'v2' has been seen here"}}),
        (200, {"verdict": "inconclusive", "candidate": "v2", "baseline": "v1", "pairs": 4, "min_pairs": 10,
               "reason": "4 of 10 pairs so far"}),
        (200, {"verdict": "pass", "candidate": "v2", "baseline": "v1", "pairs": 10, "min_pairs": 10,
               "reason": "10 pairs, no regression"}),
    ])  # fmt: skip
    slept: list[float] = []

    def sleep(s: float) -> None:
        slept.append(s)
        now[0] += s

    verdict, line = wait_for_verdict(lambda: next(answers), timeout_s=600, interval_s=10, clock=lambda: now[0],
                                     sleep=sleep)  # fmt: skip
    assert (verdict, slept) == ("pass", [10, 10, 10])
    assert line == "pass v2 against v1: 10 pairs (min 10): 10 pairs, no regression"
    stuck = (200, {"verdict": "inconclusive", "candidate": "v2", "baseline": "v1", "pairs": 4, "min_pairs": 10,
                   "reason": "4 of 10 pairs so far"})  # fmt: skip
    now[0], slept[:] = 0.0, []
    verdict, _ = wait_for_verdict(
        lambda: stuck, timeout_s=25, interval_s=10, clock=lambda: now[0], sleep=sleep
    )
    assert verdict == "inconclusive" and slept == [10, 10, 5]


def test_releases_wait_reports_bad_input_in_one_line(
    served: Served, capsys: pytest.CaptureFixture[str]
) -> None:
    served.release(CANARY_HASH, STABLE_HASH, "pass")
    common = ["releases", "wait", "--url", served.base, "--candidate", CANARY_HASH, "--baseline", STABLE_HASH]
    assert main([*common, "--timeout", "soon"]) == 2
    assert "--timeout: not a duration: 'soon'" in capsys.readouterr().err
    assert main([*common, "--token", "wrong-token-0123456789"]) == 2
    assert "HTTP 401" in capsys.readouterr().err
    assert main([*common, "--token", TOKEN, "--min-pairs", "1"]) == 2
    assert "query.min_pairs" in capsys.readouterr().err
    assert main([*common, "--token", TOKEN, "--timeout", "1m"]) == 0
    assert capsys.readouterr().out.startswith(f"pass {CANARY_HASH} against {STABLE_HASH}: 10 pairs")
