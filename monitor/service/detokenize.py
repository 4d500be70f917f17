"""Streaming detokenization with stop strings: text is released only when no stop string
can still begin in it, and never ends in half a character (U+FFFD)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

__all__ = ["TextStream"]


class TextStream:
    def __init__(self, decode: Callable[[list[int]], str], stops: Sequence[str] = ()) -> None:
        self._decode = decode
        self._stops = [s for s in stops if s]
        self._hold = max((len(s) for s in self._stops), default=1) - 1
        self._ids: list[int] = []
        self._emitted = 0
        self.text = ""
        self.stopped = False  # a stop string was found; the text ends before it

    def push(self, token_id: int) -> str:
        """Add a token; the newly releasable text ("" when nothing can be released yet)."""
        if self.stopped:
            return ""
        self._ids.append(token_id)
        text = self._decode(self._ids)
        for stop in self._stops:
            at = text.find(stop, max(0, self._emitted - len(stop)))
            if at != -1:
                self.stopped = True
                self.text = text[:at]
                return self._release(len(self.text))
        self.text = text
        safe = len(text) - self._hold
        if text.endswith("\ufffd"):
            safe = min(safe, len(text) - 1)
        return self._release(safe)

    def flush(self) -> str:
        """The rest of the text at the end of generation."""
        return self._release(len(self.text))

    @property
    def token_count(self) -> int:
        return len(self._ids)

    def _release(self, upto: int) -> str:
        if upto <= self._emitted:
            return ""
        chunk = self.text[self._emitted : upto]
        self._emitted = upto
        return chunk
