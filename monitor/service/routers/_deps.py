"""Dependencies the routers share: the service of the app handling the request."""

from __future__ import annotations

from fastapi import Request

from ..service import Service

__all__ = ["get_service"]


def get_service(request: Request) -> Service:
    service: Service = request.app.state.service
    return service

