"""The HTTP seam: one method, `send(request) -> response`. `HttpxSender` is the real one;
tests pass their own to stay fast, or a real one pointed at a local receiver."""

from __future__ import annotations

import datetime as dt
import email.utils
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable
from urllib.parse import urlsplit

import httpx

from .errors import DeliveryFailed

__all__ = [
    "HttpRequest",
    "HttpResponse",
    "HttpSender",
    "HttpxSender",
    "classify",
    "parse_retry_after",
    "url_problem",
]


def url_problem(url: str) -> str | None:
    """Why `url` cannot be sent to (None: it can): not http(s), no host, a port outside
    1..65535, or anything else the HTTP client would refuse at send time."""
    try:
        parts = urlsplit(url)
        port = parts.port  # ValueError when out of range or not a number
    except ValueError as exc:
        return f"url {url!r} is invalid: {exc}"
    if parts.scheme not in ("http", "https"):
        return "url must be http(s)"
    if not parts.hostname:
        return f"url {url!r} has no host"
    if port == 0:
        return f"url {url!r}: port must be in 1..65535"
    try:
        httpx.URL(url)
    except httpx.InvalidURL as exc:
        return f"url {url!r} is invalid: {exc}"
    return None


@dataclass(frozen=True)
class HttpRequest:
    url: str
    body: bytes
    headers: tuple[tuple[str, str], ...] = ()
    method: str = "POST"
    timeout_s: float = 10.0

    def header(self, name: str) -> str | None:
        return next((v for k, v in self.headers if k.lower() == name.lower()), None)


@dataclass(frozen=True)
class HttpResponse:
    status: int
    headers: Mapping[str, str] = field(default_factory=dict)  # names lower-cased
    body: bytes = b""


@runtime_checkable
class HttpSender(Protocol):
    def send(self, request: HttpRequest) -> HttpResponse:
        """Send and return the response, whatever its status; raise `DeliveryFailed`
        (retryable) on a timeout or a connection error, (not retryable) on a URL that
        cannot be sent to."""
        ...


class HttpxSender:
    def __init__(self, client: httpx.Client | None = None) -> None:
        self._client = client or httpx.Client(follow_redirects=False)

    def send(self, request: HttpRequest) -> HttpResponse:
        problem = url_problem(request.url)  # e.g. port 99999, which httpx would try as 34463
        if problem is not None:
            raise DeliveryFailed(problem, retryable=False)
        try:
            r = self._client.request(
                request.method,
                request.url,
                content=request.body,
                headers=list(request.headers),
                timeout=request.timeout_s,
            )
        except (httpx.InvalidURL, httpx.UnsupportedProtocol) as exc:  # InvalidURL is no HTTPError
            raise DeliveryFailed(f"invalid url {request.url!r}: {exc}", retryable=False) from exc
        except httpx.TimeoutException as exc:
            raise DeliveryFailed(f"timeout after {request.timeout_s:g}s: {exc}", retryable=True) from exc
        except httpx.HTTPError as exc:
            raise DeliveryFailed(f"connection error: {type(exc).__name__}: {exc}", retryable=True) from exc
        return HttpResponse(r.status_code, {k.lower(): v for k, v in r.headers.items()}, r.content)

    def close(self) -> None:
        self._client.close()


def parse_retry_after(value: str | None, now: dt.datetime) -> float | None:
    """Seconds to wait from a `Retry-After` header: delta-seconds or an HTTP date."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return max(0.0, (when - now).total_seconds())


def classify(response: HttpResponse, now: dt.datetime) -> None:
    """Return on 2xx; raise `DeliveryFailed`, retryable for 408, 429 and 5xx, not for other statuses."""
    status = response.status
    if 200 <= status < 300:
        return
    snippet = response.body[:200].decode("utf-8", "replace")
    retryable = status in (408, 429) or status >= 500
    raise DeliveryFailed(
        f"HTTP {status}: {snippet}",
        retryable=retryable,
        status=status,
        retry_after=parse_retry_after(response.headers.get("retry-after"), now) if retryable else None,
    )
