"""Post-deploy analysis, paired against unpaired, on the real service.

The service as `infersight serve` runs it (the embedded runtime with the demo model, uvicorn
on a loopback port, SQLite, the drift module's embedder scoring relevance and pairs, a
webhook receiver as on-call) serves the demo's fp32 version. Each run: `--before` good
requests (Banking77, `max_tokens` `--max-tokens`), then a deploy through the API of the good
int8 build (`mixtral_banking_int8-v1.0`) or the corrupted `mixtral_banking_fp32-v1.1`, then
traffic until the post-deploy analysis ends (passed after its window) or rolls the release
back. With `--mix-change` the clients change at the moment of the deploy: hotel utterances
instead of Banking77 questions, `max_tokens` drawn from 2..32 instead of the fixed budget.

Each release is deployed twice, paired (the runtime also answers `--pair-share` of live
requests with the previous version, kept loaded for the window; relevance, similarity,
output length and finish reason compared on the same requests) and unpaired (no shadow,
the evidence off: relevance and output drift before against after), the order alternated.
The analysis' daily cap on rollbacks (3) is lifted so that every run can roll back.
Between runs the fp32 version is put back with the runtime's own deploy under a reason that
starts no analysis (`reset`), so one run's verdict cannot leak into the next.

Reported per mode and kind: releases rolled back, requests after the deploy until the
rollback (median, max), the requests the release served and their share of the run's
requests (before + after), and the verdict's failed checks.

With `--model smollm2` the service serves SmolLM2-135M-Instruct's fp32 import instead, and
the releases deployed are `--candidates` (benchmarks/_candidates.py builds them under
`--work`), `--runs` each, in an order drawn anew for every round, each run's clients (which
requests the runtime shadows) from its own seed; chats carry no system message, so the
model's template supplies its default one. The pair share is the shipped one
(`engine.pair_share`) unless `--pair-share` says otherwise.

    .venv/bin/python benchmarks/post_deploy.py --good 20 --bad 5 --mix-change
    .venv/bin/python benchmarks/post_deploy.py --model smollm2 --candidates int8,noise --runs 2 --modes paired
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import json
import logging
import random
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
from _candidates import CANDIDATES, RunOutcome, table

STABLE, GOOD, BAD = "mixtral_banking_fp32-v1.0", "mixtral_banking_int8-v1.0", "mixtral_banking_fp32-v1.1"
TOKEN = "post-deploy-bench-token-0123456789"
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


def _cpu() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown"


def _wait(check: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.2)
    raise TimeoutError(f"waited {timeout:.0f} s for {what}")


class Bench:
    def __init__(self, base: str, service: Any, args: argparse.Namespace) -> None:
        from infersight.monitor import data
        from infersight.monitor.service.demo.stage import SYSTEM

        self.base, self.service, self.args = base, service, args
        self.system: str | None = None if args.real is not None else SYSTEM
        self.stable = args.real.candidates.stable if args.real is not None else STABLE
        self.banking = [u.text for u in data.banking77("test")]
        self.hotels = [u.text for u in data.hotels()]
        self.rng = random.Random(0)
        self.client = httpx.Client(base_url=base, timeout=120, headers={"Authorization": f"Bearer {TOKEN}"})
        self.pool = ThreadPoolExecutor(args.workers)

    @property
    def backend(self) -> Any:
        return self.service.parts.backend

    def analysis(self, version: str) -> Any:
        from infersight.monitor.store.tables import deploy_analyses
        from sqlalchemy import select

        with self.service.db.connect() as conn:
            return conn.execute(select(deploy_analyses).where(deploy_analyses.c.to_version == version)
                                .order_by(deploy_analyses.c.id.desc())).first()  # fmt: skip

    def _one(self, text: str, max_tokens: int) -> str | None:
        system = [{"role": "system", "content": self.system}] if self.system is not None else []
        body = {"messages": [*system, {"role": "user", "content": text}],
                "max_tokens": max_tokens, "temperature": 1.0, "user": f"u{self.rng.getrandbits(48)}"}  # fmt: skip
        try:
            r = self.client.post("/v1/chat/completions", json=body)
        except httpx.HTTPError:
            return None
        return r.headers.get("x-infersight-version") if r.status_code == 200 else None

    def batch(self, n: int, mixed: bool) -> list[str | None]:
        """`n` requests: the usual mix, or (`mixed`) the clients' new one."""
        if mixed:
            work = [(self.rng.choice(self.hotels), self.rng.randint(2, 32)) for _ in range(n)]
        else:
            work = [(self.rng.choice(self.banking), self.args.max_tokens) for _ in range(n)]
        return list(self.pool.map(lambda w: self._one(*w), work))

    def run(self, candidate: str, paired: bool, kind: str | None = None) -> dict[str, Any]:
        runtime, feed = self.backend.runtime, self.backend.pair_feed
        runtime.shadow.configure(share=self.args.pair_share if paired else 0.0)
        feed.evidence.enabled = paired
        before = 0
        while before < self.args.before:
            before += len(self.batch(8, mixed=False))
        r = self.client.post("/api/v1/models/deploy", json={"version": candidate})
        assert r.status_code == 200, r.text
        t0 = time.monotonic()
        after: list[str | None] = []
        rolled_at: int | None = None
        while True:  # the clients keep sending until the analysis ends
            row = self.analysis(candidate)
            serving = runtime.serving_version
            if serving != candidate and rolled_at is None:
                rolled_at = len(after)
            if row is not None and row.state != "running" and (row.state != "rolling_back"):
                break
            if rolled_at is not None:
                _wait(lambda: self.analysis(candidate).state not in ("running", "rolling_back"), 60,
                      "the analysis' final state")  # fmt: skip
                break
            if time.monotonic() - t0 > self.args.window + self.args.max_hold + 120:
                raise TimeoutError(f"analysis of {candidate} still {row.state if row else None}")
            after.extend(self.batch(8, mixed=self.args.mix_change))
        row = self.analysis(candidate)
        evidence = json.loads(row.evidence)
        last = evidence[-1] if evidence else {}
        served = sum(v == candidate for v in after)
        result = {
            "kind": kind or ("good" if candidate == GOOD else "bad"), "paired": paired, "state": row.state,
            "seconds": time.monotonic() - t0, "after": len(after),
            "until_rollback": rolled_at, "served": served, "share": served / max(1, before + len(after)),
            "failures": last.get("failures", []), "pairs": last.get("pairs", 0), "paired_text": last.get("paired", ""),
            "failed_checks": [c.get("check", "") for c in _first_failed(evidence)],
            "errors": sum(v is None for v in after),
        }  # fmt: skip
        if runtime.serving_version != self.stable:  # back to the stable version, no analysis started
            runtime.deploy(self.stable, reason="reset")
        return result


