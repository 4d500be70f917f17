"""Progressive delivery: the paired release checks as the analysis behind a controller's canary.

Argo Rollouts, Flagger and KServe shift the traffic; between steps they ask an analysis
whether to go on. These endpoints answer from `ReleaseVerdicts` (release_verdicts.py): the
state each scored pair leaves, read, never computed per call, so an answer takes a lock and
a dictionary look-up whatever the number of pairs (well inside Argo's 10-s web-metric timeout).

- `GET|POST /api/v1/releases/verdict?candidate=V&baseline=W[&min_pairs=N]` (token): the
  verdict, `pass`, `fail` or `inconclusive`, with the pairs, each check's figure, p-value and
  outcome, the reason in words, a link to the report and the pairs' source. 200 whenever it
  could judge (an inconclusive answer included: Argo reads neither condition as met and
  waits), 404 for a version never seen, 409 when no pairs are made here (say why), 401, 422
  naming the field.
- `GET /api/v1/releases/report?candidate=V&baseline=W`: the same as plain text for a person
  (figures only, no user text: no token, like the deploy history).
- `POST /api/v1/releases/flagger/{gate|check|rollback}`: Flagger's webhook body (`name`,
  `namespace`, `phase`, `metadata` with `candidate`, `baseline` and optionally `min_pairs`;
  the token in `Authorization` or, as Flagger sends no headers of its own, `metadata.token`).
  `gate` (a `confirm-promotion` hook, which Flagger retries until 2xx): 200 on pass, 425 while
  inconclusive, 412 on fail. `check` (a `rollout` hook, whose non-2xx Flagger counts as a failed
  check): 412 with the reason on fail, 200 otherwise, inconclusive included, since too few pairs
  is no evidence against the candidate (the gate holds the promotion until it passes).
  `rollback` (Flagger rolls back on 2xx): 200 on fail, 412 on pass, 425 while inconclusive.
  Each change of a hook's answer for a (candidate, baseline) goes into the deploy history
  (`reason` flagger_gate, flagger_check or flagger_rollback; `outcome` the verdict), as the
  built-in canary's decisions do; Flagger asks every interval, and the repeats add nothing.
"""

from __future__ import annotations

import datetime as dt
import logging
import re
from typing import Any, Literal
from urllib.parse import urlencode

from fastapi import APIRouter, Depends, HTTPException, Query, Request
from fastapi.responses import JSONResponse, PlainTextResponse
from infersight.monitor.store.tables import deploys
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import insert, select
from starlette.concurrency import run_in_threadpool

from ..errors import UnknownRelease
from ..http_edge import error_body, require_token, token_matches
from ..release_verdicts import ReleaseVerdict, ReleaseVerdicts
from . import get_service

__all__ = ["FLAGGER_STATUS", "router", "verdict_json"]

log = logging.getLogger(__name__)
router = APIRouter(tags=["releases"])

_NAME = r"^[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,255}$"  # as the deploy marks' names (releases.py)
_MAX_MIN_PAIRS = 1_000_000
Hook = Literal["gate", "check", "rollback"]
# (hook, verdict) -> the status Flagger reads: 2xx advances (gate, check) or rolls back (rollback)
FLAGGER_STATUS: dict[tuple[str, str], int] = {
    ("gate", "pass"): 200, ("gate", "inconclusive"): 425, ("gate", "fail"): 412,
    ("check", "pass"): 200, ("check", "inconclusive"): 200, ("check", "fail"): 412,
    ("rollback", "fail"): 200, ("rollback", "pass"): 412, ("rollback", "inconclusive"): 425,
}  # fmt: skip


def _verdicts(request: Request) -> ReleaseVerdicts:
    verdicts = get_service(request).parts.verdicts
    if verdicts is None:
        raise HTTPException(503, {"field": None, "reason": "the service is not started"})
    if not verdicts.enabled:
        raise HTTPException(
            409, {"field": None, "reason": f"no verdict can be judged here: {verdicts.source}"}
        )
    return verdicts


