"""The environment record: which software a service process ran on, at each start and deploy.

`current_environment()` reads the versions of python, torch (and the CUDA runtime it was
built for), the CUDA driver (NVML, where there is one), transformers, onnxruntime,
openvino, the embedded engine's native library level and infersight itself, without
importing any of the heavy packages (package metadata only; torch's CUDA level from its
`version.py`). `record_environment` keeps it in the `environments` table with a
fingerprint; `changed_components` names what differs between two records, which is what
the DependencyChanged alert and the slowdown diagnosis say.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import platform
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib import metadata, util
from pathlib import Path
from typing import Any

from infersight.monitor.store.tables import environments
from sqlalchemy import Engine, desc, insert, select

__all__ = [
    "COMPONENTS",
    "EnvironmentRecord",
    "changed_components",
    "current_environment",
    "environment_at",
    "environment_history",
    "record_environment",
]

COMPONENTS = (
    "python", "infersight", "torch", "cuda_runtime", "cuda_driver", "transformers",
    "onnxruntime", "openvino", "engine_native",
)  # fmt: skip
_DISTRIBUTIONS = {"infersight": "infersight", "torch": "torch", "transformers": "transformers",
                  "onnxruntime": "onnxruntime", "openvino": "openvino"}  # fmt: skip


@dataclass(frozen=True)
class EnvironmentRecord:
    taken_at: dt.datetime
    reason: str  # start, deploy
    replica: str | None
    versions: Mapping[str, str | None]
    fingerprint: str

    def to_json(self) -> dict[str, Any]:
        return {"taken_at": self.taken_at.isoformat(), "reason": self.reason, "replica": self.replica,
                "versions": dict(self.versions), "fingerprint": self.fingerprint}  # fmt: skip


def _distribution(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _torch_cuda() -> str | None:
    spec = util.find_spec("torch")
    if spec is None or spec.origin is None:
        return None
    version_py = Path(spec.origin).parent / "version.py"
    try:
        for line in version_py.read_text(encoding="utf-8").splitlines():
            if line.startswith("cuda"):
                value = line.split("=", 1)[1].strip().strip("'\"")
                return None if value in ("None", "") else value
    except OSError:
        return None
    return None


def current_environment(
    *,
    cuda_driver: Callable[[], str | None] | None = None,
    engine_native: Callable[[], str | None] | None = None,
) -> dict[str, str | None]:
    """The versions of this process's software; `cuda_driver`: the NVML read, `engine_native`:
    the native library level the engine would load (each None: not known here)."""
    versions: dict[str, str | None] = {"python": platform.python_version()}
    for key, dist in _DISTRIBUTIONS.items():
        versions[key] = _distribution(dist)
    versions["cuda_runtime"] = _torch_cuda()
    try:
        versions["cuda_driver"] = cuda_driver() if cuda_driver is not None else None
    except Exception:  # no driver reading is no reason to refuse a start
        versions["cuda_driver"] = None
    try:
        versions["engine_native"] = engine_native() if engine_native is not None else None
    except Exception:
        versions["engine_native"] = None
    return {k: versions.get(k) for k in COMPONENTS}


def _fingerprint(versions: Mapping[str, str | None]) -> str:
    return hashlib.sha256(json.dumps(dict(versions), sort_keys=True).encode()).hexdigest()


def _record(row: Any) -> EnvironmentRecord:
    return EnvironmentRecord(row.taken_at, row.reason, row.replica, json.loads(row.versions), row.fingerprint)


def record_environment(
    engine: Engine,
    versions: Mapping[str, str | None],
    *,
    reason: str,
    now: dt.datetime,
    replica: str | None = None,
) -> tuple[EnvironmentRecord, EnvironmentRecord | None]:
    """Keeps this record -> (it, the one before it)."""
    before = environment_at(engine, now)
    fp = _fingerprint(versions)
    with engine.begin() as conn:
        conn.execute(insert(environments).values(taken_at=now, reason=reason, replica=replica,
                                                 versions=json.dumps(dict(versions), sort_keys=True),
                                                 fingerprint=fp))  # fmt: skip
    return EnvironmentRecord(now, reason, replica, dict(versions), fp), before


def environment_at(engine: Engine, at: dt.datetime) -> EnvironmentRecord | None:
    """The record in force at `at`: the latest taken at or before it."""
    q = select(environments).where(environments.c.taken_at <= at)
    with engine.connect() as conn:
        row = conn.execute(
            q.order_by(desc(environments.c.taken_at), desc(environments.c.id)).limit(1)
        ).first()
    return None if row is None else _record(row)


def environment_history(engine: Engine, *, limit: int = 50) -> list[EnvironmentRecord]:
    """The latest `limit` records, newest first."""
    q = select(environments).order_by(desc(environments.c.taken_at), desc(environments.c.id)).limit(limit)
    with engine.connect() as conn:
        return [_record(r) for r in conn.execute(q)]


def changed_components(
    before: Mapping[str, str | None], after: Mapping[str, str | None]
) -> dict[str, tuple[str | None, str | None]]:
    """{component: (before, after)} of the components whose version differs."""
    keys = [k for k in COMPONENTS if k in before or k in after] + sorted(
        set(before) | set(after) - set(COMPONENTS)
    )
    return {k: (before.get(k), after.get(k)) for k in keys if before.get(k) != after.get(k)}
