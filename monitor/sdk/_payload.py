"""Prompt and response text: default extractors, and the checks, redaction and
truncation applied on the delivery thread before a record leaves the process."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["NON_STRING", "default_prompt", "default_response", "prepare_text"]

NON_STRING = object()  # what the hot path keeps when an extractor returned a non-string


def default_prompt(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The first positional `str` argument, else a `prompt=` keyword (None: no prompt)."""
    for arg in args:
        if isinstance(arg, str):
            return arg
    return kwargs.get("prompt")


def default_response(result: Any) -> Any:
    """A `str` result as is; for a stream (the list of yielded items) the items joined
    when they are all strings. Anything else: None (no response text)."""
    if isinstance(result, str):
        return result
    if isinstance(result, list) and all(isinstance(x, str) for x in result):
        return "".join(result)
    return None


def prepare_text(
    text: str,
    *,
    max_text_chars: int,
    max_payload_chars: int,
    redact: Callable[[str], str] | None,
) -> tuple[str | None, str | None]:
    """`(text to send, rejection or truncation reason)`: a text longer than
    `max_payload_chars` is rejected (`payload_too_large`); a redactor that fails or
    returns a non-string drops the text (`redaction_failed`): unredacted text never
    leaves; a text longer than `max_text_chars` is cut (`truncated`)."""
    if len(text) > max_payload_chars:
        return None, "payload_too_large"
    if redact is not None:
        try:
            text = redact(text)
        except Exception:
            return None, "redaction_failed"
        if not isinstance(text, str):
            return None, "redaction_failed"
    if len(text) > max_text_chars:
        return text[:max_text_chars], "truncated"
    return text, None
