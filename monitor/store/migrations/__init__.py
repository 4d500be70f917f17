"""Alembic migrations of infersight's schema, shipped as package data.

Run them with `infersight.monitor.store.database.upgrade(engine)`; `infersight serve`
does so at start. Regenerate the initial revision after a table changes (nothing has
shipped yet, so there is one) with `python -m infersight.monitor.store.migrations.regenerate`.
"""
