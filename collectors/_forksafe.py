"""Re-create locks, queues and threads in a forked child.

A lock held by another thread at `fork()` stays held forever in the child. Objects
that own locks register here; one `os.register_at_fork` hook (installed on first
use, not at import) calls their `_after_fork_in_child()`.
"""

from __future__ import annotations

import os
import threading
import weakref
from typing import Protocol

__all__ = ["ForkAware", "register"]


class ForkAware(Protocol):
    def _after_fork_in_child(self) -> None: ...


class _Hook:
    def __init__(self) -> None:
        self.objects: weakref.WeakSet[ForkAware] = weakref.WeakSet()
        self.installed = False
        self.lock = threading.Lock()


_hook = _Hook()


def _in_child() -> None:
    _hook.lock = threading.Lock()
    for obj in list(_hook.objects):
        try:
            obj._after_fork_in_child()
        except Exception:  # a broken object must not stop the others from recovering
            continue


def register(obj: ForkAware) -> None:
    _hook.objects.add(obj)
    if not _hook.installed:
        with _hook.lock:
            if not _hook.installed and hasattr(os, "register_at_fork"):
                os.register_at_fork(after_in_child=_in_child)
                _hook.installed = True
