"""The HTTP endpoints, one module per concept, each exposing `router`: `monitoring` (health,
`/metrics`, the page's overview, alerts and silences, drift), `ingest` (the SDK's batches
in, datasets out) and `models` (the OpenAI-compatible `/v1`, deploys and canaries,
snapshots). `get_service` is the dependency they share."""

from __future__ import annotations

from fastapi import Request

from ..service import Service

__all__ = ["get_service"]


def get_service(request: Request) -> Service:
    """The service of the app handling `request`."""
    service: Service = request.app.state.service
    return service
