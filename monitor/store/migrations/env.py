"""Alembic environment: always run programmatically with a connection handed in by
`infersight.monitor.store.database` (there is no alembic.ini and no URL here)."""

from __future__ import annotations

from typing import Any, Literal

from alembic import context
from infersight.monitor.store.tables import UTCDateTime, metadata


def _render_item(type_: str, obj: Any, autogen_context: Any) -> str | Literal[False]:
    if type_ == "type" and isinstance(obj, UTCDateTime):
        return "UTCDateTime()"
    return False


connection = context.config.attributes.get("connection")
if connection is None:
    raise RuntimeError("infersight migrations run only through infersight.monitor.store.database")

context.configure(
    connection=connection,
    target_metadata=metadata,
    render_as_batch=True,  # SQLite cannot ALTER most things: copy-and-move, keeping rows
    compare_type=True,
    render_item=_render_item,
)
with context.begin_transaction():
    context.run_migrations()
