"""What a web page in the operator's browser cannot make the service do.

A page on any site can make the browser send a "simple" request (a form's POST, with
`Content-Type: text/plain`) to a sidecar on localhost without asking first, and a page on a
name the attacker re-points at 127.0.0.1 (DNS rebinding) can even read the answers. Two
checks close both, before any route runs:

- **Content-Type.** A request with a body to the API (`/v1/...`, `/api/...`) must say
  `application/json` (or a `+json` type); anything else is 415, naming `header.content-type`.
  A browser sends that type cross-site only after a CORS preflight, which this service never
  grants. The OTLP receiver's path also accepts protobuf.
- **Host.** The `Host` header must name the address the service listens on: the listen host,
  the address the connection arrived at, and on loopback `localhost` and the loopback
  literals, plus the names in `allowed_hosts` (`["*"]`: any). Anything else is 421, naming
  `header.host`. A service bound to every address (`0.0.0.0`, `::`) cannot know the names
  its clients use: it checks Host only when `allowed_hosts` is given. A request without a
  Host header (an HTTP/1.0 health checker) is no browser's, and is answered.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from starlette.types import ASGIApp, Receive, Scope, Send

from .config import is_loopback

__all__ = ["BrowserGuard"]

_API_PREFIXES = ("/v1/", "/api/")
_JSON_TYPES = ("application/json",)
# routes whose bodies are another format as well: the OTLP/HTTP receiver takes protobuf
_OTHER_BODIES = {"/v1/traces": ("application/x-protobuf",)}
_LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
_WILDCARDS = ("0.0.0.0", "::", "")


def _host_name(value: str) -> str:
    """`example.com:8321` -> `example.com`; `[::1]:8321` -> `::1`; lowercased."""
    value = value.strip().lower()
    if value.startswith("["):
        return value[1:].partition("]")[0]
    if value.count(":") == 1:
        return value.partition(":")[0]
    return value


class BrowserGuard:
    def __init__(self, app: ASGIApp, *, listen_host: str, allowed_hosts: Sequence[str] = ()) -> None:
        self.app = app
        allowed = {_host_name(h) for h in allowed_hosts}
        self.any_host = "*" in allowed or (not allowed and listen_host.strip("[]") in _WILDCARDS)
        self.hosts = allowed | {_host_name(listen_host)}
        if is_loopback(listen_host):
            self.hosts |= set(_LOOPBACK_NAMES)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            refusal = self._refusal(scope)
            if refusal is not None:
                status, field, message = refusal
                await _answer(send, status, field, message)
                return
        await self.app(scope, receive, send)

    def _refusal(self, scope: Scope) -> tuple[int, str, str] | None:
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", ())}
        if not self.any_host:
            host = _host_name(headers.get("host", ""))
            server = scope.get("server") or ("", None)
            # no Host at all (HTTP/1.0 health checkers) is no browser's request: answered
            if host and host not in self.hosts and host != _host_name(str(server[0] or "")):
                return 421, "header.host", f"Host {host[:100]!r} is not an address this service answers on"
        path: str = scope.get("path", "")
        has_body = headers.get("content-length", "0") not in ("0", "") or "transfer-encoding" in headers
        if has_body and path.startswith(_API_PREFIXES):
            media = headers.get("content-type", "").partition(";")[0].strip().lower()
            accepted = _JSON_TYPES + _OTHER_BODIES.get(path, ())
            if media not in accepted and not media.endswith("+json"):
                shown = media or "none"
                return 415, "header.content-type", f"Content-Type must be application/json, got {shown}"
        return None


async def _answer(send: Send, status: int, field: str, message: str) -> None:
    kind = "misdirected_request" if status == 421 else "unsupported_media_type"
    body = json.dumps(
        {"error": {"type": kind, "message": message, "field": field, "param": field, "code": None}}
    ).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})  # fmt: skip
    await send({"type": "http.response.body", "body": body})
