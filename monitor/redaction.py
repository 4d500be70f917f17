"""Credentials and query strings never reach a log line or an error message.

A URL is shown as its scheme, host, port and path: the user information
(`user:password@`) becomes `***@` and the query string (`?key=...`) becomes `?***`; a
fragment is dropped. `redact_url` does that to one URL, `redact_text` to every URL inside
a text (an exception's message, a log line).

`install_log_redaction` is what `infersight serve` calls once, at start: every log record
of the process (ours, uvicorn's, httpx's) is redacted where it is made, message and
traceback, and the chattiest third-party loggers are kept at WARNING, so that httpx's
INFO line per request (a Slack webhook URL carries its secret in the path) is not
written. Stdlib only: the SDK, the alerts and the service all use it.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable
from typing import Any

__all__ = ["QUIET_LOGGERS", "install_log_redaction", "redact_text", "redact_url"]

# scheme://[userinfo@]host[:port][/path][?query][#fragment], ending at a space or a quote
_URL = re.compile(
    r"(?P<scheme>\b[a-zA-Z][a-zA-Z0-9+.-]*://)"
    r"(?P<userinfo>[^\s/?#@'\"<>]*@)?"
    r"(?P<rest>[^\s?#'\"<>]*)"
    r"(?P<query>\?[^\s#'\"<>]*)?"
    r"(?P<fragment>#[^\s'\"<>]*)?"
)
# loggers of libraries that log URLs or bodies at INFO/DEBUG: WARNING unless asked otherwise
QUIET_LOGGERS = ("httpx", "httpcore", "urllib3", "hpack", "multipart")


def _shown(m: re.Match[str]) -> str:
    return m["scheme"] + ("***@" if m["userinfo"] else "") + m["rest"] + ("?***" if m["query"] else "")


def redact_text(text: str) -> str:
    """`text` with the credentials and query string of every URL in it replaced."""
    if "://" not in text:  # the common case costs one scan
        return text
    return _URL.sub(_shown, text)


def redact_url(url: str) -> str:
    """`https://u:p@host/hook?key=k#x` -> `https://***@host/hook?***`."""
    return redact_text(url)


def install_log_redaction(quiet: Iterable[str] = QUIET_LOGGERS, *, level: int = logging.WARNING) -> None:
    """Redact every log record of the process where it is made; set `quiet` loggers to
    `level`. Idempotent."""
    for name in quiet:
        logging.getLogger(name).setLevel(level)
    factory = logging.getLogRecordFactory()
    if getattr(factory, "_infersight_redacts", False):
        return
    logging.setLogRecordFactory(_redacting(factory))


def _redacting(make: Callable[..., logging.LogRecord]) -> Callable[..., logging.LogRecord]:
    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = make(*args, **kwargs)
        try:
            message = record.getMessage()
        except Exception:  # a bad format string: logging reports it when it formats
            return record
        clean = redact_text(message)
        if clean != message:
            record.msg, record.args = clean, None
        if record.exc_info and not record.exc_text:
            # the handler's formatter uses exc_text when it is set: render it once, redacted
            record.exc_text = redact_text(logging.Formatter().formatException(record.exc_info))
        return record

    factory._infersight_redacts = True  # type: ignore[attr-defined]
    return factory
