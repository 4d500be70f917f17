"""Users' feedback from the SDK: `monitor.feedback(request_id, score=...)`.

Like `@track`, it never blocks and never raises into the caller: an item is checked for
its shape (one request id, exactly one of score, thumbs or rating), put on a bounded queue
of its own (full: dropped and counted) and sent in batches from a background thread to
the sink's `send_feedback` (HttpSink: the sidecar's `POST /api/v1/feedback`, the same
token). The sidecar checks the rest and joins the item to its request, whenever that
arrives. A comment is text: kept for the same sampled share as prompts (`sample_rate`),
then truncated and redacted by the SDK's own hook on the delivery thread.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from typing import Any

from ._config import SDKConfig, SDKCounters, SinkError
from ._outbox import Outbox
from ._tracker import MAX_REQUEST_ID_CHARS

__all__ = ["FeedbackQueue"]

_MAX_ID_CHARS = MAX_REQUEST_ID_CHARS


def _shape_problem(request_id: Any, score: Any, thumbs: Any, rating: Any) -> str | None:
    if not isinstance(request_id, str) or not request_id or len(request_id) > _MAX_ID_CHARS:
        return "feedback_request_id"
    given = [v for v in (score, thumbs, rating) if v is not None]
    if len(given) != 1:
        return "feedback_value"
    if score is not None and (
        isinstance(score, bool)
        or not isinstance(score, int | float)
        or not math.isfinite(score)
        or not 0 <= score <= 1
    ):
        return "feedback_value"
    if thumbs is not None and thumbs not in ("up", "down"):
        return "feedback_value"
    if rating is not None and (
        isinstance(rating, bool) or not isinstance(rating, int) or not 1 <= rating <= 5
    ):
        return "feedback_value"
    return None


class _FeedbackSink:
    """The outbox's sink for feedback: the configured sink's `send_feedback`."""

    def __init__(self, get_config: Callable[[], SDKConfig]) -> None:
        self._config = get_config

    def __call__(self, items: Sequence[Any]) -> int:
        send = getattr(self._config().sink, "send_feedback", None)
        if send is None:
            raise SinkError("the configured sink takes no feedback (HttpSink does)")
        refused = send(list(items))
        return refused if isinstance(refused, int) else 0


class FeedbackQueue:
    def __init__(
        self,
        get_config: Callable[[], SDKConfig],
        counters: SDKCounters,
        text: Callable[[str, str | None], str | None],
    ) -> None:
        self._get_config = get_config
        self._counters = counters
        self._text = text
        sink = _FeedbackSink(get_config)
        self._cached: tuple[SDKConfig, SDKConfig] | None = None

        def config() -> SDKConfig:  # the user's config with the feedback sink in its place
            user = get_config()
            cached = self._cached
            if cached is None or cached[0] is not user:
                cached = (user, user.with_changes(sink=sink) if user.sink is not None else user)
                self._cached = cached
            return cached[1]

        self._outbox = Outbox(config, counters, self._prepare)

    def put(
        self,
        request_id: Any,
        *,
        score: Any = None,
        thumbs: Any = None,
        rating: Any = None,
        kind: Any = None,
        comment: Any = None,
        user: Any = None,
    ) -> bool:
        """Queues one item -> whether it was queued. Never raises."""
        try:
            problem = _shape_problem(request_id, score, thumbs, rating)
            if problem is not None:
                self._counters.count("rejected", problem)
                return False
            item: dict[str, Any] = {"request_id": request_id}
            for key, value in (("score", score), ("thumbs", thumbs), ("rating", rating), ("kind", kind),
                               ("user", user)):  # fmt: skip
                if value is not None:
                    item[key] = value if key != "score" else float(value)
            if isinstance(comment, str) and comment:
                item["comment"] = comment
            self._outbox.put(item)
            return True
        except Exception:
            self._counters.count("internal", "feedback")
            return False

    def _prepare(self, items: list[Any]) -> list[Any]:
        """On the delivery thread: comments sampled like prompts, truncated and redacted."""
        rate = self._get_config().sample_rate
        for item in items:
            comment = item.pop("comment", None)
            if comment is not None and rate and (rate >= 1.0 or random.random() < rate):
                kept = self._text("comment", comment)
                if kept:
                    item["comment"] = kept
        return items

    def flush(self, timeout: float) -> bool:
        return self._outbox.flush(timeout)

    def stop(self, timeout: float) -> bool:
        return self._outbox.stop(timeout)

    def after_fork_in_child(self) -> None:
        self._outbox.after_fork_in_child()
