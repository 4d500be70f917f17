"""Regenerate the single initial revision from the complete metadata.

    python -m infersight.monitor.store.migrations.regenerate

Nothing has shipped, so the schema is one revision; run this after any table changes
(tests/test_store_migrations.py fails until you do). Once a release ships, add new
revisions instead (`alembic revision --autogenerate` semantics, same environment).
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

from alembic import command
from infersight.monitor.store.database import connect
from infersight.monitor.store.migrate import _config

_HERE = Path(__file__).resolve().parent


def main() -> int:
    versions = _HERE / "versions"
    for old in versions.glob("*.py"):
        if old.name != "__init__.py":
            old.unlink()
    with tempfile.TemporaryDirectory() as tmp:
        engine = connect(f"sqlite:///{tmp}/empty.sqlite")
        with engine.begin() as conn:
            cfg = _config(conn, script_location=_HERE)
            command.revision(cfg, message="initial schema", autogenerate=True, rev_id="0001")
        engine.dispose()
    generated = sorted(versions.glob("0001_*.py"))
    ruff = Path(sys.executable).with_name("ruff")
    if ruff.exists():
        subprocess.run([str(ruff), "check", "--fix", "-q", *map(str, generated)], check=False)
        subprocess.run([str(ruff), "format", "-q", *map(str, generated)], check=False)
    print("\n".join(str(p) for p in generated))
    return 0


if __name__ == "__main__":
    sys.exit(main())
