"""Canary analysis: how fast a bad canary is rolled back, and how often a good one is.

(a) The corrupted demo release as a 10% canary, end to end: `infersight demo`'s own
    incident (the real embedded runtime, the demo's Banking77 + hotel traffic, relevance
    scored by the service's embedding model on every answer, the CanaryController deciding).
    Reported: seconds from the canary's start to its rollback and the share of requests the
    canary served, per run (`--demo-runs`; each is a whole demo, minutes on 2 cores).
(c) Real canaries (`--real N`, `--real-bad M`): the real embedded runtime serving the demo
    model, N canaries of a GOOD release (the stable version's own weights registered again
    as a new version, or `--good-version`, e.g. the int8 one) and M of the corrupted one,
    each from its start to its promotion (10% -> 50% -> 100%, `--per-step` canary requests
    at each step) or its rollback. Banking77 questions, one new `user` per request (so the
    assignment is the runtime's own hash), answers sampled at temperature 1, relevance and
    the answers' embeddings from all-MiniLM-L6-v2 as the service's embedding job computes
    them, fed to the same `CanaryController` the service runs. Reported per kind: rollbacks,
    seconds from start to decision, requests and the canary's share of them.
(d) Paired against unpaired (`--paired N`, `--paired-bad M`): on the real runtime, canaries
    of the good int8 build and of the corrupted release, each run once with the paired checks
    (the runtime also answers `--pair-share` of requests with the other version; relevance,
    similarity, length and finish reason compared on the same requests) and once arm against
    arm, alternated. With `--steer` the clients steer their arm (they know the
    assignment and ask the canary for 1 token, the stable version for `--max-tokens`).
    With `--mix-change` the clients ask hotel utterances with `max_tokens` drawn from 2..32
    (both arms alike) instead of Banking77 questions at `--max-tokens`; `--modes` runs one mode.
    Reported per mode: good canaries rolled back, requests until the corrupted one is rolled
    back (median, max) and the share it served; the shadow's cost: process CPU seconds per
    live request and the live p99 (arrival to last token), paired against unpaired.
    With `--model smollm2` the stable version is SmolLM2-135M-Instruct's fp32 import and the
    canaries are its `--candidates` (benchmarks/_candidates.py builds them under `--work`),
    `--runs` each, the order drawn anew for each round and each run's users from its own
    seed, the pair share the shipped one unless `--pair-share` says otherwise; each request
    is a one-turn chat rendered with the chat template of the version its arm serves.
(b) False rollbacks: `--good` canaries of a release as good as the stable one, each taken
    through every step (10% -> 50% -> 100%, `requests_per_step` canary requests at each).
    This part is a SIMULATED request stream fed to the same analysis functions
    (alerts/release/canary.py), not a runtime per canary: both arms draw server errors (1%),
    latencies (log-normal, heavy right tail), relevance (Beta(6, 4)) and output lengths
    from the same distributions. Also reported: the canary requests a simulated bad release
    (relevance Beta(2, 8)) needed before its rollback, over the same seeds.

    .venv/bin/python benchmarks/canary.py --demo-runs 1 --good 20 --real 20 --real-bad 5 --per-step 100
    .venv/bin/python benchmarks/canary.py --demo-runs 0 --good 0 --paired 4 --paired-bad 3 --steer
    .venv/bin/python benchmarks/canary.py --demo-runs 0 --good 0 --paired 20 --paired-bad 5 --per-step 30 --mix-change
    .venv/bin/python benchmarks/canary.py --demo-runs 0 --good 0 --model smollm2 --modes paired --runs 20 --per-step 30 --max-tokens 16
    .venv/bin/python benchmarks/canary.py --demo-runs 0 --good 0 --model smollm2 --modes paired --candidates int8,fp8 --canary-latency own
"""

from __future__ import annotations

import argparse
import contextlib
import io
import random
import statistics
import tempfile
import time
from pathlib import Path

from _candidates import CANDIDATES, RealModel, RunOutcome, first_check
from infersight.alerts.release.canary import LATENCY_MODES, CanaryAnalysis, CanaryPolicy


def _cpu() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown"


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


