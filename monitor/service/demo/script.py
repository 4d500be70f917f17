"""The scripted incident of `infersight demo`.

1. the demo's models (models.py: the copy-back demo model by default, SmolLM2-135M-Instruct
   with `--model smollm2`): a good version and a bad release of it;
2. the service on SQLite with the embedded runtime, a Banking77 drift reference, rules
   that page a local receiver checking Standard Webhooks signatures;
3. baseline traffic (Banking77 test utterances through /v1/chat/completions): no drift;
4. a topic shift (NLU++ hotel utterances mixed in): drift flagged, explained by hotel
   texts, the PromptDrift alert delivered to the receiver signed;
5. the bad release started as a 10% canary through the API while the hotel questions go on:
   a share of requests is answered by both versions and the canary analysis compares the two
   answers to the same requests, sees them differ and relevance fall (always-valid sequential
   tests), rolls it back by itself while it has served fewer than 15% of the requests (the
   demo prints the share), takes a snapshot and pages (CanaryRegression, signed webhook);
6. the same release deployed to all traffic anyway (no canary): the previous version stays
   loaded to answer a share of the same requests, the post-deploy analysis sees relevance
   fall on those pairs, rolls back by itself, takes a snapshot and pages (PostDeployRegression,
   signed webhook);
7. the rolled-back version's PromptDrift resolves once it has had no request for
   `drift.stale_after_s`: nobody serves it any more;
8. the requests collected after the rollbacks are exported as JSONL, and (next_release.py)
   calibrate a GPTQ int4 build of the good version, whose quality against the good version is
   measured on held-out utterances and which goes out as a canary: promoted or rolled back,
   whichever the analysis decides.
Every drift verdict comes from the service's scheduled drift job on the new traffic, as in
`infersight serve`; the demo only reads the reports. Each step is checked; the first that
did not happen ends the demo with its name (timeline.py)."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import secrets
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import httpx

from ..config import (
    AlertingConfig,
    CostConfig,
    DriftConfig,
    EngineConfig,
    LimitsConfig,
    ScheduleConfig,
    ServiceConfig,
)
from .models import MODELS, DemoModels, prepare_models
from .next_release import next_release
from .stage import WebhookReceiver, demo_rules, keep_sending, new_secret, sample, send_chats
from .timeline import DemoFailed, Step, Timeline, wait_until

__all__ = ["MODELS", "DemoFailed", "DemoOptions", "DemoResult", "Step", "Timeline", "run_demo"]

CANARY_WEIGHT = 0.1  # the bad release's share of users


@dataclass(frozen=True)
class DemoOptions:
    data_dir: Path
    fast: bool = False  # smaller windows (the test's mode); same steps
    model: str = "demo"  # one of MODELS: "demo" (the copy-back demo model) or "smollm2"
    port: int | None = None
    keep_running: bool = False
    linger_s: float = 0.0  # keep the service up this long after the last step (a scraper's last look)


@dataclass(frozen=True)
class DemoResult:
    ok: bool
    failed_step: str | None
    page_url: str
    snapshot_path: str | None
    steps: tuple[Any, ...]


@dataclass(frozen=True)
class _Sizes:
    reference: int
    window: int
    bad_release: int
    stale_after_s: float  # a version without requests this long has its drift state dropped


def _sizes(fast: bool, models: DemoModels) -> _Sizes:
    reference, window, bad_release = models.fast_windows if fast else models.windows
    return _Sizes(reference, window, bad_release, stale_after_s=models.stale_after_s)


_DRIFT_TICK_S = 1.0  # the drift job's interval (serve's default is 60 s)
# canary requests per step (serve's default is 200): the next release's canary at 50% is
# promoted after this many without a regression, enough for the paired checks' 10 pairs
_CANARY_STEP = 60


def run_demo(options: DemoOptions, out: TextIO) -> DemoResult:
    timeline = Timeline(out)
    state: dict[str, Any] = {"page": "", "snapshot": None}
    what = "SmolLM2-135M-Instruct" if options.model == "smollm2" else "a customer-service model"
    print(f"infersight demo: {what}, a topic shift and a bad release\n", file=out, flush=True)
    try:
        _play(options, timeline, state)
        failed = None
    except DemoFailed as exc:
        failed = exc.step
    ok = failed is None
    _summary(out, timeline, state, failed)
    return DemoResult(ok, failed, state["page"], state["snapshot"], tuple(timeline.steps))


def _play(options: DemoOptions, tl: Timeline, state: dict[str, Any]) -> None:
    from infersight.monitor import data

    root = options.data_dir.resolve()
    registry = root / "registry"
    if registry.exists() and not registry.is_dir():
        raise tl.fail("demo model", f"{registry} exists and is not a directory")
    m = prepare_models(options.model, registry, tl)
    state["models"] = m
    sizes = _sizes(options.fast, m)
    reference = _write_reference(root / "reference.jsonl", sample([u.text for u in data.banking77("train")],
                                                                   sizes.reference, seed=1))  # fmt: skip
    banking_test = sample(
        [u.text for u in data.banking77("test")], 2 * sizes.window + sizes.bad_release, seed=2
    )
    all_hotels = [u.text for u in data.hotels()]
    hotels = sample(all_hotels, sizes.window + sizes.bad_release, seed=3)
    sent = set(banking_test) | set(hotels)  # the next release's quality is measured on texts never sent
    held_out = [t for t in sample([u.text for u in data.banking77("test")], 120, seed=4) if t not in sent]
    held_out = held_out[:32] + [t for t in sample(all_hotels, 120, seed=5) if t not in sent][:32]
    tl.done("data", f"drift reference: {sizes.reference} Banking77 training utterances ({reference.name}); "
                    f"traffic: Banking77 test utterances and {len(hotels)} NLU++ hotel utterances")  # fmt: skip
    secret = new_secret()
    with (
        WebhookReceiver(secret) as hook,
        _service(options, root, m, registry, reference, hook.url, secret, sizes) as base,
    ):
        state["page"] = base + "/"
        tl.done(
            "service",
            f"serving {m.good} on {base} (SQLite in {root / 'service'}); webhook receiver {hook.url}",
        )
        client = httpx.Client(
            base_url=base,
            timeout=120.0,
            headers={"Authorization": f"Bearer {state.setdefault('token', _token(root))}"},
        )
        with client:
            _baseline(base, client, tl, m, banking_test[: sizes.window])
            _topic_shift(base, client, tl, m, banking_test[sizes.window : 2 * sizes.window],
                         hotels[: sizes.window], hook)  # fmt: skip
            bad_traffic = _mix(banking_test[2 * sizes.window :], hotels[sizes.window :])
            _bad_release(base, client, tl, m, bad_traffic, hook, state)
            _bad_deploy(base, client, tl, m, bad_traffic, hook, state)
            _stale_drift_resolved(base, tl, m, hook, sizes, bad_traffic)
            dataset = _incident_data(base, client, tl, m, root, state)
            next_release(base, client, tl, m, registry, dataset, held_out, bad_traffic, state)
            time.sleep(options.linger_s)
            if options.keep_running:
                tl.note(f"the service keeps running at {base}/ (Ctrl-C to stop)")
                with contextlib.suppress(KeyboardInterrupt):
                    while True:
                        time.sleep(1)


def _token(root: Path) -> str:
    return (root / "service" / "api-token").read_text().strip()


def _write_reference(path: Path, texts: list[str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"prompt": t}) + "\n" for t in texts), encoding="utf-8")
    return path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def _service(
    options: DemoOptions,
    root: Path,
    m: DemoModels,
    registry: Path,
    reference: Path,
    hook_url: str,
    secret: str,
    sizes: _Sizes,
) -> Iterator[str]:
    import shutil

    import uvicorn

    from .. import Service, create_app

    service_dir = root / "service"
    if service_dir.exists():
        shutil.rmtree(service_dir)  # every run replays the incident from an empty store
    service_dir.mkdir(parents=True)
    rules = service_dir / "rules.yaml"
    rules.write_text(demo_rules(hook_url, secret), encoding="utf-8")
    rules.chmod(0o600)
    port = options.port or _free_port()
    cfg = ServiceConfig(
        data_dir=service_dir, port=port, token=secrets.token_urlsafe(24),
        engine=EngineConfig(registry=registry, version=m.good, max_batch_size=8, max_seq_len=512,
                            max_prompt_tokens=256, max_tokens_limit=32,
                            # the system prompt and the chat frame fill a block of 16 that every
                            # question shares; a block of 64 (serve's default) is only ever shared
                            # by a long question asked twice, too rare in a few hundred requests
                            prefix_block_tokens=16),
        alerting=AlertingConfig(rules=rules, analysis_window_s=900, analysis_interval_s=2,
                                analysis_failed_checks=2, analysis_min_requests=max(10, sizes.bad_release // 4),
                                canary_step_requests=_CANARY_STEP),
        drift=DriftConfig(reference=reference, alpha=0.01, window=sizes.window, min_window=max(20, sizes.window // 4),
                          stale_after_s=sizes.stale_after_s),
        schedule=ScheduleConfig(timeseries_s=1.0, timeseries_window_s=20.0, embed_s=1.0, drift_s=_DRIFT_TICK_S,
                                rules_s=0.5, outbox_s=0.5, post_deploy_s=1.0),
        text_sample_rate=1.0,
        cost=CostConfig(per_hour=4.10),  # an example price: cost per 1k output tokens on the page and in Grafana
        # the demo's traffic is one application's, from loopback without the token, in bursts
        # of 8 at a time: over a low per-client rate limit at its peaks
        limits=LimitsConfig(client_rate=200.0, client_burst=400.0),
    )  # fmt: skip
    fd = os.open(service_dir / "api-token", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # a credential
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(cfg.token or "")
    service = Service(cfg)
    service.start()
    app = create_app(cfg, service=service)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                           access_log=False))  # fmt: skip
    thread = threading.Thread(target=server.run, name="demo-uvicorn", daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{port}"
    try:
        if not wait_until(lambda: server.started, 30):
            raise DemoFailed("service", "the HTTP server did not start")
        yield base
    finally:
        server.should_exit = True
        thread.join(30)
        service.stop()


def _mix(a: list[str], b: list[str]) -> list[str]:
    return [t for pair in zip(a, b, strict=False) for t in pair]


def _newest_report(client: httpx.Client, version: str) -> dict[str, Any]:
    reports = client.get("/api/v1/drift", params={"model_version": version, "limit": 1}).json()["reports"]
    return dict(reports[0]) if reports else {}


def _started(report: dict[str, Any]) -> float:
    """When the drift job started the evaluation (its window ends one second later)."""
    until = (report.get("window") or {}).get("until")
    return dt.datetime.fromisoformat(until).timestamp() - 1.0 if until else 0.0


def _scheduled_report(client: httpx.Client, version: str, traffic_end: float) -> dict[str, Any]:
    """The scheduled drift job's verdict on the good version's traffic up to `traffic_end`:
    the first report it starts after then (its pause trigger evaluates whatever came in
    since its last verdict); when none comes, the last one already covered everything."""
    settle = time.time() + 3 * _DRIFT_TICK_S + 5.0
    deadline = time.time() + 120.0
    while time.time() < deadline:
        report = _newest_report(client, version)
        if report and _started(report) > traffic_end + 0.5:
            return report
        if report and time.time() > settle:
            return report
        time.sleep(0.25)
    return {}


def _baseline(base: str, client: httpx.Client, tl: Timeline, m: DemoModels, utterances: list[str]) -> None:
    result = send_chats(base, utterances, max_tokens=m.max_tokens)
    if result.ok != result.sent:
        raise tl.fail(
            "baseline traffic", f"{result.sent - result.ok} of {result.sent} requests failed: {result.errors}"
        )
    tl.done("baseline traffic", f"{result.sent} Banking77 questions answered by {m.good} (some streamed)")
    report = _scheduled_report(client, m.good, time.time())
    if not report:
        raise tl.fail("baseline drift check", "no drift report was produced")
    if report["drift"]:
        raise tl.fail(
            "baseline drift check", f"drift flagged on in-distribution traffic (p = {report['p_value']:.3g})"
        )
    tl.done("baseline drift check", f"the scheduled drift job found no drift (p = {report['p_value']:.3g}, "
                                    f"n = {report['n_current']})")  # fmt: skip


def _topic_shift(
    base: str,
    client: httpx.Client,
    tl: Timeline,
    m: DemoModels,
    banking: list[str],
    hotels: list[str],
    hook: WebhookReceiver,
) -> None:
    half = len(banking) // 2
    mixed = _mix(banking[:half], hotels[:half])
    result = send_chats(base, mixed, max_tokens=m.max_tokens)
    if result.ok != result.sent:
        raise tl.fail("topic shift traffic", f"{result.sent - result.ok} requests failed: {result.errors}")
    tl.done("topic shift traffic", f"{result.sent} requests, half of them hotel bookings")
    report = _scheduled_report(client, m.good, time.time())
    if not report.get("drift"):
        raise tl.fail("drift flagged", f"the topic shift was not flagged: {report.get('p_value')}")
    full = client.get(f"/api/v1/drift/{report['id']}").json()
    prompt = (full.get("explanation") or {}).get("prompt") or {}
    appeared = [t for t in _texts(prompt.get("appeared"))][:3]
    examples = [t for t in appeared if t in set(hotels)]
    if not examples:
        raise tl.fail("drift explained", f"the texts that appeared most are not hotel utterances: {appeared}")
    tl.done(
        "drift flagged",
        f"the scheduled drift job flagged the prompts (p = {report['p_value']:.2g}); report /api/v1/drift/{report['id']}",
    )
    tl.done("drift explained", f"e.g. {examples[0]!r} among the texts that appeared")
    if not wait_until(lambda: "PromptDrift" in hook.alertnames(), m.decide_s):
        raise tl.fail("drift alert", "no signed PromptDrift notification reached the webhook receiver")
    tl.done("drift alert", "PromptDrift fired; signed webhook verified by the receiver")


def _texts(obj: Any) -> Iterator[str]:
    if isinstance(obj, dict):
        for key, value in obj.items():
            if key == "text" and isinstance(value, str):
                yield value
            else:
                yield from _texts(value)
    elif isinstance(obj, list):
        for item in obj:
            yield from _texts(item)


def _bad_release(
    base: str,
    client: httpx.Client,
    tl: Timeline,
    m: DemoModels,
    utterances: list[str],
    hook: WebhookReceiver,
    state: dict[str, Any],
) -> None:
    good, bad = m.good, m.bad
    r = client.post("/api/v1/models/canary", json={"version": bad, "weight": CANARY_WEIGHT})
    if r.status_code != 200:
        raise tl.fail("bad release canary", f"canary answered {r.status_code}: {r.text[:200]}")
    tl.done("bad release canary", f"{bad} serves {CANARY_WEIGHT:.0%} of users beside {good} ({m.bad_what}; "
                                  "the hotel questions go on)")  # fmt: skip
    stop, sent, worker = keep_sending(
        base, utterances, rounds=40, user_prefix="user", max_tokens=m.max_tokens
    )

    def rolled_back() -> bool:
        models = client.get("/api/v1/models").json()
        return any(d["reason"] == "canary" and d["outcome"] == "rolled_back" and d["from_version"] == bad
                   for d in models["deploys"])  # fmt: skip

    done = wait_until(rolled_back, m.decide_s, 0.5)
    stop.set()
    worker.join(120)
    canary = client.get("/api/v1/models/canary").json()
    if not done:
        raise tl.fail("canary rolled back", f"{bad} was still a canary after {sum(sent)} requests")
    [decision] = [d for d in canary["decisions"] if d["action"] == "rollback"][-1:] or [None]
    if decision is None:
        raise tl.fail("canary rolled back", "the canary ended without a rollback decision")
    served, total = decision["canary_requests"], decision["canary_requests"] + decision["stable_requests"]
    share = served / max(1, total)
    state["canary_share"] = share
    if share >= 0.15:
        raise tl.fail("canary rolled back", f"{bad} served {share:.1%} of requests before its rollback")
    tl.done("canary rolled back", f"rolled back to {good} after {bad} served {served} of {total} requests "
                                  f"({share:.1%}): {decision['reason']}")  # fmt: skip
    snaps = wait_until(
        lambda: [s for s in client.get("/api/v1/snapshots").json()["snapshots"] if s["trigger"] == "canary"],
        20,
    )
    if not snaps:
        raise tl.fail("snapshot", "no snapshot was taken at the rollback")
    snap = snaps[0]  # type: ignore[index]
    state["snapshot"] = snap["path"]
    tl.done("snapshot", f"{snap['request_count']} requests of {snap['model_version']} kept in {snap['path']}")
    from infersight.alerts import CANARY_ALERT

    if not wait_until(lambda: CANARY_ALERT in hook.alertnames(), m.decide_s):
        raise tl.fail("page", f"no signed {CANARY_ALERT} notification reached the webhook receiver")
    tl.done("page", f"{CANARY_ALERT} delivered, signature verified ({len(hook.received)} webhooks received, "
                    f"{hook.rejected} rejected)")  # fmt: skip


def _bad_deploy(
    base: str,
    client: httpx.Client,
    tl: Timeline,
    m: DemoModels,
    utterances: list[str],
    hook: WebhookReceiver,
    state: dict[str, Any],
) -> None:
    good, bad = m.good, m.bad
    r = client.post("/api/v1/models/deploy", json={"version": bad})
    if r.status_code != 200:
        raise tl.fail("bad release deployed", f"deploy answered {r.status_code}: {r.text[:200]}")
    tl.done("bad release deployed", f"{bad} is serving ({m.bad_what}; the hotel questions go on)")
    stop, sent, worker = keep_sending(base, utterances, rounds=20, max_tokens=m.max_tokens)

    def rolled_back() -> bool:
        models = client.get("/api/v1/models").json()
        return models["serving_version"] == good and any(
            d["reason"] == "rollback" and d["to_version"] == good for d in models["deploys"]
        )

    done = wait_until(rolled_back, m.decide_s, 0.5)
    stop.set()
    worker.join(120)
    if not done:
        raise tl.fail("automatic rollback", f"{bad} was still serving after {sum(sent)} requests")
    tl.done(
        "automatic rollback", f"the post-deploy analysis rolled back to {good} after {sum(sent)} requests"
    )
    snaps = wait_until(
        lambda: [
            s for s in client.get("/api/v1/snapshots").json()["snapshots"] if s["trigger"] == "post_deploy"
        ],
        20,
    )
    if not snaps:
        raise tl.fail("rollback snapshot", "no snapshot was taken at the rollback")
    snap = snaps[0]  # type: ignore[index]
    tl.done(
        "rollback snapshot",
        f"{snap['request_count']} requests of {snap['model_version']} kept in {snap['path']}",
    )
    from infersight.alerts import REGRESSION_ALERT

    if not wait_until(lambda: REGRESSION_ALERT in hook.alertnames(), m.decide_s):
        raise tl.fail(
            "rollback page", f"no signed {REGRESSION_ALERT} notification reached the webhook receiver"
        )
    tl.done("rollback page", f"{REGRESSION_ALERT} delivered, signature verified ({len(hook.received)} webhooks received, "
                    f"{hook.rejected} rejected)")  # fmt: skip


def _stale_drift_resolved(
    base: str, tl: Timeline, m: DemoModels, hook: WebhookReceiver, sizes: _Sizes, traffic: list[str]
) -> None:
    """The rolled-back version drifted while it served; nobody sends it requests now, so its
    drift state expires and its PromptDrift resolves. Users go on asking meanwhile, answered
    by the good version: what the collection opened at the rollback keeps."""
    bad = m.bad
    stop, sent, worker = keep_sending(base, traffic, rounds=5, max_tokens=m.max_tokens)
    try:
        fired = wait_until(
            lambda: ("PromptDrift", bad, "firing") in hook.alert_states(), max(60.0, 4 * sizes.stale_after_s)
        )
        if not fired:
            raise tl.fail("rolled-back drift resolved", f"PromptDrift never fired for {bad} while it served")
        t0 = time.monotonic()
        if not wait_until(
            lambda: ("PromptDrift", bad, "resolved") in hook.alert_states(), 3 * sizes.stale_after_s + 30
        ):
            raise tl.fail(
                "rolled-back drift resolved", f"PromptDrift of {bad} still firing though nobody serves it"
            )
    finally:
        stop.set()
        worker.join(120)
    tl.done(
        "rolled-back drift resolved",
        f"PromptDrift of {bad} resolved {time.monotonic() - t0:.0f} s after it fired: no request reached it for "
        f"{sizes.stale_after_s:g} s, so its drift state expired ({sum(sent)} more questions to {m.good} meanwhile)",
    )


def _incident_data(
    base: str, client: httpx.Client, tl: Timeline, m: DemoModels, root: Path, state: dict[str, Any]
) -> Path:
    """What the incident leaves for the next release: the requests collected after the
    rollback, exported as JSONL through the API, and what the prefix KV cache saved."""
    r = client.get("/api/v1/dataset", params={"version": m.good, "kind": "collected"})
    if r.status_code != 200:
        raise tl.fail("incident data", f"the dataset export answered {r.status_code}: {r.text[:200]}")
    rows = [line for line in r.text.splitlines() if line.strip()]
    if not rows:
        raise tl.fail("incident data", f"no request of {m.good} was collected after the rollback")
    path = root / "incident-data.jsonl"
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    state["dataset"] = str(path)
    tl.done("incident data", f"{len(rows)} requests collected after the rollback, exported to {path}")
    prefix_cache_step(httpx.get(f"{base}/metrics", timeout=30).text, tl)
    return path


def prefix_cache_step(metrics: str, tl: Timeline) -> None:
    """What the prefix KV cache saved, from /metrics; none is a failed step, not a pass."""
    saved = hits = 0.0
    for line in metrics.splitlines():
        if line.startswith("infersight_prefix_cache_tokens_saved_total{"):
            saved += float(line.rsplit(" ", 1)[1])
        elif line.startswith("infersight_prefix_cache_hits_total{"):
            hits += float(line.rsplit(" ", 1)[1])
    if hits <= 0:
        raise tl.fail("prefix cache", "no prompt block was served from the prefix KV cache (is it on? "
                                      "engine.prefix_cache_mb)")  # fmt: skip
    tl.done("prefix cache", f"{hits:.0f} prompt blocks served from the prefix KV cache, {saved:.0f} prompt "
                            "tokens not prefilled (the chat template and shared prefixes)")  # fmt: skip


def _summary(out: TextIO, tl: Timeline, state: dict[str, Any], failed: str | None) -> None:
    print("", file=out)
    if failed is None:
        print(f"demo complete: every step happened in {tl.steps[-1].at_s:.0f} s.", file=out)
    else:
        print(f"demo FAILED at step {failed!r}.", file=out)
    if state.get("canary_share") is not None:
        print(
            f"  the bad canary served {state['canary_share']:.1%} of requests before its rollback", file=out
        )
    m: DemoModels | None = state.get("models")
    if state.get("snapshot") and m is not None:
        print(f"  snapshot of the bad release: {state['snapshot']}", file=out)
        service_dir = Path(state["snapshot"]).parent.parent  # <data_dir>/snapshots/<id>.html
        print(f"  its requests as a data set: infersight dataset export --data-dir {service_dir} "
              f"--version {m.bad} --kind snapshot bad-release.jsonl", file=out)  # fmt: skip
    if state.get("dataset"):
        print(f"  the traffic after the rollback, as a data set: {state['dataset']}", file=out)
    if state.get("next_quality") is not None and m is not None:
        print(f"  the next release, {m.next_release} (GPTQ int4 calibrated on that data set): "
              f"{state['next_quality'].describe()}", file=out)  # fmt: skip
    if state.get("next_outcome"):
        print(f"  its canary: {state['next_outcome']}", file=out)
    print("  to watch it on the page: infersight demo --keep-running, then open the URL it prints", file=out)
    out.flush()
