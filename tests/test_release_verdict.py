"""The release verdict a progressive-delivery controller asks for, through a proxy-mode release.

The topology of deploy/kubernetes/: each pod runs an inference server with an infersight
sidecar in proxy mode in front of it. The canary pod's sidecar shadows a share of its live
requests to the stable pods' sidecar (the stable Service), and each sidecar knows its pod's
release from the controller's label (Argo Rollouts' `rollouts-pod-template-hash`, as
`upstream.release`) and names it in the `x-infersight-release` header of its answers. Both
inference servers serve the same model name, as they do in a rollout, so the `model` field
cannot tell the releases apart: only the header does.

The inference servers (vLLM, TGI) are external boundaries we do not run here: small real
HTTP servers on loopback answer in the OpenAI wire format in their place. The stable sidecar
is a real infersight service under uvicorn; the canary sidecar is the service under test.
"""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import uvicorn
from _service_support import TOKEN, auth, config, wait_for
from conftest import free_port
from fastapi.testclient import TestClient
from infersight.monitor.service import UpstreamConfig, create_app
from infersight.monitor.service.config import ShadowUpstreamConfig
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

STABLE_HASH, GOOD_HASH, BAD_HASH = "7d9f8c6b5", "5c8b7d4f6", "6f5d9c8b7"
SENTENCE = ["you", "can", "top", "up", "in", "the", "app", "under", "wallet"]


class FakeInferenceServer:
    """An OpenAI-compatible server on loopback answering `words` as model `llama`; counts bodies."""

    def __init__(self, words: list[str]) -> None:
        self.words = words
        self.seen: list[dict[str, Any]] = []
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        app = Starlette(routes=[Route("/v1/chat/completions", self._answer, methods=["POST"])])
        self.server = uvicorn.Server(
            uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off")
        )
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    async def _answer(self, request: Request) -> Response:
        body = orjson.loads(await request.body())
        self.seen.append(body)
        text = " ".join(self.words)
        if body.get("stream"):  # one chunk per word, then the usage, as vLLM streams

            async def chunks() -> AsyncIterator[bytes]:
                for i, word in enumerate(self.words):
                    choice = {"index": 0, "delta": {"content": word if i == 0 else f" {word}"},
                              "finish_reason": "stop" if i == len(self.words) - 1 else None}  # fmt: skip
                    yield b"data: " + orjson.dumps({"model": "llama", "choices": [choice]}) + b"\n\n"
                usage = {"prompt_tokens": 4, "completion_tokens": len(self.words)}
                yield b"data: " + orjson.dumps({"model": "llama", "choices": [], "usage": usage}) + b"\n\n"
                yield b"data: [DONE]\n\n"

            return StreamingResponse(chunks(), media_type="text/event-stream")
        return JSONResponse({
            "id": "c", "model": "llama", "usage": {"prompt_tokens": 4, "completion_tokens": len(self.words)},
            "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": text}}],
        })  # fmt: skip

    def __enter__(self) -> FakeInferenceServer:
        self.thread.start()
        wait_for(lambda: self.server.started, timeout=10)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(10)


class StableSidecar:
    """The stable pod: its inference server and a real infersight sidecar before it, which
    shadows to the stable Service (itself), as the pod template of a rollout says."""

    def __init__(self, tmp: Path) -> None:
        self.vllm = FakeInferenceServer(SENTENCE)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.tmp = tmp

    def __enter__(self) -> StableSidecar:
        self.vllm.__enter__()
        cfg = config(
            self.tmp, port=self.port,
            upstream=UpstreamConfig(url=self.vllm.url, model="llama", release=STABLE_HASH, metrics_url=""),
            shadow_upstream=ShadowUpstreamConfig(url=self.url, share=1.0, release_header="x-infersight-release"),
        )  # fmt: skip
        self.app: Any = create_app(cfg)
        self.server = uvicorn.Server(uvicorn.Config(self.app, host="127.0.0.1", port=self.port,
                                                    log_level="warning"))  # fmt: skip
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        wait_for(lambda: self.server.started, timeout=60, what="the stable sidecar started")
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(30)
        self.vllm.__exit__()


@pytest.fixture(scope="module")
def stable(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StableSidecar]:
    with StableSidecar(tmp_path_factory.mktemp("stable")) as pod:
        yield pod


def _canary(tmp_path: Path, vllm: FakeInferenceServer, stable: StableSidecar, release: str) -> TestClient:
    cfg = config(
        tmp_path,
        upstream=UpstreamConfig(url=vllm.url, model="llama", release=release, timeout_s=30, metrics_url=""),
        shadow_upstream=ShadowUpstreamConfig(
            url=stable.url, share=1.0, max_in_flight=8, timeout_s=30, release_header="x-infersight-release"
        ),
    )
    return TestClient(create_app(cfg), raise_server_exceptions=False)


