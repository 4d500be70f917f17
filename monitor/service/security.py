"""Bearer-token checks and the request body size limit.

Every state-changing endpoint depends on `require_token`; the comparison is constant-time
(`hmac.compare_digest`). `BodySizeLimit` is a pure ASGI middleware: a declared
Content-Length over the limit is refused before the body is read, and a chunked body is
cut off (413) as soon as it passes the limit, so no handler ever holds more than the limit.
"""

from __future__ import annotations

import hmac
import os
import secrets
from pathlib import Path
from typing import Any

from fastapi import HTTPException, Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["BodySizeLimit", "load_or_create_token", "require_token", "token_matches"]


def token_matches(expected: str, authorization: str | None) -> bool:
    if not authorization:
        return False
    scheme, _, given = authorization.partition(" ")
    if scheme.lower() != "bearer" or not given:
        return False
    return hmac.compare_digest(given.strip().encode("utf-8", "surrogatepass"), expected.encode("utf-8"))


def require_token(request: Request) -> None:
    """FastAPI dependency: 401 unless `Authorization: Bearer <token>` is right."""
    expected: str = request.app.state.token
    if not token_matches(expected, request.headers.get("authorization")):
        raise HTTPException(
            status_code=401,
            detail={"field": "header.authorization", "reason": "a valid bearer token is required"},
            headers={"WWW-Authenticate": 'Bearer realm="infersight"'},
        )


def load_or_create_token(data_dir: Path) -> str:
    """The token kept in `data_dir/api-token` (mode 0600), created on first use."""
    path = data_dir / "api-token"
    if path.is_file():
        token = path.read_text(encoding="utf-8").strip()
        if len(token) >= 16:
            return token
    data_dir.mkdir(parents=True, exist_ok=True)
    token = secrets.token_urlsafe(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(token + "\n")
    return token


class _TooLarge(Exception):
    pass


class BodySizeLimit:
    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.max_bytes:
            await _send_413(send, self.max_bytes)
            return
        seen = 0
        over = False  # the body passed the limit: whatever the app answers becomes a 413
        started = False

        async def limited_receive() -> Message:
            nonlocal seen, over
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    over = True
                    raise _TooLarge
            return message

        async def tracking_send(message: Message) -> None:
            # FastAPI turns any exception raised while it reads a body (ours included) into
            # a 400 "error parsing the body": once the limit is passed, that answer is replaced.
            nonlocal started
            if over:
                if not started:
                    started = True
                    await _send_413(send, self.max_bytes)
                return
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except _TooLarge:
            if not started:
                started = True
                await _send_413(send, self.max_bytes)


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


async def _send_413(send: Send, limit: int) -> None:
    body = (
        b'{"error":{"type":"payload_too_large","field":"body","message":"request body is larger than '
        + str(limit).encode()
        + b' bytes"}}'
    )
    headers: list[Any] = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
    ]
    await send({"type": "http.response.start", "status": 413, "headers": headers})
    await send({"type": "http.response.body", "body": body})
