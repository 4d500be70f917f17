"""The loop closed: what the incident collected becomes the next release.

After the rollbacks the service kept the requests that followed them, and the demo exported
them as JSONL (`GET /api/v1/dataset`, the format of `infersight dataset export`). Here:

1. that file calibrates a GPTQ int4 build of the good version (`infersight models quantize
   REGISTRY GOOD NEXT --method gptq --calibration FILE`), registered with the good version as
   its parent;
2. the build's quality against the good version on held-out texts (utterances the demo never
   sent): each model's perplexity on them, the share of positions where the two agree on the
   most likely next token, and the mean KL divergence of the build's next-token distribution
   from the good version's;
3. the build goes out as a canary at half the users through the same API as the bad release,
   and whatever the canary analysis decides is what the demo reports: promoted to every user,
   or rolled back with the check that failed. Either is a decision; only no decision at all
   fails the step.
"""

from __future__ import annotations

import contextlib
import io
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from .models import DemoModels
from .stage import keep_sending
from .timeline import Timeline, wait_until

__all__ = ["NEXT_CANARY_WEIGHT", "BuildQuality", "build_quality", "next_release"]

# Half the users: the service's canary moves on after 200 canary requests at a step without a
# regression, and at 0.5 the next step is every user, so one step decides the promotion.
NEXT_CANARY_WEIGHT = 0.5


@dataclass(frozen=True)
class BuildQuality:
    """The build against the good version on the same held-out texts."""

    texts: int
    tokens: int  # next-token predictions scored
    perplexity_good: float
    perplexity_build: float
    top1_agreement: float  # share of positions where both models' most likely token agree
    kl: float  # mean KL(good || build) per position, nats

    def describe(self) -> str:
        change = self.perplexity_build / self.perplexity_good - 1.0
        return (
            f"perplexity {self.perplexity_build:.4g} against the good version's {self.perplexity_good:.4g} "
            f"({change:+.1%}), top-1 agreement {self.top1_agreement:.1%}, KL {self.kl:.4f} nats, "
            f"on {self.tokens} tokens of {self.texts} held-out utterances"
        )


def next_release(
    base: str,
    client: httpx.Client,
    tl: Timeline,
    models: DemoModels,
    registry: Path,
    dataset: Path,
    held_out: list[str],
    traffic: list[str],
    state: dict[str, Any],
) -> None:
    _build(tl, models, registry, dataset, state)
    from infersight.engine.errors import EngineError
    from infersight.engine.registry import Registry

    reg = Registry(registry)
    good, build = reg.get(models.good), reg.get(models.next_release)
    try:
        quality = build_quality(good.path, build.path, build.quantize, held_out)
    except (EngineError, ValueError, OSError) as exc:
        raise tl.fail("next release quality", f"{type(exc).__name__}: {exc}") from exc
    state["next_quality"] = quality
    tl.done("next release quality", f"{models.next_release}: {quality.describe()}")
    _canary(base, client, tl, models, traffic, state)


def _build(tl: Timeline, models: DemoModels, registry: Path, dataset: Path, state: dict[str, Any]) -> None:
    from infersight.monitor.cli import main

    argv = ["models", "quantize", str(registry), models.good, models.next_release,
            "--method", "gptq", "--calibration", str(dataset)]  # fmt: skip
    captured = io.StringIO()
    started = time.monotonic()
    with contextlib.redirect_stdout(captured), contextlib.redirect_stderr(captured):
        rc = main(argv)
    report = captured.getvalue().strip()
    if rc != 0:
        raise tl.fail("next release built", f"`infersight models quantize` failed: {report[-300:]}")
    state["next_release"] = models.next_release
    line = report.splitlines()[-1] if report else "registered"
    tl.done("next release built", f"the incident's data calibrated a GPTQ build in "
                                  f"{time.monotonic() - started:.0f} s: {line}")  # fmt: skip


def build_quality(good: Path, build: Path, quantize: str | None, texts: list[str]) -> BuildQuality:
    """Perplexity of both checkpoints on `texts` (each utterance alone, every position after
    its first token predicted), top-1 agreement and KL(good || build) per position."""
    import torch
    from infersight.engine import load

    reference = load(good, device="cpu", engine_path="eager")
    candidate = load(build, device="cpu", engine_path="eager", quantize=quantize)
    tokenizer = reference.tokenizer
    if tokenizer is None:
        raise ValueError(f"{good} has no tokenizer.json: the held-out texts cannot be scored")
    nll_good = nll_build = kl = 0.0
    agree = scored = used = 0
    with torch.inference_mode():
        for text in texts:
            ids = tokenizer.encode(text).ids
            if len(ids) < 2:
                continue
            batch = torch.tensor([ids])
            targets = batch[0, 1:]
            p = reference.logits(batch)[0, :-1].float().log_softmax(-1)  # [n, V]
            q = candidate.logits(batch)[0, :-1].float().log_softmax(-1)
            nll_good -= float(p.gather(1, targets[:, None]).sum())
            nll_build -= float(q.gather(1, targets[:, None]).sum())
            kl += float((p.exp() * (p - q)).sum())
            agree += int((p.argmax(-1) == q.argmax(-1)).sum())
            scored += len(targets)
            used += 1
    if not scored:
        raise ValueError("no held-out text is two tokens long")
    return BuildQuality(used, scored, math.exp(nll_good / scored), math.exp(nll_build / scored),
                        agree / scored, kl / scored)  # fmt: skip


def _canary(
    base: str,
    client: httpx.Client,
    tl: Timeline,
    models: DemoModels,
    traffic: list[str],
    state: dict[str, Any],
) -> None:
    name = models.next_release
    r = client.post("/api/v1/models/canary", json={"version": name, "weight": NEXT_CANARY_WEIGHT})
    if r.status_code != 200:
        raise tl.fail("next release canary", f"canary answered {r.status_code}: {r.text[:200]}")
    stop, sent, worker = keep_sending(
        base, traffic, rounds=60, user_prefix="next", max_tokens=models.max_tokens
    )

    def decided() -> dict[str, Any] | None:
        decisions = client.get("/api/v1/models/canary").json()["decisions"]
        ends = [
            d for d in decisions if d["version"] == name and (d["action"] == "rollback" or d["weight"] >= 1.0)
        ]
        return ends[-1] if ends else None  # fmt: skip

    decision = wait_until(decided, max(models.decide_s, 300.0), 0.5)
    stop.set()
    worker.join(120)
    if not isinstance(decision, dict):
        status = client.get("/api/v1/models/canary").json()
        raise tl.fail("next release canary", f"no decision on {name} after {sum(sent)} requests "
                                             f"({status.get('canary_requests')} to the canary)")  # fmt: skip
    promoted = decision["action"] == "promote"
    # the promotion or rollback swaps replicas: the demo ends (and stops the service) once done
    serving = name if promoted else models.good
    wait_until(lambda: client.get("/api/v1/models").json()["serving_version"] == serving, 120, 0.5)
    state["next_promoted"] = promoted
    outcome = "promoted to every user" if promoted else "rolled back"
    state["next_outcome"] = outcome
    tl.done(
        "next release canary",
        f"{name} as a canary at {NEXT_CANARY_WEIGHT:.0%} of users: {outcome} after {decision['canary_requests']} "
        f"canary requests: {decision['reason'][:400]}",
    )
