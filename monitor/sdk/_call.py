"""Call: the state of one tracked call, made fresh for every call.

The decorator's stream wrappers and the context manager (`with track(...) as call`)
use it. Every method swallows and counts its own failures: nothing here raises into
the user's code.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._tracker import Tracker

__all__ = ["Call"]


class Call:
    """One call in progress. In a `with track(...) as call:` block:
    `call.token()` at each streamed token (the first sets the time to first token),
    `call.set_prompt(text)`, `call.set_response(text)`,
    `call.set_token_counts(prompt_tokens=..., output_tokens=...)`, `call.set_queue_time(s)`."""

    __slots__ = (
        "_chunks",
        "_done",
        "_first",
        "_last",
        "_output_tokens",
        "_prompt",
        "_prompt_tokens",
        "_queue_s",
        "_response",
        "_start",
        "_tokens",
        "_tracker",
        "sampled",
    )

    def __init__(self, tracker: Tracker, *, prompt: Any = None, keep_chunks: bool = False) -> None:
        self._tracker = tracker
        self._done = True  # until the start is recorded
        self._first: float | None = None
        self._last: float | None = None
        self._tokens = 0
        self._prompt = prompt
        self._response: Any = None
        self._prompt_tokens: int | None = None
        self._output_tokens: int | None = None
        self._queue_s: float | None = None
        self.sampled = False
        self._chunks: list[Any] | None = None
        try:
            self.sampled = tracker.decide_sample()
            self._chunks = [] if (self.sampled and keep_chunks) else None
            self._start = tracker.clock()
            tracker.series.enter()
            self._done = False
        except Exception:
            tracker.internal("start")

    # -- the user's API (context manager) -----------------------------------------------
    def token(self, n: int = 1) -> None:
        """Mark `n` output tokens as produced now (the first call sets TTFT)."""
        try:
            now = self._tracker.clock()
            if self._first is None:
                self._first = now
            self._last = now
            self._tokens += n if isinstance(n, int) and n > 0 else 1
        except Exception:
            self._tracker.internal("token")

    def set_prompt(self, text: Any) -> None:
        self._prompt = self._tracker.check_text(text)

    def set_response(self, text: Any) -> None:
        self._response = self._tracker.check_text(text)

    def set_token_counts(self, *, prompt_tokens: Any = None, output_tokens: Any = None) -> None:
        for name, value in (("_prompt_tokens", prompt_tokens), ("_output_tokens", output_tokens)):
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                self._tracker.reject("invalid_count")
            else:
                setattr(self, name, value)

    def set_queue_time(self, seconds: Any) -> None:
        if isinstance(seconds, bool) or not isinstance(seconds, int | float):
            self._tracker.reject("invalid_number")
        elif math.isnan(seconds):
            self._tracker.reject("nan_duration")
        elif seconds < 0:
            self._tracker.reject("negative_duration")
        elif math.isinf(seconds):
            self._tracker.reject("infinite_duration")
        else:
            self._queue_s = float(seconds)

    # -- the stream wrappers ----------------------------------------------------------------
    def item(self, item: Any) -> None:
        """One yielded item: counts as one output token; kept for the response if sampled."""
        try:
            now = self._tracker.clock()
            if self._first is None:
                self._first = now
            self._last = now
            self._tokens += 1
            if self._chunks is not None:
                self._chunks.append(item)
        except Exception:
            self._tracker.internal("token")

    def finish(self, error_type: str | None = None) -> None:
        """Record the call once (later calls do nothing)."""
        if self._done:
            return
        self._done = True
        try:
            t = self._tracker
            end = t.clock()
            start, first, last, n = self._start, self._first, self._last, self._tokens
            ttft = None if first is None else first - start
            tpot = (last - first) / (n - 1) if (n > 1 and first is not None and last is not None) else None
            output_tokens = self._output_tokens if self._output_tokens is not None else (n or None)
            t.series.exit(
                end, end - start, ttft, tpot, self._queue_s, self._prompt_tokens, output_tokens, error_type
            )
            if self.sampled:
                response = self._response
                if response is None and self._chunks is not None and error_type is None:
                    response = t.extract_response(self._chunks)
                t.sample(
                    start=start,
                    end=end,
                    ttft=ttft,
                    tpot=tpot,
                    queue=self._queue_s,
                    prompt_tokens=self._prompt_tokens,
                    output_tokens=output_tokens,
                    error_type=error_type,
                    prompt=self._prompt,
                    response=response,
                )
        except Exception:
            self._tracker.internal("finish")
