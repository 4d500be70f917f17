"""The demo's record of what happened: named steps, each passed or failed, with a line of
detail and the time since the demo started, printed as they happen; and the wait that ends
a step which did not happen."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TextIO

__all__ = ["DemoFailed", "Step", "Timeline", "wait_until"]


@dataclass(frozen=True)
class Step:
    name: str
    ok: bool
    detail: str
    at_s: float


class DemoFailed(Exception):
    """A step did not happen; `step` names it."""

    def __init__(self, step: str, detail: str) -> None:
        super().__init__(f"{step}: {detail}")
        self.step = step
        self.detail = detail


@dataclass
class Timeline:
    out: TextIO
    t0: float = field(default_factory=time.monotonic)
    steps: list[Step] = field(default_factory=list)

    def done(self, name: str, detail: str) -> None:
        self._add(Step(name, True, detail, time.monotonic() - self.t0))

    def fail(self, name: str, detail: str) -> DemoFailed:
        self._add(Step(name, False, detail, time.monotonic() - self.t0))
        return DemoFailed(name, detail)

    def note(self, text: str) -> None:
        print(f"  {'':>7}  {text}", file=self.out, flush=True)

    def _add(self, step: Step) -> None:
        self.steps.append(step)
        mark = "ok " if step.ok else "FAILED"
        print(f"  {step.at_s:6.1f}s  [{mark:>6}] {step.name}: {step.detail}", file=self.out, flush=True)


def wait_until(predicate: Callable[[], object], timeout_s: float, interval_s: float = 0.25) -> object:
    """`predicate()`'s first true value, or None after `timeout_s`: the timeouts only end a stuck
    step (a loaded 2-core machine took over 30 s to deliver an alert the drift job had flagged)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            return None
        time.sleep(interval_s)