def real_canaries(n_good: int, n_bad: int, per_step: int, good_version: str | None, max_tokens: int) -> None:
    """(c): canaries on the real runtime, decided by the service's controller."""
    import shutil

    import numpy as np
    from infersight.alerts.release.canary import CanaryController
    from infersight.engine import Registry, Runtime
    from infersight.monitor.cli import main as cli
    from infersight.monitor.data import banking77
    from infersight.monitor.drift import SentenceTransformerEmbedder

    stable, bad = "mixtral_banking_fp32-v1.0", "mixtral_banking_fp32-v1.1"
    questions = [u.text for u in banking77()]
    embedder = SentenceTransformerEmbedder()
    policy = CanaryPolicy(requests_per_step=per_step)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "registry"
        with contextlib.redirect_stdout(io.StringIO()):
            assert cli(["models", "init-demo", str(root)]) == 0
        registry = Registry(root)
        good = good_version
        if good is None:  # the stable weights again, as a new release
            good = "mixtral_banking_fp32-v1.2"
            copy = Path(tmp) / "good"
            shutil.copytree(registry.get(stable).path, copy)
            registry.register(good, copy, parent=stable)
        runtime = Runtime(registry, max_batch_size=8, max_prompt_tokens=128, max_seq_len=192)
        runtime.start(stable)
        tok = runtime.tokenizer
        rng = random.Random(0)
        results: dict[str, list[tuple[str, float, int, int]]] = {"good": [], "bad": []}
        try:
            for kind, candidate, count in (("good", good, n_good), ("bad", bad, n_bad)):
                for run in range(count):
                    controller = CanaryController(runtime.canary, policy)
                    controller.begin(candidate, stable, policy.steps[0])
                    unsubscribe = runtime.subscribe(controller.on_event)
                    runtime.canary.start(candidate, policy.steps[0])
                    t0 = time.perf_counter()
                    while runtime.canary.status is not None:
                        batch = [rng.choice(questions) for _ in range(8)]
                        handles = [
                            runtime.submit(tok.encode(q).ids, max_new_tokens=max_tokens, temperature=1.0,
                                           user=f"run{kind}{run}-{rng.getrandbits(48)}")
                            for q in batch
                        ]  # fmt: skip
                        done = [h.result(timeout=120) for h in handles]
                        answers = [tok.decode(list(d.token_ids)) for d in done]
                        rows = embedder.encode([*batch, *answers])
                        ps, rs = rows[: len(batch)], rows[len(batch) :]
                        for d, p, r in zip(done, ps, rs, strict=True):
                            controller.on_relevance(d.model_version, float(np.dot(p, r)))
                            controller.on_output(d.model_version, r.tolist())
                    seconds = time.perf_counter() - t0
                    while not controller.decisions or (
                        controller.decisions[-1].action == "promote"
                        and (controller.decisions[-1].weight < 1.0)
                    ):  # the decision is recorded just after it is applied
                        time.sleep(0.01)
                    unsubscribe()
                    last = controller.decisions[-1]
                    total = last.canary_requests + last.stable_requests
                    results[kind].append((last.action, seconds, last.canary_requests, total))
                    print(f"    {kind} canary {run + 1}: {last.action} after {seconds:.1f} s, "
                          f"{last.canary_requests} of {total} requests on the canary: {last.reason[:160]}",
                          flush=True)  # fmt: skip
                    if runtime.serving_version != stable:  # promoted: the next canary starts from stable
                        runtime.deploy(stable, reason="deploy")
        finally:
            runtime.stop(drain=False)
    for kind, rows_ in results.items():
        if not rows_:
            continue
        rolled = [r for r in rows_ if r[0] == "rollback"]
        secs = [r[1] for r in (rolled if kind == "bad" else rows_)]
        shares = [r[2] / max(1, r[3]) for r in (rolled if kind == "bad" else rows_)]
        print(f"(c) real {kind} canaries ({per_step} canary requests per step, steps {policy.steps}, alpha "
              f"{policy.alpha}): {len(rolled)} of {len(rows_)} rolled back; seconds to the decision median "
              f"{statistics.median(secs):.1f} (max {max(secs):.1f}); canary share of requests median "
              f"{statistics.median(shares):.1%} (max {max(shares):.1%})")  # fmt: skip


