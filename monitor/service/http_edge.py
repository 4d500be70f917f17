"""The HTTP edge every router shares: who may call (the bearer token), how much a request may
send (the body size limit), and how every error becomes a JSON answer.

Bearer-token checks and the request body size limit.

Every state-changing endpoint depends on `require_token`; the comparison is constant-time
(`hmac.compare_digest`). `BodySizeLimit` is a pure ASGI middleware: a declared
Content-Length over the limit is refused before the body is read, and a chunked body is
cut off (413) as soon as it passes the limit, so no handler ever holds more than the limit.

How errors become HTTP answers: always JSON `{"error": {"type", "message", "field"}}`
(`param` too, for OpenAI clients), never a 500 for bad input. A timestamp goes out as
`json_time` writes it.

A client that hangs up while its answer is being made: `unless_hung_up` watches the
connection (the ASGI `http.disconnect` message) beside the work and cancels the work when
the client leaves first, so a non-streamed answer nobody waits for stops generating."""

from __future__ import annotations

import asyncio
import datetime as dt
import hmac
import logging
import os
import secrets
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

from fastapi import FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from sqlalchemy.exc import OperationalError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .errors import BackendUnavailable, IngestOverloaded, NoRuntime, UpstreamUnreachable

__all__ = [
    "BodySizeLimit",
    "error_body",
    "has_token",
    "install_error_handlers",
    "json_time",
    "load_or_create_token",
    "require_token",
    "token_matches",
    "unless_hung_up",
]


def json_time(value: dt.datetime | None) -> str | None:
    """A timestamp as the API writes it: ISO 8601 in UTC with a `Z`; None stays None."""
    return None if value is None else value.astimezone(dt.UTC).isoformat().replace("+00:00", "Z")


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


def has_token(request: Request) -> bool:
    """Whether the request carries the right bearer token (it is not required: answers
    to it may say more, such as which version served it)."""
    return token_matches(request.app.state.token, request.headers.get("authorization"))


HUNG_UP = 499  # the status of an answer nobody waits for (never sent: the client is gone)


async def unless_hung_up(request: Request, work: Awaitable[Response]) -> Response:
    """`work`'s answer, unless the client hangs up (ASGI `http.disconnect`) first: then
    `work` is cancelled (its `CancelledError` handlers stop what it started and record the
    request as `cancelled`) and an empty `HUNG_UP` answer, which nobody reads, is returned.
    Call it once the body is read: from then on the server's next message is the disconnect."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnected(request.receive))
    try:
        await asyncio.wait((task, watcher), return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:  # the server cancelled this request itself (shutdown)
        task.cancel()
        watcher.cancel()
        raise
    if not task.done():
        task.cancel()
        await asyncio.wait((task,))
        if task.cancelled() or task.exception() is not None:
            return Response(status_code=HUNG_UP)
    watcher.cancel()
    return task.result()


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


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


log = logging.getLogger(__name__)

_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
          404: "not_found_error", 405: "invalid_request_error", 409: "conflict_error",
          413: "payload_too_large", 422: "invalid_request_error", 502: "upstream_error",
          503: "service_unavailable"}  # fmt: skip


def error_body(status: int, message: str, field: str | None = None, **extra: Any) -> dict[str, Any]:
    param = field.split(".", 1)[1] if field and field.startswith("body.") else field
    return {"error": {"type": _TYPES.get(status, "error"), "message": message, "field": field,
                      "param": param, "code": None, **extra}}  # fmt: skip


def _loc(loc: tuple[Any, ...] | list[Any]) -> str:
    return ".".join(str(p) for p in loc)


async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
    errors = [{"field": _loc(e.get("loc", ())), "reason": str(e.get("msg", ""))} for e in exc.errors()]
    first = errors[0] if errors else {"field": "body", "reason": "invalid request"}
    body = error_body(422, f"{first['field']}: {first['reason']}", first["field"], errors=errors)
    return JSONResponse(body, status_code=422)


async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    detail = exc.detail
    if isinstance(detail, dict):
        body = error_body(exc.status_code, str(detail.get("reason", "")), detail.get("field"))
    else:
        body = error_body(exc.status_code, str(detail))
    return JSONResponse(body, status_code=exc.status_code, headers=getattr(exc, "headers", None))


async def _overloaded(request: Request, exc: IngestOverloaded) -> JSONResponse:
    return JSONResponse(error_body(503, str(exc)), status_code=503, headers={"Retry-After": "1"})


async def _backend(request: Request, exc: BackendUnavailable) -> JSONResponse:
    status = 502 if isinstance(exc, UpstreamUnreachable) else 503
    return JSONResponse(error_body(status, str(exc)), status_code=status)


async def _no_runtime(request: Request, exc: NoRuntime) -> JSONResponse:
    return JSONResponse(error_body(409, str(exc)), status_code=409)


async def _database(request: Request, exc: OperationalError) -> JSONResponse:
    log.warning("database unavailable: %s", exc)
    return JSONResponse(error_body(503, "the database is unavailable; retry later"), status_code=503,
                        headers={"Retry-After": "2"})  # fmt: skip


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(RequestValidationError, _validation)  # type: ignore[arg-type]
    app.add_exception_handler(StarletteHTTPException, _http)  # type: ignore[arg-type]
    app.add_exception_handler(IngestOverloaded, _overloaded)  # type: ignore[arg-type]
    app.add_exception_handler(BackendUnavailable, _backend)  # type: ignore[arg-type]
    app.add_exception_handler(NoRuntime, _no_runtime)  # type: ignore[arg-type]
    app.add_exception_handler(OperationalError, _database)  # type: ignore[arg-type]