def _lookup(verdicts: ReleaseVerdicts, candidate: str, baseline: str, min_pairs: int | None,
            where: str) -> ReleaseVerdict:  # fmt: skip
    """The verdict, or the HTTP error naming the field (`where`: query or body.metadata)."""
    if min_pairs is not None and not verdicts.min_pairs <= min_pairs <= _MAX_MIN_PAIRS:
        reason = (f"must lie in [{verdicts.min_pairs}, {_MAX_MIN_PAIRS}]: no paired check decides on fewer "
                  f"than {verdicts.min_pairs} pairs")  # fmt: skip
        raise HTTPException(422, {"field": f"{where}.min_pairs", "reason": reason})
    try:
        return verdicts.lookup(candidate, baseline, min_pairs)
    except UnknownRelease as exc:
        raise HTTPException(404, {"field": f"{where}.{exc.field}", "reason": exc.reason}) from None


def _report_url(request: Request, v: ReleaseVerdict) -> str:
    query = urlencode({"candidate": v.candidate, "baseline": v.baseline, "min_pairs": v.min_pairs})
    return f"{str(request.base_url).rstrip('/')}/api/v1/releases/report?{query}"


def verdict_json(v: ReleaseVerdict, *, source: str, report: str) -> dict[str, Any]:
    return {
        "verdict": v.verdict, "candidate": v.candidate, "baseline": v.baseline, "pairs": v.pairs,
        "min_pairs": v.min_pairs, "checks": {c.name: c.to_json() for c in v.checks}, "reason": v.reason,
        "report": report, "source": source,
    }  # fmt: skip


def verdict_line(v: ReleaseVerdict) -> str:
    return f"{v.verdict} {v.candidate} against {v.baseline}: {v.pairs} pairs (min {v.min_pairs}): {v.reason}"


_VERDICT_DOC: dict[str, Any] = {
    "dependencies": [Depends(require_token)],
    "responses": {401: {"description": "token"}, 404: {"description": "a version never seen here, named"},
                  409: {"description": "no pairs are made here (the reason)"},
                  422: {"description": "a bad parameter, named"}},
}  # fmt: skip
_CANDIDATE = Query(
    max_length=256, pattern=_NAME, description="the version under test (as its answers name it)"
)
_BASELINE = Query(max_length=256, pattern=_NAME, description="the version it is compared with")
_MIN_PAIRS = Query(None, description="pairs before any verdict but inconclusive (default and least: "
                   "the paired checks' own minimum)")  # fmt: skip


@router.get("/api/v1/releases/verdict", summary="The paired checks' verdict on a candidate against a baseline",
            **_VERDICT_DOC)  # fmt: skip
async def verdict(
    request: Request,
    candidate: str = _CANDIDATE,
    baseline: str = _BASELINE,
    min_pairs: int | None = _MIN_PAIRS,
) -> dict[str, Any]:
    verdicts = _verdicts(request)
    v = _lookup(verdicts, candidate, baseline, min_pairs, "query")
    return verdict_json(v, source=verdicts.source, report=_report_url(request, v))


@router.post("/api/v1/releases/verdict", summary="The same verdict, for controllers that POST (Argo's web "
             "metric with a body)", **_VERDICT_DOC)  # fmt: skip
async def verdict_post(
    request: Request,
    candidate: str = _CANDIDATE,
    baseline: str = _BASELINE,
    min_pairs: int | None = _MIN_PAIRS,
) -> dict[str, Any]:
    return await verdict(request, candidate, baseline, min_pairs)


@router.get("/api/v1/releases/report", summary="The verdict in words, for a person (figures only)",
            response_class=PlainTextResponse)  # fmt: skip
async def report(
    request: Request,
    candidate: str = _CANDIDATE,
    baseline: str = _BASELINE,
    min_pairs: int | None = _MIN_PAIRS,
) -> PlainTextResponse:
    verdicts = _verdicts(request)
    v = _lookup(verdicts, candidate, baseline, min_pairs, "query")
    lines = [verdict_line(v), f"pairs from: {verdicts.source}", ""]
    lines += [f"{'passed' if c.passed else 'REGRESSED' if c.passed is False else 'undecided'}: {c.text}"
              for c in v.checks]  # fmt: skip
    return PlainTextResponse("\n".join(lines) + "\n")