def _first_failed(evidence: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The checks of the analysis' first failed verdict: the ones that fired first."""
    return next((e.get("failed_checks", []) for e in evidence if e.get("verdict") == "failed"), [])


def check_names(checks: list[str]) -> str:
    return "+".join(sorted(set(checks))) or "?"


def serve(args: argparse.Namespace, tmp: Path, body: Callable[[Bench], None]) -> None:
    import uvicorn
    from infersight.monitor import data
    from infersight.monitor.cli import main as cli
    from infersight.monitor.service import Service, create_app
    from infersight.monitor.service.config import (
        AlertingConfig,
        DriftConfig,
        EngineConfig,
        ScheduleConfig,
        ServiceConfig,
    )
    from infersight.monitor.service.demo.stage import WebhookReceiver, new_secret

    registry, stable = tmp / "registry", STABLE
    if args.real is not None:
        registry, stable = args.real.candidates.registry, args.real.candidates.stable
    else:
        with contextlib.redirect_stdout(io.StringIO()):
            assert cli(["models", "init-demo", str(registry)]) == 0
    reference = tmp / "reference.jsonl"
    texts = random.Random(1).sample([u.text for u in data.banking77("train")], 200)
    reference.write_text("".join(json.dumps({"prompt": t}) + "\n" for t in texts))
    secret = new_secret()
    with WebhookReceiver(secret) as hook:
        rules = tmp / "rules.yaml"
        rules.write_text(RULES.replace("HOOK_URL", hook.url).replace("HOOK_SECRET", secret))
        with contextlib.closing(__import__("socket").socket()) as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        cfg = ServiceConfig(
            data_dir=tmp / "service", port=port, token=TOKEN,
            engine=EngineConfig(registry=registry, version=stable, max_batch_size=8, max_seq_len=512,
                                max_prompt_tokens=256, max_tokens_limit=64, pair_share=args.pair_share),
            alerting=AlertingConfig(rules=rules, analysis_window_s=args.window, analysis_interval_s=args.interval,
                                    analysis_failed_checks=args.failed_checks, analysis_min_requests=15,
                                    analysis_p99_ratio=args.p99_ratio, analysis_max_hold_s=args.max_hold,
                                    pair_similarity=args.pair_similarity),
            drift=DriftConfig(reference=reference, alpha=0.01, window=60, min_window=30),
            schedule=ScheduleConfig(timeseries_s=1.0, timeseries_window_s=20.0, embed_s=1.0, drift_s=3600.0,
                                    rules_s=0.5, outbox_s=0.5, post_deploy_s=1.0),
            text_sample_rate=1.0,
        )  # fmt: skip
        service = Service(cfg)
        service.start()
        server = uvicorn.Server(uvicorn.Config(create_app(cfg, service=service), host="127.0.0.1", port=port,
                                               log_level="warning", access_log=False))  # fmt: skip
        thread = threading.Thread(target=server.run, name="post-deploy-uvicorn", daemon=True)
        thread.start()
        analyzer = service.parts.alerts.analyzer  # every run may roll back: no daily cap (3 as shipped)
        analyzer.policy = dataclasses.replace(analyzer.policy, max_rollbacks_per_day=10_000)
        try:
            _wait(lambda: server.started, 60, "the HTTP server")
            body(Bench(f"http://127.0.0.1:{port}", service, args))
        finally:
            server.should_exit = True
            thread.join(30)
            service.stop()


def report(rows: list[dict[str, Any]], args: argparse.Namespace) -> None:
    for paired in (True, False):
        mode = f"paired (share {args.pair_share:g})" if paired else "unpaired"
        for kind in ("good", "bad"):
            mine = [r for r in rows if r["paired"] == paired and r["kind"] == kind]
            if not mine:
                continue
            rolled = [r for r in mine if r["state"] != "passed"]
            line = (f"{mode}, {kind} deploys, mix change {args.mix_change}: rolled back {len(rolled)} of "
                    f"{len(mine)}")  # fmt: skip
            caught = [r for r in rolled if r["until_rollback"] is not None]
            if caught:
                n = [r["until_rollback"] for r in caught]
                line += (f"; requests after the deploy until the rollback median {statistics.median(n):.0f} "
                         f"(max {max(n)}), seconds median {statistics.median(r['seconds'] for r in caught):.0f}; "
                         f"served by it median {statistics.median(r['served'] for r in caught):.0f} requests, "
                         f"{statistics.median(r['share'] for r in caught):.1%} of the run's")  # fmt: skip
            print(line, flush=True)


def main() -> None:
    from infersight.alerts.release.paired_checks import SIMILARITY_MODES

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--good", type=int, default=4, help="deploys of the int8 build, each paired and unpaired")
    ap.add_argument("--bad", type=int, default=2, help="deploys of the corrupted release, each in both modes")
    ap.add_argument("--modes", choices=("both", "paired", "unpaired"), default="both")
    ap.add_argument(
        "--mix-change", action="store_true", help="hotel prompts, max_tokens 2..32 after the deploy"
    )
    ap.add_argument("--before", type=int, default=40, help="requests before each deploy")
    ap.add_argument("--max-tokens", type=int, default=12)
    ap.add_argument(
        "--pair-share",
        type=float,
        default=None,
        help="default 0.5 with the demo model, the shipped engine.pair_share with smollm2",
    )
    ap.add_argument("--model", choices=("demo", "smollm2"), default="demo")
    ap.add_argument(
        "--candidates", default=",".join(CANDIDATES), help="with smollm2: a,b,c of " + ", ".join(CANDIDATES)
    )
    ap.add_argument("--runs", type=int, default=20, help="with smollm2: deploys of each candidate (per mode)")
    ap.add_argument(
        "--work", type=Path, default=Path(".bench/relcheck"), help="where the candidates are built (kept)"
    )
    ap.add_argument(
        "--noise-sigma", type=float, default=None, help="the noise candidate's sigma (x each tensor's RMS)"
    )
    ap.add_argument("--seed", type=int, default=0, help="with smollm2: the candidates' order and the clients")
    ap.add_argument("--until", default=None, help="with smollm2: HH:MM UTC after which no round starts")
    ap.add_argument("--window", type=float, default=30.0, help="analysis window (s)")
    ap.add_argument("--interval", type=float, default=3.0, help="between checks (s)")
    ap.add_argument(
        "--max-hold", type=float, default=600.0,
        help="how long past the window an undecided divergence check may hold the verdict (s)",
    )  # fmt: skip
    ap.add_argument("--failed-checks", type=int, default=2, help="failed checks before the rollback")
    ap.add_argument("--p99-ratio", type=float, default=100.0, help="latency check (100: off, shared machine)")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--pair-similarity", choices=SIMILARITY_MODES, default=SIMILARITY_MODES[0],
                    help="when the similarity check may fail a release (alerting.pair_similarity)")  # fmt: skip
    args = ap.parse_args()
    args.real = None
    if args.model == "smollm2":
        from _candidates import DEFAULT_NOISE_SIGMA, RealModel, build, shipped_pair_share

        names = tuple(n for n in args.candidates.split(",") if n)
        built = build(args.work, names, noise_sigma=args.noise_sigma or DEFAULT_NOISE_SIGMA)
        args.real = RealModel(built, names, args.runs, args.seed, args.until)
        if args.pair_share is None:
            args.pair_share = shipped_pair_share()
        print(f"smollm2: {args.runs} deploys of each of {', '.join(names)} (order and clients drawn from seed "
              f"{args.seed}), noise sigma {built.noise_sigma:g}", flush=True)  # fmt: skip
    elif args.pair_share is None:
        args.pair_share = 0.5
    logging.getLogger("apscheduler").setLevel(logging.ERROR)  # "skipped: already running" on a loaded machine
    print(f"CPU: {_cpu()}  load average: {' '.join(Path('/proc/loadavg').read_text().split()[:3])}")
    print(f"window {args.window:g} s, checks every {args.interval:g} s, rollback after {args.failed_checks} failed, "
          f"p99 ratio {args.p99_ratio:g}, {args.before} requests before each deploy, pair share "
          f"{args.pair_share:g}, max_tokens {args.max_tokens}, similarity decides: {args.pair_similarity}",
          flush=True)  # fmt: skip
    modes = {"both": None, "paired": True, "unpaired": False}[args.modes]
    rows: list[dict[str, Any]] = []

    def body(bench: Bench) -> None:
        if args.real is not None:
            runs, seeds = args.real.plan()
            plan = [(version, name) for name, version, _ in runs]
            rounds = [nth for _, _, nth in runs]
        else:
            plan, seeds = [(GOOD, None)] * args.good + [(BAD, None)] * args.bad, [0] * (args.good + args.bad)
        for i, ((candidate, name), seed) in enumerate(zip(plan, seeds, strict=True)):
            if args.real is not None and not args.real.round_may_start(
                rounds[i], i % len(args.real.names) == 0
            ):
                break
            order = (i % 2 == 0, i % 2 == 1) if modes is None else (modes,)
            for paired in order:
                if args.real is not None:  # which requests are shadowed, and what is asked, per run
                    bench.rng = random.Random(seed + paired)
                r = bench.run(candidate, paired, name)
                rows.append(r)
                why = "; ".join(r["failures"])[:200] or r["paired_text"][:160]
                print(f"    {'paired' if paired else 'unpaired'} {r['kind']} deploy {i + 1}: {r['state']} "
                      f"({r['after']} requests after the deploy, {r['seconds']:.0f} s, until rollback "
                      f"{r['until_rollback']}, served {r['served']}, {r['pairs']} pairs, {r['errors']} errors): "
                      f"{why}", flush=True)  # fmt: skip

    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        try:
            serve(args, Path(tmp), body)
        finally:
            report(rows, args)
            if args.real is not None:
                print(
                    f"\nper candidate (window {args.window:g} s, rollback after {args.failed_checks} failed checks):"
                )
                table([RunOutcome(r["kind"], r["paired"], r["state"], r["until_rollback"] or r["after"], r["share"],
                                  check_names(r["failed_checks"]) if r["state"] != "passed" else "", r["seconds"])
                       for r in rows], args.real.names)  # fmt: skip
            print(f"({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