def paired_canaries(
    n_good: int,
    n_bad: int,
    per_step: int,
    max_tokens: int,
    steer: bool,
    share: float,
    mix_change: bool = False,
    modes: tuple[bool, ...] = (True, False),
    real: RealModel | None = None,
    similarity: str = "without_divergence",
    latency: str = "whole",
) -> None:
    """(d): the same canaries decided with and without pairs, alternated, on the real runtime.
    With `real` (`--model smollm2`): its candidates instead of the demo's two releases."""
    from infersight.alerts.release.canary import CanaryController
    from infersight.alerts.release.paired_checks import PairedEvidence, PairPolicy
    from infersight.engine import Registry, Runtime
    from infersight.engine.runtime_canary import user_bucket
    from infersight.monitor import drift as d
    from infersight.monitor.cli import main as cli
    from infersight.monitor.data import banking77, hotels
    from infersight.monitor.service.pair_feed import PairFeed

    stable, good, bad = "mixtral_banking_fp32-v1.0", "mixtral_banking_int8-v1.0", "mixtral_banking_fp32-v1.1"
    questions = [u.text for u in banking77()]
    new_mix = [u.text for u in hotels()]  # --mix-change: what the clients ask once the canary starts
    detector = d.DriftDetector(d.SentenceTransformerEmbedder())
    policy = CanaryPolicy(steps=(0.5, 1.0), requests_per_step=per_step, latency=latency)
    rows: dict[tuple[bool, str], list[tuple[str, int, float]]] = {}
    cost: dict[bool, list[float]] = {True: [], False: []}  # CPU seconds per live request
    durations: dict[bool, list[float]] = {True: [], False: []}
    outcomes: list[RunOutcome] = []
    with tempfile.TemporaryDirectory() as tmp:
        if real is None:
            root = Path(tmp) / "registry"
            with contextlib.redirect_stdout(io.StringIO()):
                assert cli(["models", "init-demo", str(root)]) == 0
            plan = [("good", good, run) for run in range(n_good)] + [
                ("bad", bad, run) for run in range(n_bad)
            ]
            seeds = [0] * len(plan)
        else:
            root, stable = real.candidates.registry, real.candidates.stable
            plan, seeds = real.plan()
        # a real model's chat template wraps every question in its default system message: a
        # longer one (the terse candidate's) takes the longest Banking77 questions past 128 tokens
        prompt_limit = 128 if real is None else 256
        runtime = Runtime(Registry(root), max_batch_size=8, max_prompt_tokens=prompt_limit,
                          max_seq_len=prompt_limit + 64)  # fmt: skip
        runtime.start(stable)
        tok = runtime.tokenizer
        encode = real.encoder(runtime) if real is not None else (lambda q, version: tok.encode(q).ids)
        rng = random.Random(0)
        try:
            for run, ((kind, candidate, nth), seed) in enumerate(zip(plan, seeds, strict=True)):
                if real is not None:  # the users, hence which requests each arm serves, differ per run
                    if not real.round_may_start(nth, run % len(real.names) == 0):
                        break
                    rng = random.Random(seed)
                order = (run % 2 == 0, run % 2 == 1) if len(modes) == 2 else modes
                for paired in order:  # both modes, the order alternated
                    runtime.shadow.configure(share=share if paired else 0.0)
                    controller = CanaryController(
                        runtime.canary,
                        policy,
                        pairs=PairPolicy(similarity_decides=similarity) if paired else None,
                    )
                    feed = PairFeed(runtime, PairedEvidence(), canary=controller)
                    feed.detector = detector
                    controller.begin(candidate, stable, policy.steps[0])
                    analysis = controller.analysis  # kept: the controller lets it go at the end
                    unsubscribe = [runtime.subscribe(controller.on_event), runtime.subscribe(feed.on_event)]
                    runtime.canary.start(candidate, policy.steps[0])
                    started = time.perf_counter()
                    while runtime.canary.status is not None:
                        users = [f"r{run}{paired}-{rng.getrandbits(48)}" for _ in range(8)]
                        batch = [rng.choice(new_mix if mix_change else questions) for _ in users]
                        weight = runtime.canary.status.weight
                        arms = [user_bucket(u, candidate) < weight for u in users]  # the runtime's own split
                        budget = [
                            1 if steer and arm else (rng.randint(2, 32) if mix_change else max_tokens)
                            for arm in arms
                        ]
                        c0 = time.process_time()
                        # each version (the live arm, and the shadow on the other) answers the chat
                        # rendered in its own template, as the service renders it
                        handles = [
                            runtime.submit(encode(q, candidate if arm else stable), max_new_tokens=b,
                                           temperature=1.0, user=u,
                                           prompts_by_version={v: encode(q, v) for v in (stable, candidate)}
                                           if real is not None else None)
                            for q, b, u, arm in zip(batch, budget, users, arms, strict=True)
                        ]  # fmt: skip
                        done = [h.result(timeout=120) for h in handles]
                        cost[paired].append((time.process_time() - c0) / len(done))
                        durations[paired].extend(x.duration_s for x in done)
                        answers = [tok.decode(list(x.token_ids)) for x in done]
                        embedded = detector.embed(d.TextWindow.of(batch, answers))[0]
                        for x, r, v in zip(
                            done, embedded.relevance, embedded.response_embeddings, strict=True
                        ):
                            controller.on_relevance(x.model_version, float(r))
                            controller.on_output(x.model_version, v.tolist())
                        time.sleep(0.05)  # the last shadows finish
                        feed.score()
                    while not controller.decisions or (
                        controller.decisions[-1].action == "promote" and controller.decisions[-1].weight < 1.0
                    ):
                        time.sleep(0.01)
                    for u in unsubscribe:
                        u()
                    last = controller.decisions[-1]
                    total = last.canary_requests + last.stable_requests
                    rows.setdefault((paired, kind), []).append(
                        (last.action, total, last.canary_requests / total)
                    )
                    outcomes.append(RunOutcome(kind, paired, last.action, total, last.canary_requests / total,
                                               first_check(last.reason), time.perf_counter() - started))  # fmt: skip
                    print(f"    {'paired' if paired else 'unpaired'} {kind} canary {run + 1}: {last.action} after "
                          f"{total} requests ({last.canary_requests} on the canary): {last.reason[:150]}", flush=True)  # fmt: skip
                    if real is not None and last.action == "rollback" and analysis and analysis.pairs:
                        # every paired check at the decision, not only the one that fired first
                        print("      " + "; ".join(c.describe() for c in analysis.pairs.checks()), flush=True)
                    if real is not None and last.action == "promote" and "pairs: " in last.reason:
                        print("      " + last.reason[last.reason.rindex("; ", 0, last.reason.index("pairs: ")) + 2 :],
                              flush=True)  # fmt: skip  # the paired checks' figures when they passed
                    if real is not None and analysis is not None:  # the arm latency check, whatever decided
                        print("      " + next(c for c in analysis.checks() if c.name == "latency").describe(),
                              flush=True)  # fmt: skip
                    if runtime.serving_version != stable:
                        runtime.deploy(stable, reason="deploy")
        finally:
            runtime.stop(drain=False)
    if real is not None:
        real.report(outcomes, share, policy, max_tokens)
        return
    for paired in (True, False):
        mode = f"paired (share {share:g})" if paired else "unpaired"
        goods, bads = rows.get((paired, "good"), []), rows.get((paired, "bad"), [])
        caught = [r for r in bads if r[0] == "rollback"]
        line = (
            f"(d) {mode}, steps {policy.steps}, {per_step} per step, steer={steer}, mix change={mix_change}: "
        )
        line += "good rolled back "
        line += f"{sum(r[0] == 'rollback' for r in goods)} of {len(goods)}; bad rolled back {len(caught)} of {len(bads)}"
        if caught:
            n = [r[1] for r in caught]
            line += (f", requests until then median {statistics.median(n):.0f} (max {max(n)}), canary share "
                     f"median {statistics.median(r[2] for r in caught):.1%}")  # fmt: skip
        if not goods and not bads:
            continue
        p99 = (
            sorted(durations[paired])[int(0.99 * (len(durations[paired]) - 1))] if durations[paired] else 0.0
        )
        line += f"; CPU s per live request {statistics.mean(cost[paired]):.3f}, live p99 {p99:.2f} s"
        print(line)
    if cost[True] and cost[False]:
        print(
            f"    shadow cost: CPU per live request x{statistics.mean(cost[True]) / statistics.mean(cost[False]):.2f}"
        )


