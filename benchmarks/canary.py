"""Canary analysis: how fast a bad canary is rolled back, and how often a good one is.

(a) The corrupted demo release as a 10% canary, end to end: `infersight demo`'s own
    incident (the real embedded runtime, the demo's Banking77 + hotel traffic, relevance
    scored by the service's embedding model on every answer, the CanaryController deciding).
    Reported: seconds from the canary's start to its rollback and the share of requests the
    canary served, per run (`--demo-runs`; each is a whole demo, minutes on 2 cores).
(b) False rollbacks: `--good` canaries of a release as good as the stable one, each taken
    through every step (10% -> 50% -> 100%, `requests_per_step` canary requests at each).
    This part is a SIMULATED request stream fed to the same analysis functions
    (alerts/actions/canary.py), not a runtime per canary: both arms draw server errors (1%),
    latencies (log-normal, heavy right tail), relevance (Beta(6, 4)) and output lengths
    from the same distributions. Also reported: the canary requests a simulated bad release
    (relevance Beta(2, 8)) needed before its rollback, over the same seeds.

    .venv/bin/python benchmarks/canary.py --demo-runs 1 --good 20
"""

from __future__ import annotations

import argparse
import io
import random
import statistics
import tempfile
import time
from pathlib import Path

from infersight.alerts.actions.canary import CanaryAnalysis, CanaryPolicy


def _request(rng: random.Random, bad: bool) -> tuple[str | None, float, float, int]:
    error = "EngineCrashed" if rng.random() < 0.01 else None
    latency = rng.lognormvariate(-1.2, 0.5)
    relevance = rng.betavariate(2, 8) if bad else rng.betavariate(6, 4)
    return error, latency, relevance, rng.randint(8, 32)


def simulate(seed: int, *, bad: bool, policy: CanaryPolicy) -> tuple[str, int, int]:
    """One canary to its end: (outcome, canary requests, all requests)."""
    rng = random.Random(seed)
    analysis = CanaryAnalysis(policy)
    canary_n = total = 0
    while True:
        canary = rng.random() < analysis.weight
        error, latency, relevance, tokens = _request(rng, bad and canary)
        analysis.observe(canary, error_type=error, latency_s=latency, output_tokens=tokens)
        if error is None:
            analysis.observe_relevance(canary, relevance)
        canary_n += canary
        total += 1
        verdict = analysis.verdict()
        if verdict.action == "rollback":
            return "rolled back: " + verdict.reason, canary_n, total
        if verdict.action == "promote":
            if verdict.weight >= 1.0 and analysis.weight >= policy.steps[-2]:
                return "promoted", canary_n, total
            analysis.advance()


def demo_run() -> tuple[float, float, str]:
    from infersight.monitor.service.demo import DemoOptions, run_demo

    with tempfile.TemporaryDirectory() as tmp:
        out = io.StringIO()
        result = run_demo(DemoOptions(data_dir=Path(tmp), fast=True), out)
        if not result.ok:
            raise SystemExit(f"demo failed at {result.failed_step}:\n{out.getvalue()}")
        steps = {s.name: s for s in result.steps}
        seconds = steps["canary rolled back"].at_s - steps["bad release canary"].at_s
        share = float(out.getvalue().split("the bad canary served ")[1].split("%")[0]) / 100
        return seconds, share, steps["canary rolled back"].detail


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--demo-runs", type=int, default=1)
    ap.add_argument("--good", type=int, default=20)
    args = ap.parse_args()
    policy = CanaryPolicy()
    t0 = time.perf_counter()
    good = [simulate(1000 + i, bad=False, policy=policy) for i in range(args.good)]
    rolled = [g for g in good if g[0] != "promoted"]
    print(f"(b) good canaries (simulated stream, policy steps {policy.steps}, {policy.requests_per_step} "
          f"canary requests per step, alpha {policy.alpha}): {len(rolled)} of {len(good)} rolled back")  # fmt: skip
    for outcome, _, _ in rolled:
        print(f"    {outcome}")
    bad = [simulate(1000 + i, bad=True, policy=policy) for i in range(args.good)]
    caught = [b for b in bad if b[0] != "promoted"]
    needed = [c for _, c, _ in caught]
    shares = [c / t for _, c, t in caught]
    print(f"    bad canaries (simulated, relevance Beta(2,8)): {len(caught)} of {len(bad)} rolled back; canary requests "
          f"before the rollback median {statistics.median(needed):.0f}, max {max(needed)}; share of all requests "
          f"median {statistics.median(shares):.1%}, max {max(shares):.1%}")  # fmt: skip
    print(f"    ({time.perf_counter() - t0:.1f} s)")
    for i in range(args.demo_runs):
        seconds, share, detail = demo_run()
        print(f"(a) demo run {i + 1}: corrupted release at 10%: rolled back {seconds:.1f} s after the canary "
              f"started, having served {share:.1%} of requests; {detail}")  # fmt: skip


if __name__ == "__main__":
    main()
