"""Tables of this package, defined on `infersight.monitor.store.metadata.metadata`."""

from __future__ import annotations

from infersight.monitor.store.metadata import metadata  # noqa: F401
