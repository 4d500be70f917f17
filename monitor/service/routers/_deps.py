"""Dependencies the routers share: the service of the app handling the request."""

from __future__ import annotations

from typing import Any

from fastapi import Request

from ..service import Service

__all__ = ["component", "get_service"]


def get_service(request: Request) -> Service:
    service: Service = request.app.state.service
    return service


def component(request: Request, name: str) -> Any:
    return get_service(request).components.get(name)
