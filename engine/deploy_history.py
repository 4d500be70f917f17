"""The deploy history of a registry, persisted as JSON so that a restart knows the last
good version.

`good` is a stack of versions that served successfully: a deploy or a failover pushes
its version, a rollback pops the current one and returns to the one beneath. `records`
keeps every attempt (refused ones too), newest last, capped at `MAX_RECORDS`.
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

from .errors import RegistryCorrupt

__all__ = ["MAX_RECORDS", "DeployHistory", "DeployRecord"]

MAX_RECORDS = 500
# the last four: canaries ("resumed": a restart picked up the canary the history left open)
Outcome = Literal["deployed", "refused", "started", "reweighted", "rolled_back", "resumed"]


@dataclass(frozen=True, slots=True)
class DeployRecord:
    at: float
    from_version: str | None
    to_version: str
    reason: str  # "start", "deploy", "failover", "rollback", "canary", "canary-promote"
    outcome: Outcome
    message: str = ""
    weight: float | None = None  # a canary's share of users after this record


class DeployHistory:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()

    def records(self) -> list[DeployRecord]:
        """Every recorded attempt, oldest first."""
        return self._load()[0]

    def good_versions(self) -> list[str]:
        """The stack of good versions, the serving (or last serving) one last."""
        return self._load()[1]

    def last_good(self) -> str | None:
        stack = self.good_versions()
        return stack[-1] if stack else None

    def previous_good(self) -> str | None:
        """The version a rollback returns to."""
        stack = self.good_versions()
        return stack[-2] if len(stack) >= 2 else None

    def record(self, record: DeployRecord) -> None:
        """Append `record` and, when it deployed, update the stack of good versions."""
        with self._lock:
            records, stack = self._load()
            records.append(record)
            if record.outcome == "deployed":
                if record.reason == "rollback" and len(stack) >= 2 and stack[-2] == record.to_version:
                    stack.pop()
                elif not stack or stack[-1] != record.to_version:
                    stack.append(record.to_version)
            payload = {"good": stack, "records": [asdict(r) for r in records[-MAX_RECORDS:]]}
            tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps(payload, indent=2) + "\n")
            os.replace(tmp, self.path)

    def _load(self) -> tuple[list[DeployRecord], list[str]]:
        if not self.path.exists():
            return [], []
        try:
            data = json.loads(self.path.read_text())
            records = [DeployRecord(**r) for r in data["records"]]
            stack = [str(v) for v in data["good"]]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise RegistryCorrupt(
                f"{self.path}: unreadable deploy history ({type(exc).__name__}: {exc})"
            ) from exc
        return records, stack
