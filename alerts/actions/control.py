"""`ModelControl`: what actions need of the serving engine, and the adapter for the engine's
`Runtime` (duck-typed: alerts/ does not import the engine)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

from ..errors import ActionFailed

__all__ = ["ModelControl", "ReplicaTargets", "RuntimeControl"]


@runtime_checkable
class ModelControl(Protocol):
    """Each method either completes or raises `ActionFailed`, and on failure the engine
    keeps serving the version it served before (the actions verify this)."""

    def serving_version(self) -> str | None: ...

    def deploy(self, version: str) -> None: ...

    def rollback(self) -> None: ...

    def failover(self, version: str) -> None: ...


class ReplicaTargets(Protocol):
    """Which replicas a model action acts on, where several share one database."""

    def replicas_for(self, labels: Mapping[str, str]) -> list[str]:
        """From the alert's labels: the replica named by `replica`, or the one whose GPU
        is `uuid`, or the live replicas serving `model_version` that served its requests
        lately (all those serving it when none did); with none of these labels, every
        live replica with a runtime."""
        ...


class RuntimeControl:
    """`ModelControl` over `infersight.engine.Runtime`: engine errors (DeployRefused and
    its subclasses, RuntimeNotRunning, VersionNotFound) become `ActionFailed`."""

    def __init__(self, runtime: Any) -> None:
        self.runtime = runtime

    def serving_version(self) -> str | None:
        version = self.runtime.serving_version
        return None if version is None else str(version)

    def _call(self, action: str, fn: Any, *args: str) -> None:
        try:
            fn(*args)
        except Exception as exc:  # the engine's typed errors, re-raised as ours
            raise ActionFailed(
                action, f"{type(exc).__name__}: {exc}", serving_version=self.runtime.serving_version
            ) from exc

    def deploy(self, version: str) -> None:
        self._call("hot_reload", self.runtime.deploy, version)

    def rollback(self) -> None:
        self._call("rollback", self.runtime.rollback)

    def failover(self, version: str) -> None:
        self._call("failover", self.runtime.failover, version)
