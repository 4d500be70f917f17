"""The service's errors, and how every error becomes an HTTP answer.

Errors of the service.

    ServiceError
    ├── ConfigInvalid          the config file or an environment variable is wrong (names the field)
    ├── InsecureBind           a non-loopback address was asked for without a token
    ├── BackendUnavailable     no embedded runtime and no upstream: /v1 cannot be served
    │   └── UpstreamUnreachable   the upstream server did not answer (connection, timeout)
    ├── NoRuntime              a model operation needs the embedded runtime (proxy mode has none)
    └── IngestOverloaded       the store's write queue is full: the client should retry later

HTTP mapping (routers): ConfigInvalid never reaches HTTP; BackendUnavailable 503,
UpstreamUnreachable 502, NoRuntime 409, IngestOverloaded 503 with Retry-After.

How errors become HTTP answers: always JSON `{"error": {"type", "message", "field"}}`
(`param` too, for OpenAI clients), never a 500 for bad input."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import OperationalError
from starlette.exceptions import HTTPException as StarletteHTTPException

__all__ = [
    "BackendUnavailable",
    "ConfigInvalid",
    "IngestOverloaded",
    "InsecureBind",
    "NoRuntime",
    "ServiceError",
    "UpstreamUnreachable",
    "error_body",
    "install_error_handlers",
]


class ServiceError(Exception):
    """Base class of the service's errors."""


class ConfigInvalid(ServiceError):
    """`field` is the dotted path in the config file (or the environment variable)."""

    def __init__(self, field: str, reason: str, *, source: str | None = None) -> None:
        where = f"{source}: " if source else ""
        super().__init__(f"{where}{field}: {reason}")
        self.field = field
        self.reason = reason
        self.source = source


class InsecureBind(ServiceError):
    """Binding beyond loopback needs a bearer token (INFERSIGHT_TOKEN or `token:`)."""

    def __init__(self, host: str) -> None:
        super().__init__(
            f"refusing to listen on {host!r} without a token: set INFERSIGHT_TOKEN (or `token:` in "
            "the config file), or bind 127.0.0.1"
        )
        self.host = host


class BackendUnavailable(ServiceError):
    """Neither an embedded runtime nor an upstream server is configured or running."""


class UpstreamUnreachable(BackendUnavailable):
    """The upstream OpenAI-compatible server did not answer."""


class NoRuntime(ServiceError):
    """A model operation (deploy, rollback) needs the embedded runtime."""


class IngestOverloaded(ServiceError):
    """The store's write queue is full; nothing of the batch was accepted."""


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
