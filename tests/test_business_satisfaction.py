"""Satisfaction against latency: on synthetic populations whose truth is known, the fitted
worth of a p99 cut covers the true effect when satisfaction falls with latency, and covers
zero when it does not (while long prompts, slower and rated lower, would mislead a fit on
latency alone); the endpoint and the Prometheus series serve the same fit."""

from __future__ import annotations

from typing import Any

import numpy as np
from _service_support import auth, config, running
from infersight.monitor.business import fit_satisfaction

T0 = 1_800_000_000.0


def _population(seed: int, latency_effect: float, n: int = 3000) -> tuple[np.ndarray, ...]:
    """Prompts of lognormal length; long ones are slower AND rated lower (the confounder);
    the chance a user is satisfied falls with latency by `latency_effect` log-odds per second."""
    rng = np.random.default_rng(seed)
    prompt = rng.lognormal(6.0, 1.0, n)
    latency = rng.gamma(2.0, 0.25, n) + prompt / 1500

    def truth(lat: np.ndarray) -> np.ndarray:
        return 1 / (1 + np.exp(-(2.0 - latency_effect * lat - 0.0005 * prompt)))

    satisfied = (rng.random(n) < truth(latency)).astype(float)
    return latency, satisfied, prompt, truth(latency), truth  # type: ignore[return-value]


def test_the_worth_of_a_p99_cut_is_recovered_within_its_interval() -> None:
    latency, satisfied, prompt, _, truth = _population(7, latency_effect=1.0)
    fit = fit_satisfaction(latency, satisfied, prompt, target_s=1.5, bootstrap=150)
    assert fit.worth is not None and fit.slope_low is not None and fit.slope_high is not None
    true_points = float(np.mean(truth(np.minimum(latency, 1.5)) - truth(latency)) * 100)  # type: ignore[operator]
    assert fit.worth.low <= true_points <= fit.worth.high
    assert fit.worth.low > 0  # a real effect is told from none
    assert fit.slope_low <= -1.0 <= fit.slope_high
    assert fit.curve[0].satisfaction > fit.curve[-1].satisfaction  # falls with latency
    assert all(p.low <= p.satisfaction <= p.high for p in fit.curve)
    assert "p99 cut from" in fit.worth.sentence() and "95% CI" in fit.worth.sentence()


def test_no_latency_effect_gives_an_interval_covering_zero_despite_the_confounder() -> None:
    latency, satisfied, prompt, _, _ = _population(8, latency_effect=0.0)
    fit = fit_satisfaction(latency, satisfied, prompt, target_s=1.5, bootstrap=150)
    assert fit.worth is not None
    assert fit.worth.low <= 0.0 <= fit.worth.high
    naive = fit_satisfaction(latency, satisfied, [None] * len(latency), target_s=1.5, bootstrap=150)
    assert naive.worth is not None and naive.worth.low > 0  # unadjusted, the long prompts' ratings mislead


def test_buckets_count_every_rated_request_once() -> None:
    latency, satisfied, prompt, _, _ = _population(9, latency_effect=1.0, n=500)
    fit = fit_satisfaction(latency, satisfied, prompt, bootstrap=20)
    assert sum(b.count for b in fit.buckets) == 500
    first = next(b for b in fit.buckets if b.count)
    assert first.satisfaction is not None and 0 <= first.satisfaction <= 1


def test_satisfaction_endpoint_and_metrics_serve_the_fit(tmp_path: Any) -> None:
    latency, satisfied, prompt, _, _ = _population(10, latency_effect=1.5, n=600)

    class Clock:
        t = T0

        def __call__(self) -> float:
            return self.t

    with running(config(tmp_path), clock=Clock()) as (app, client):
        events = [
            {"request_id": f"q-{i}", "model": "m", "model_version": "v1", "started_at": T0 - 3600 + i,
             "duration_s": float(lat), "ttft_s": float(lat) / 4, "prompt_tokens": int(p), "output_tokens": 50}
            for i, (lat, p) in enumerate(zip(latency, prompt, strict=True))
        ]  # fmt: skip
        assert client.post("/api/v1/events", json={"events": events}, headers=auth()).status_code == 200
        items = [{"request_id": f"q-{i}", "thumbs": "up" if s else "down"} for i, s in enumerate(satisfied)]
        answer = client.post("/api/v1/feedback", json={"feedback": items}, headers=auth())
        assert answer.json() == {"accepted": 600, "joined": 600}
        body = client.get("/api/v1/satisfaction", params={"target_ms": 1000}).json()
        assert "stratified by prompt length" in body["adjustment"]
        (group,) = body["groups"]
        assert (group["model_version"], group["path"], group["n"]) == ("v1", None, 600)
        assert group["worth"]["p99_to_s"] == 1.0 and group["worth"]["low"] > 0
        assert group["worth_sentence"].startswith("a p99 cut from")
        assert group["buckets"][-1]["le_s"] is None  # the open last bucket: JSON has no infinity
        assert client.get("/api/v1/satisfaction", params={"metric": "ttft"}).json()["groups"][0]["metric"] == "ttft"
        bad = client.get("/api/v1/satisfaction", params={"metric": "tpot"})
        assert bad.status_code == 422 and bad.json()["error"]["field"] == "query.metric"
        app.state.service.parts.business.refresh()
        text = client.get("/metrics").text
        ratio = float(np.mean(satisfied))
        line = next(x for x in text.splitlines() if x.startswith("infersight_satisfaction_ratio{"))
        assert 'version="v1"' in line and abs(float(line.split()[-1]) - ratio) < 1e-9
        assert 'infersight_satisfaction_bucket_ratio{le="0.5",metric="e2e",path="",version="v1"}' in text
        assert "infersight_build_info{" in text and 'python="3.' in text
