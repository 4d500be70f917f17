"""How errors become HTTP answers: always JSON `{"error": {"type", "message", "field"}}`
(`param` too, for OpenAI clients), never a 500 for bad input."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import OperationalError
from starlette.exceptions import HTTPException as StarletteHTTPException

from .errors import BackendUnavailable, IngestOverloaded, NoRuntime, UpstreamUnreachable

__all__ = ["error_body", "install_error_handlers"]

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