def simulated(n: int) -> None:
    """(b): simulated streams of good and bad canaries."""
    policy = CanaryPolicy()
    t0 = time.perf_counter()
    good = [simulate(1000 + i, bad=False, policy=policy) for i in range(n)]
    rolled = [g for g in good if g[0] != "promoted"]
    print(f"(b) good canaries (simulated stream, policy steps {policy.steps}, {policy.requests_per_step} "
          f"canary requests per step, alpha {policy.alpha}): {len(rolled)} of {len(good)} rolled back")  # fmt: skip
    for outcome, _, _ in rolled:
        print(f"    {outcome}")
    bad = [simulate(1000 + i, bad=True, policy=policy) for i in range(n)]
    caught = [b for b in bad if b[0] != "promoted"]
    needed = [c for _, c, _ in caught]
    shares = [c / t for _, c, t in caught]
    print(f"    bad canaries (simulated, relevance Beta(2,8)): {len(caught)} of {len(bad)} rolled back; canary requests "
          f"before the rollback median {statistics.median(needed):.0f}, max {max(needed)}; share of all requests "
          f"median {statistics.median(shares):.1%}, max {max(shares):.1%}")  # fmt: skip
    print(f"    ({time.perf_counter() - t0:.1f} s)")


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
    from infersight.alerts.release.paired_checks import SIMILARITY_MODES

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--demo-runs", type=int, default=1)
    ap.add_argument("--good", type=int, default=20)
    ap.add_argument("--real", type=int, default=0, help="real canaries of a good release")
    ap.add_argument("--real-bad", type=int, default=0, help="real canaries of the corrupted release")
    ap.add_argument("--per-step", type=int, default=200, help="canary requests per step (real canaries)")
    ap.add_argument(
        "--good-version", default=None, help="the good release (default: the stable weights again)"
    )
    ap.add_argument("--max-tokens", type=int, default=12)
    ap.add_argument("--paired", type=int, default=0, help="good canaries, paired and unpaired (d)")
    ap.add_argument("--paired-bad", type=int, default=0, help="corrupted canaries, paired and unpaired (d)")
    ap.add_argument(
        "--pair-share",
        type=float,
        default=None,
        help="(d): default 0.5 with the demo model, the shipped engine.pair_share with smollm2",
    )
    ap.add_argument(
        "--model",
        choices=("demo", "smollm2"),
        default="demo",
        help="(d): smollm2 canaries its --candidates (real-model releases) against its fp32 import",
    )
    ap.add_argument(
        "--candidates",
        default=",".join(CANDIDATES),
        help="(d) with smollm2: a,b,c of " + ", ".join(CANDIDATES),
    )
    ap.add_argument("--runs", type=int, default=20, help="(d) with smollm2: runs per candidate")
    ap.add_argument("--until", default=None, help="(d) with smollm2: HH:MM UTC after which no round starts")
    ap.add_argument(
        "--work", type=Path, default=Path(".bench/relcheck"), help="where the candidates are built (kept)"
    )
    ap.add_argument(
        "--noise-sigma", type=float, default=None, help="the noise candidate's sigma (x each tensor's RMS)"
    )
    ap.add_argument(
        "--seed", type=int, default=0, help="(d) with smollm2: the candidates' order and the users"
    )
    ap.add_argument("--steer", action="store_true", help="clients ask the canary for 1 token (d)")
    ap.add_argument(
        "--mix-change",
        action="store_true",
        help="from the canary's start the clients ask hotel questions, max_tokens 2..32 (d)",
    )
    ap.add_argument("--modes", choices=("both", "paired", "unpaired"), default="both", help="(d)")
    ap.add_argument("--pair-similarity", choices=SIMILARITY_MODES, default=SIMILARITY_MODES[0],
                    help="(d) when the similarity check may fail a release (alerting.pair_similarity)")  # fmt: skip
    ap.add_argument("--canary-latency", choices=LATENCY_MODES, default=LATENCY_MODES[0],
                    help="(d) what the latency check compares (alerting.canary_latency)")  # fmt: skip
    args = ap.parse_args()
    print(f"CPU: {_cpu()}  load average: {' '.join(Path('/proc/loadavg').read_text().split()[:3])}; "
          f"similarity decides: {args.pair_similarity}; latency: {args.canary_latency}")  # fmt: skip
    if args.real or args.real_bad:
        real_canaries(args.real, args.real_bad, args.per_step, args.good_version, args.max_tokens)
    modes = {"both": (True, False), "paired": (True,), "unpaired": (False,)}[args.modes]
    if args.model == "smollm2":
        from _candidates import DEFAULT_NOISE_SIGMA, build, shipped_pair_share

        names = tuple(n for n in args.candidates.split(",") if n)
        built = build(args.work, names, noise_sigma=args.noise_sigma or DEFAULT_NOISE_SIGMA)
        share = shipped_pair_share() if args.pair_share is None else args.pair_share
        print(f"smollm2: {args.runs} runs of each of {', '.join(names)} (order and users drawn from seed "
              f"{args.seed}), pair share {share:g}, noise sigma {built.noise_sigma:g}", flush=True)  # fmt: skip
        real = RealModel(built, names, args.runs, args.seed, args.until)
        paired_canaries(0, 0, args.per_step, args.max_tokens, args.steer, share, args.mix_change, modes, real,
                        args.pair_similarity, args.canary_latency)  # fmt: skip
    elif args.paired or args.paired_bad:
        paired_canaries(
            args.paired, args.paired_bad, args.per_step, args.max_tokens, args.steer,
            0.5 if args.pair_share is None else args.pair_share, args.mix_change, modes,
            similarity=args.pair_similarity, latency=args.canary_latency,
        )  # fmt: skip
    if args.good:
        simulated(args.good)
    for i in range(args.demo_runs):
        seconds, share, detail = demo_run()
        print(f"(a) demo run {i + 1}: corrupted release at 10%: rolled back {seconds:.1f} s after the canary "
              f"started, having served {share:.1%} of requests; {detail}")  # fmt: skip


if __name__ == "__main__":
    main()