def _ask(client: TestClient, i: int, *, stream: bool = False) -> Any:
    body = {
        "model": "llama",
        "messages": [{"role": "user", "content": f"how do I top up? {i}"}],
        "max_tokens": 16,
        "stream": stream,
    }
    r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    return r


def _verdict(client: TestClient, candidate: str, **params: Any) -> Any:
    return client.get("/api/v1/releases/verdict", params={"candidate": candidate, "baseline": STABLE_HASH,
                                                          **params}, headers=auth())  # fmt: skip


def _pairs_scored(client: TestClient, candidate: str, n: int) -> bool:
    feed: Any = client.app.state.service.parts.backend.pair_feed  # type: ignore[attr-defined]
    feed.score()  # the `pairs` job's work, now (the scheduler's beat may also have done it)
    return bool(feed.evidence.checks(candidate, STABLE_HASH)[0] >= n)


def test_a_good_release_is_inconclusive_before_min_pairs_then_passes_on_pairs_named_by_the_header(
    stable: StableSidecar, tmp_path: Path
) -> None:
    shadows_before = len(stable.vllm.seen)
    with FakeInferenceServer(SENTENCE) as vllm, _canary(tmp_path, vllm, stable, GOOD_HASH) as client:
        first = _ask(client, 0)
        assert first.headers["x-infersight-release"] == GOOD_HASH and first.json()["model"] == "llama"
        streamed = _ask(client, 1, stream=True)  # a streamed answer names its release too, and is paired
        assert streamed.headers["x-infersight-release"] == GOOD_HASH and "data: [DONE]" in streamed.text
        for i in range(2, 4):
            _ask(client, i)
        wait_for(lambda: _pairs_scored(client, GOOD_HASH, 4), what="4 pairs scored")
        early = _verdict(client, GOOD_HASH)
        assert early.status_code == 200, early.text
        body = early.json()
        assert (body["verdict"], body["pairs"], body["min_pairs"]) == ("inconclusive", 4, 10)
        assert body["reason"].startswith("4 of 10 pairs so far")
        assert body["source"].startswith(f"shadow_upstream {stable.url}")
        for i in range(4, 10):
            _ask(client, i)
        wait_for(lambda: _pairs_scored(client, GOOD_HASH, 10), what="10 pairs scored")
        answer = _verdict(client, GOOD_HASH).json()
        assert answer["verdict"] == "pass" and answer["pairs"] == 10, answer
        assert set(answer["checks"]) == {"output_length", "finish_agreement"}  # measured by proxy pairs
        assert all(c["passed"] is True and c["pairs"] == 10 for c in answer["checks"].values())
        assert answer["checks"]["output_length"]["figure"] == pytest.approx(1.0)
        assert (
            "not checked: relevance" in answer["reason"]
            and "step_time (the pairs carry no" in answer["reason"]
        )
        # a larger min_pairs asked for: the same figures, not yet enough for it
        more = _verdict(client, GOOD_HASH, min_pairs=40).json()
        assert (more["verdict"], more["pairs"], more["min_pairs"]) == ("inconclusive", 10, 40)
        report = client.get(answer["report"].replace(str(client.base_url), ""))
        assert report.status_code == 200 and report.text.startswith(f"pass {GOOD_HASH} against {STABLE_HASH}")
        # the stable sidecar answered each shadow once and did not shadow it again
        assert len(stable.vllm.seen) - shadows_before == 10


