"""Users' feedback on requests: parsed, kept apart from the requests, joined by request id.

A feedback item names its request by `request_id`: the `id` of an OpenAI-compatible answer
(served by the embedded engine, or the upstream's own id when proxied) or an SDK record's
request id. Exactly one of `score` (0..1), `thumbs` (up/down) or `rating` (1-5, normalised
to (rating - 1) / 4) gives its value; the value as given is kept beside the normalised
score. Items are stored in the `feedback` table and never touch the request's row. The
join happens when it is read (`joined_feedback`), so feedback that arrives hours after
its request, or before it, joins it all the same; feedback whose request has not arrived
within the TTL is deleted by `expire_orphans`.

Comment text is the user's: it is kept for the same sampled share as the service keeps
request text, truncated, and redacted (credentials out, then the service's own hook).
"""

from __future__ import annotations

import datetime as dt
import math
import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from infersight.monitor.redaction import redact_text
from infersight.monitor.store.tables import feedback, requests
from sqlalchemy import Engine, delete, exists, insert, select

from .errors import FeedbackInvalid

__all__ = [
    "FEEDBACK_SOURCES",
    "Feedback",
    "JoinedFeedback",
    "TextKeeping",
    "expire_orphans",
    "joined_feedback",
    "parse_feedback",
    "store_feedback",
]

FEEDBACK_SOURCES = ("http", "sdk", "otlp")
MAX_COMMENT_CHARS = 4096
_FIELDS = frozenset({"request_id", "score", "thumbs", "rating", "kind", "comment", "user"})
_VALUES = ("score", "thumbs", "rating")


@dataclass(frozen=True)
class Feedback:
    request_id: str
    score: float  # 0..1
    given: str  # the value as given: "0.7", "up", "4/5"
    kind: str | None = None
    comment: str | None = None
    user: str | None = None


@dataclass(frozen=True)
class JoinedFeedback:
    """A feedback item joined to its request's latency and shape."""

    request_id: str
    score: float
    model_version: str
    path: str | None
    duration_s: float
    ttft_s: float | None
    prompt_tokens: int | None


def _string(obj: Mapping[str, Any], name: str, limit: int, *, required: bool = False) -> str | None:
    value = obj.get(name)
    if value is None:
        if required:
            raise FeedbackInvalid(name, "is required")
        return None
    if not isinstance(value, str) or not value:
        raise FeedbackInvalid(name, "must be a non-empty string")
    if len(value) > limit:
        raise FeedbackInvalid(name, f"longer than {limit} characters")
    return value


def parse_feedback(obj: object) -> Feedback:
    """A feedback item from its JSON object; `FeedbackInvalid` names the first bad field."""
    if not isinstance(obj, dict):
        raise FeedbackInvalid("body", "must be a JSON object")
    extra = sorted(k for k in obj if k not in _FIELDS)
    if extra:
        raise FeedbackInvalid(extra[0], "unknown field")
    request_id = _string(obj, "request_id", 256, required=True)
    assert request_id is not None
    given = [k for k in _VALUES if obj.get(k) is not None]
    if len(given) != 1:
        raise FeedbackInvalid("score", "give exactly one of score (0..1), thumbs (up|down) or rating (1-5)")
    value = obj[given[0]]
    if given[0] == "score":
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise FeedbackInvalid("score", "must be a number from 0 to 1")
        if not 0.0 <= value <= 1.0:
            raise FeedbackInvalid("score", "must be a number from 0 to 1")
        score, shown = float(value), repr(float(value))
    elif given[0] == "thumbs":
        if value not in ("up", "down"):
            raise FeedbackInvalid("thumbs", "must be 'up' or 'down'")
        score, shown = (1.0 if value == "up" else 0.0), value
    else:
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 5:
            raise FeedbackInvalid("rating", "must be an integer from 1 to 5")
        score, shown = (value - 1) / 4, f"{value}/5"
    return Feedback(
        request_id,
        score,
        shown,
        kind=_string(obj, "kind", 64),
        comment=_string(obj, "comment", MAX_COMMENT_CHARS),
        user=_string(obj, "user", 256),
    )


@dataclass(frozen=True)
class TextKeeping:
    """How comment text is kept: the share kept, the longest kept, the service's hook."""

    sample_rate: float = 1.0
    max_chars: int = MAX_COMMENT_CHARS
    redact: Callable[[str], str] | None = None
    rng: Callable[[], float] = random.random

    def keep(self, text: str | None) -> str | None:
        if text is None or self.sample_rate <= 0 or self.rng() >= self.sample_rate:
            return None
        out = redact_text(text[: self.max_chars])
        if self.redact is not None:
            try:
                out = self.redact(out)
            except Exception:  # a hook that fails drops the text, as the dataset export does
                return None
        return out


def store_feedback(
    engine: Engine,
    items: Sequence[Feedback],
    *,
    source: str,
    now: dt.datetime,
    text: TextKeeping | None = None,
) -> int:
    """Keeps `items` in one transaction -> how many."""
    if source not in FEEDBACK_SOURCES:
        raise ValueError(f"unknown feedback source {source!r}")
    if not items:
        return 0
    keeping = text or TextKeeping()
    rows = [
        {"request_id": f.request_id, "received_at": now, "score": f.score, "given": f.given,
         "kind": f.kind, "comment": keeping.keep(f.comment), "user": f.user, "source": source}
        for f in items
    ]  # fmt: skip
    with engine.begin() as conn:
        conn.execute(insert(feedback), rows)
    return len(rows)


def expire_orphans(engine: Engine, *, now: dt.datetime, ttl_s: float) -> int:
    """Deletes feedback older than `ttl_s` whose request never arrived -> how many."""
    cutoff = now - dt.timedelta(seconds=ttl_s)
    known = exists().where(requests.c.request_id == feedback.c.request_id)
    with engine.begin() as conn:
        result = conn.execute(delete(feedback).where(feedback.c.received_at < cutoff, ~known))
    return int(result.rowcount or 0)


def joined_feedback(
    engine: Engine,
    *,
    since: dt.datetime | None = None,
    model_version: str | None = None,
    kind: str | None = None,
    request_ids: Iterable[str] | None = None,
) -> list[JoinedFeedback]:
    """Feedback joined to its request (feedback without its request yet is left out);
    `since` bounds the request's start. Several items on one request each count."""
    f, r = feedback.c, requests.c
    q = select(f.request_id, f.score, r.model_version, r.path, r.duration_s, r.ttft_s, r.prompt_tokens).join(
        requests, r.request_id == f.request_id
    )
    if since is not None:
        q = q.where(r.started_at >= since)
    if model_version is not None:
        q = q.where(r.model_version == model_version)
    if kind is not None:
        q = q.where(f.kind == kind)
    if request_ids is not None:
        q = q.where(f.request_id.in_(list(request_ids)))
    with engine.connect() as conn:
        return [JoinedFeedback(*row) for row in conn.execute(q.order_by(f.id))]
