"""Helpers shared by the store and service tests: one database per backend."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest


def database_url(request: pytest.FixtureRequest, tmp_path: Any) -> str:
    """`request.param` is "sqlite" or "postgres" (the real server, fresh database)."""
    if request.param == "postgres":
        return str(request.getfixturevalue("postgres_url"))
    return f"sqlite:///{tmp_path}/infersight.sqlite"


def request_row(
    i: int, *, at: dt.datetime, version: str = "mixtral_banking_fp32-v1.0", **extra: Any
) -> dict[str, Any]:
    row: dict[str, Any] = {
        "request_id": f"req-{i}",
        "model": "mixtral_banking",
        "model_version": version,
        "started_at": at,
        "duration_s": 0.1 + i / 1000,
        "ttft_s": 0.01,
        "tpot_s": 0.002,
        "queue_s": 0.0,
        "prompt_tokens": 7,
        "output_tokens": 9,
        "error_type": None,
        "prompt": f"how do I top up my card {i}",
        "response": "you can top up in the app",
        "source": "sdk",
    }
    row.update(extra)
    return row