def test_the_verdict_is_read_from_the_state_the_pairs_left_not_computed_per_call(
    stable: StableSidecar, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from infersight.alerts.release import paired_checks as pairs

    with FakeInferenceServer(SENTENCE) as vllm, _canary(tmp_path, vllm, stable, GOOD_HASH) as client:
        for i in range(10):
            _ask(client, i)
        wait_for(lambda: _pairs_scored(client, GOOD_HASH, 10), what="10 pairs scored")
        before = _verdict(client, GOOD_HASH).json()

        def no_computation(*args: object, **kwargs: object) -> None:
            raise AssertionError("the verdict endpoint computed the analysis")

        # every way to compute the paired checks is gone: the answers come from the kept state
        monkeypatch.setattr(pairs.PairedAnalysis, "checks", no_computation)
        monkeypatch.setattr(pairs.PairedEvidence, "checks", no_computation)
        monkeypatch.setattr(pairs.PairedEvidence, "comparisons", no_computation)
        for _ in range(20):
            again = _verdict(client, GOOD_HASH)
            assert again.status_code == 200 and again.json() == before
        assert "infersight_release_pairs" in client.get("/metrics").text


def test_a_bad_release_fails_naming_the_check_and_its_pairs(stable: StableSidecar, tmp_path: Path) -> None:
    with FakeInferenceServer(["ok"]) as vllm, _canary(tmp_path, vllm, stable, BAD_HASH) as client:
        for i in range(12):
            _ask(client, i)
        wait_for(lambda: _pairs_scored(client, BAD_HASH, 12), what="12 pairs scored")
        answer = _verdict(client, BAD_HASH).json()
        assert answer["verdict"] == "fail", answer
        length = answer["checks"]["output_length"]
        assert length["passed"] is False and length["p"] < 0.01 / 5 and length["figure"] < 0.3
        assert "output shorter in 12 and longer in 0 of 12 pairs" in answer["reason"]
        metrics = client.get("/metrics").text
        assert (f'infersight_release_check_passed{{baseline="{STABLE_HASH}",candidate="{BAD_HASH}",'
                f'check="output_length"}} 0.0') in metrics  # fmt: skip
        assert f'infersight_release_pairs{{baseline="{STABLE_HASH}",candidate="{BAD_HASH}"}} 12.0' in metrics


def test_bad_questions_are_refused_naming_the_field(stable: StableSidecar, tmp_path: Path) -> None:
    with FakeInferenceServer(SENTENCE) as vllm, _canary(tmp_path, vllm, stable, GOOD_HASH) as client:
        _ask(client, 0)
        wait_for(lambda: _pairs_scored(client, GOOD_HASH, 1), what="a pair scored")
        params = {"candidate": GOOD_HASH, "baseline": STABLE_HASH}
        assert client.get("/api/v1/releases/verdict", params=params).status_code == 401
        cases = [
            ({"candidate": "never-served"}, 404, "query.candidate"),
            ({"baseline": "typo-hash"}, 404, "query.baseline"),
            ({"candidate": "bad name"}, 422, "query.candidate"),
            ({"min_pairs": 3}, 422, "query.min_pairs"),
            ({"min_pairs": "ten"}, 422, "query.min_pairs"),
            ({"baseline": None}, 422, "query.baseline"),
        ]
        for change, status, field in cases:
            query = {k: v for k, v in (params | change).items() if v is not None}
            for method in ("GET", "POST"):
                r = client.request(method, "/api/v1/releases/verdict", params=query, headers=auth())
                assert r.status_code == status and r.json()["error"]["field"] == field, (change, r.text)
        assert client.post("/api/v1/releases/verdict", params=params, headers=auth(TOKEN)).status_code == 200


def test_the_pods_release_comes_from_the_environment_and_a_bad_one_is_refused_naming_its_field() -> None:
    from infersight.monitor.service.config import ConfigInvalid, config_from_mapping

    mapping = {"upstream": {"url": "http://127.0.0.1:8001"}}
    parsed = config_from_mapping(mapping, env={"INFERSIGHT_UPSTREAM_RELEASE": GOOD_HASH})
    assert parsed.upstream is not None and parsed.upstream.release == GOOD_HASH
    # an empty label (a pod without it): the answer's `model` names the version, as before
    assert config_from_mapping(mapping, env={"INFERSIGHT_UPSTREAM_RELEASE": ""}).upstream.release is None  # type: ignore[union-attr]
    with pytest.raises(ConfigInvalid) as err:
        config_from_mapping(mapping, env={"INFERSIGHT_UPSTREAM_RELEASE": "hash with spaces"})
    assert err.value.field == "upstream.release"
    with pytest.raises(ConfigInvalid) as err:
        config_from_mapping(
            {**mapping, "shadow_upstream": {"url": "http://x", "release_header": "x release"}}
        )
    assert "shadow_upstream.release_header" in str(err.value)


def test_without_pairs_the_verdict_says_why_none_can_be_judged(tmp_path: Path) -> None:
    from infersight.monitor.service.pair_feed import PROXY_PAIRS_OFF

    with FakeInferenceServer(SENTENCE) as vllm:
        cfg = config(
            tmp_path, upstream=UpstreamConfig(url=vllm.url, model="llama", release=GOOD_HASH, metrics_url="")
        )
        with TestClient(create_app(cfg), raise_server_exceptions=False) as client:
            _ask(client, 0)
            r = _verdict(client, GOOD_HASH)
            assert r.status_code == 409 and r.json()["error"]["message"].endswith(PROXY_PAIRS_OFF), r.text
            assert "infersight_release_pairs" not in [
                line.split("{")[0]
                for line in client.get("/metrics").text.splitlines()
                if not line.startswith("#")
            ]


def test_a_stable_pod_whose_shadow_is_its_own_release_stops_shadowing(stable: StableSidecar) -> None:
    import httpx

    def outcome(name: str) -> float:
        prefix = f'infersight_shadow_requests_total{{model="llama",outcome="{name}"}} '
        text = httpx.get(f"{stable.url}/metrics", timeout=10).text
        (line,) = [x for x in text.splitlines() if x.startswith(prefix)]
        return float(line.split()[-1])

    def ask() -> None:
        body = {
            "model": "llama",
            "messages": [{"role": "user", "content": "how do I top up?"}],
            "max_tokens": 16,
        }
        r = httpx.post(f"{stable.url}/v1/chat/completions", json=body, timeout=30)
        assert r.status_code == 200 and r.headers["x-infersight-release"] == STABLE_HASH

    seen, completed = len(stable.vllm.seen), outcome("completed")
    ask()  # shadowed to the stable Service: to itself, which names its own release
    wait_for(lambda: outcome("completed") == completed + 1, what="the first shadow answered")
    skipped = outcome("same_release")
    for _ in range(5):
        ask()
    assert outcome("same_release") == skipped + 5
    assert len(stable.vllm.seen) - seen == 7  # 6 requests and the one shadow that found it out
    feed = stable.app.state.service.parts.backend.pair_feed  # no pair of a release with itself
    assert feed.score() == 0 and feed.scored == 0


def _pairs_with_divergence(per_pair: list[float]) -> tuple[int, tuple[Any, ...]]:
    """A real PairedAnalysis fed pairs whose answers agree in length and finish reason and whose
    cross log-probabilities put each pair's divergence at the given nats per token."""
    from infersight.alerts.release.paired_checks import PairedAnalysis, PairOutcome

    analysis = PairedAnalysis()
    for d in per_pair:
        tokens = 16
        analysis.observe(PairOutcome(
            "v2", "v1", tokens, tokens, "length", "length",
            candidate_logprob=-20.0, baseline_logprob=-20.0,
            candidate_under_baseline=-20.0 - d * tokens, baseline_under_candidate=-20.0 - d * tokens,
        ))  # fmt: skip
    return analysis.pairs, analysis.checks()


def test_the_verdict_waits_for_divergence_to_be_decided_as_a_canary_step_does() -> None:
    """Past min_pairs with every other check quiet, a release whose divergence is neither
    regressed nor cleared is inconclusive (naming it), not passed on a few noisy pairs; once the
    check clears the verdict passes; a bad one fails on it; after max_pairs an undecided check
    no longer holds the verdict, which says so."""
    from infersight.alerts.release.paired_checks import PairPolicy
    from infersight.monitor.service.release_verdicts import ReleaseVerdicts, judge

    policy = PairPolicy()
    decide, max_pairs = policy.decide, policy.max_pairs
    # noisy pairs around the line: undecided
    noisy = [0.0, 0.1, 0.02, 0.09, 0.0, 0.08, 0.03, 0.1, 0.01, 0.07, 0.04, 0.06]
    pairs, checks = _pairs_with_divergence(noisy)
    div = next(c for c in checks if c.name == "divergence")
    assert not div.cleared and not div.regressed
    verdict = judge("v2", "v1", pairs, checks, policy.min_pairs, decide, max_pairs)
    assert verdict.verdict == "inconclusive" and "divergence not decided after 12 pairs" in verdict.reason
    assert next(c for c in verdict.checks if c.name == "divergence").passed is None
    # without the policy's `decide` the same state would have passed: what this rule changes
    assert judge("v2", "v1", pairs, checks, policy.min_pairs).verdict == "pass"
    # a good release: both sides read each other's answers as well as their own
    pairs, checks = _pairs_with_divergence([0.0, 0.01] * 15)
    assert next(c for c in checks if c.name == "divergence").cleared
    verdict = judge("v2", "v1", pairs, checks, policy.min_pairs, decide, max_pairs)
    assert verdict.verdict == "pass" and "undecided" not in verdict.reason
    # a quietly bad one: 0.3 nats/token worse
    pairs, checks = _pairs_with_divergence([0.3, 0.35] * 6)
    verdict = judge("v2", "v1", pairs, checks, policy.min_pairs, decide, max_pairs)
    assert verdict.verdict == "fail" and "nats/token" in verdict.reason
    # out of pairs while undecided: passes, saying divergence stayed undecided
    pairs, checks = _pairs_with_divergence(noisy * 9)
    assert pairs >= max_pairs and not next(c for c in checks if c.name == "divergence").cleared
    verdict = judge("v2", "v1", pairs, checks, policy.min_pairs, decide, max_pairs)
    assert verdict.verdict == "pass" and "divergence still undecided after 108 pairs" in verdict.reason
    # the service's store judges with the policy it is given
    store = ReleaseVerdicts(min_pairs=policy.min_pairs, source="test", decide=decide, max_pairs=max_pairs)
    store.update("v2", "v1", *_pairs_with_divergence(noisy))
    assert store.lookup("v2", "v1").verdict == "inconclusive"
    assert store.lookup("v2", "v1", min_pairs=11).verdict == "inconclusive"