class FlaggerWebhook(BaseModel):
    """Flagger's webhook payload (other fields it sends, such as `checksum`, are ignored)."""

    model_config = ConfigDict(extra="ignore")
    name: str = Field(max_length=253, description="the Canary's name")
    namespace: str = Field(max_length=253)
    phase: str = Field("", max_length=64, description="the Canary's phase (Progressing, Promoting, ...)")
    metadata: dict[str, str] = Field(
        default_factory=dict,
        description="the hook's metadata: candidate, baseline, optionally min_pairs and token",
    )


def _metadata_name(body: FlaggerWebhook, key: str) -> str:
    value = body.metadata.get(key)
    if value is None or not re.fullmatch(_NAME, value):
        why = "is required" if value is None else "must be a version name (letters, digits, ._:/@+-)"
        raise HTTPException(422, {"field": f"body.metadata.{key}", "reason": f"{why}: the version "
                                  f"{'under test' if key == 'candidate' else 'it is compared with'}"})  # fmt: skip
    return value


@router.post(
    "/api/v1/releases/flagger/{hook}", summary="Flagger's webhooks: gate (confirm-promotion), check (rollout), "
    "rollback", responses={401: {"description": "token"}, 404: {"description": "a version never seen here"},
                           412: {"description": "gate/check: failed; rollback: passed"},
                           425: {"description": "gate/rollback: inconclusive"}},
)  # fmt: skip
async def flagger(hook: Hook, body: FlaggerWebhook, request: Request) -> JSONResponse:
    expected: str = request.app.state.token
    given = request.headers.get("authorization") or (
        f"Bearer {body.metadata['token']}" if "token" in body.metadata else None
    )
    if not token_matches(expected, given):
        raise HTTPException(
            401,
            {
                "field": "header.authorization",
                "reason": "a valid bearer token is required (the Authorization header, or metadata.token)",
            },
            headers={"WWW-Authenticate": 'Bearer realm="infersight"'},
        )
    candidate, baseline = _metadata_name(body, "candidate"), _metadata_name(body, "baseline")
    raw_min = body.metadata.get("min_pairs")
    if raw_min is not None and not raw_min.isdigit():
        raise HTTPException(422, {"field": "body.metadata.min_pairs", "reason": "must be a whole number"})
    verdicts = _verdicts(request)
    v = _lookup(verdicts, candidate, baseline, int(raw_min) if raw_min else None, "body.metadata")
    status = FLAGGER_STATUS[(hook, v.verdict)]
    service = get_service(request)
    detail = f"{status} to Flagger's {hook} hook for {body.namespace}/{body.name} ({body.phase or '-'}): {v.reason}"
    await run_in_threadpool(_record, service, hook, v, detail)
    out = verdict_json(v, source=verdicts.source, report=_report_url(request, v)) | {"hook": hook}
    if status >= 400:
        out |= error_body(status, f"{v.verdict}: {v.reason}")
    return JSONResponse(out, status_code=status)


def _record(service: Any, hook: str, v: ReleaseVerdict, detail: str) -> None:
    """The hook's answer into the deploy history, when it differs from its last one there."""
    reason = f"flagger_{hook}"
    d = deploys.c
    with service.db.begin() as conn:
        last = conn.execute(
            select(d.outcome).where(d.reason == reason, d.to_version == v.candidate, d.from_version == v.baseline)
            .order_by(d.at.desc(), d.id.desc()).limit(1)
        ).scalar()  # fmt: skip
        if last == v.verdict:
            return
        conn.execute(insert(deploys).values(
            at=dt.datetime.now(dt.UTC), from_version=v.baseline, to_version=v.candidate, reason=reason,
            outcome=v.verdict, detail=detail[:4000], replica=service.replica_id,
        ))  # fmt: skip
    log.warning("release %s against %s: %s", v.candidate, v.baseline, detail)
