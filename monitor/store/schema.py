"""The complete schema: importing this module defines every table on `metadata`."""

from __future__ import annotations

from infersight.alerts import tables as _alerts_tables  # noqa: F401
from infersight.monitor.drift import tables as _drift_tables  # noqa: F401
from infersight.monitor.store import tables as _store_tables  # noqa: F401
from infersight.monitor.store.metadata import metadata

__all__ = ["metadata"]
