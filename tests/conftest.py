"""Shared test helpers: free loopback ports, real services, and the CI rule.

In CI (`CI=true`) a test that needs a real service or executable fails when it is
missing; on a developer machine it is skipped with the reason.
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
import uuid
from collections.abc import Iterator

import pytest

IN_CI = os.environ.get("CI", "").lower() in {"1", "true", "yes"}
# the engine's native kernels and path verdicts (engine/paths.py) are cached per session,
# never in the developer's home directory; subprocesses (a started `infersight serve`) inherit it
os.environ.setdefault("INFERSIGHT_CACHE_DIR", tempfile.mkdtemp(prefix="infersight-test-cache-"))
POSTGRES_ADMIN_URL = os.environ.get(
    "INFERSIGHT_TEST_POSTGRES", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)


def missing_service(reason: str) -> None:
    """Fail in CI, skip elsewhere: a missing real component is never a silent pass."""
    if IN_CI:
        pytest.fail(f"required service missing in CI: {reason}")
    pytest.skip(reason)


def require_executable(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        missing_service(f"executable {name!r} not on PATH (Debian package needed)")
    assert path is not None
    return path


def free_port() -> int:
    """A free TCP port on 127.0.0.1 (bound then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def postgres_url() -> Iterator[str]:
    """A fresh, empty PostgreSQL database on the machine's own server, dropped afterwards."""
    sqlalchemy = pytest.importorskip("sqlalchemy")
    admin = sqlalchemy.create_engine(POSTGRES_ADMIN_URL, isolation_level="AUTOCOMMIT")
    name = f"infersight_test_{uuid.uuid4().hex[:12]}"
    try:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    except Exception as exc:  # the server is a real dependency of these tests
        admin.dispose()
        missing_service(f"PostgreSQL at {POSTGRES_ADMIN_URL} unavailable: {exc}")
    url = POSTGRES_ADMIN_URL.rsplit("/", 1)[0] + f"/{name}"
    try:
        yield url
    finally:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.dispose()
