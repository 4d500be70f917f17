"""Keeping the service's resident memory flat under glibc.

The embedding model (PyTorch) allocates differently shaped buffers from several threads
at every batch; glibc's default of one malloc arena per thread (up to 8 per core) keeps
the freed memory of each arena, and RSS climbs for minutes (benchmarks/ingest.py;
docs/benchmarks.md). Capping the arenas at two and
handing free heap pages back after each embedding batch (`malloc_trim`) keeps it flat.
Both are no-ops where the C library is not glibc.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import sys

__all__ = ["limit_malloc_arenas", "trim_heap"]

log = logging.getLogger(__name__)
_M_ARENA_MAX = -8


def _glibc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None
    return libc if hasattr(libc, "malloc_trim") and hasattr(libc, "mallopt") else None


_LIBC = _glibc()


def limit_malloc_arenas(arenas: int = 2) -> bool:
    """Cap glibc's malloc arenas for threads created from now on; True when applied."""
    if _LIBC is None:
        return False
    return bool(_LIBC.mallopt(_M_ARENA_MAX, arenas))


def trim_heap() -> None:
    """Return free heap memory to the operating system."""
    if _LIBC is not None:
        _LIBC.malloc_trim(0)
