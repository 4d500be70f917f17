"""Regenerate the single initial revision from the complete metadata.

    python -m infersight.monitor.store.migrations.regenerate

Historical: the schema started as one revision regenerated from the metadata. Since
main has been deployed, table changes are new revisions after the head (0002 on), written
by hand or with `alembic revision --autogenerate` in the same environment; this script
rewrites only 0001 and must not be run any more (tests/test_store_migrations.py checks
that the revisions and the metadata agree).
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

from alembic import command
from infersight.monitor.store.database import _config, connect

_HERE = Path(__file__).resolve().parent


def main() -> int:
    versions = _HERE / "versions"
    later = sorted(
        p.name
        for p in versions.glob("*.py")
        if p.name not in ("__init__.py",) and not p.name.startswith("0001_")
    )
    if later:
        print(
            f"refusing: revisions after 0001 exist ({', '.join(later)}); add a new revision instead",
            file=sys.stderr,
        )
        return 2
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
