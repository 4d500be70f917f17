"""Helpers for the service tests: a config in a temp dir, a started app, a token."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from fastapi import FastAPI
from fastapi.testclient import TestClient
from infersight.monitor.service import ServiceConfig, create_app
from infersight.monitor.service.config import DriftConfig, ScheduleConfig

TOKEN = "test-token-0123456789abcdef"


def config(tmp_path: Path, **overrides: Any) -> ServiceConfig:
    base = ServiceConfig(
        data_dir=tmp_path / "data",
        token=TOKEN,
        schedule=ScheduleConfig(timeseries_s=0.2, timeseries_window_s=30.0),
        drift=DriftConfig(enabled=False),  # loading the embedding model costs seconds; on where tested
    )
    return dataclasses.replace(base, **overrides)


def auth(token: str = TOKEN) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@contextmanager
def running(cfg: ServiceConfig, **seams: Any) -> Iterator[tuple[FastAPI, TestClient]]:
    app = create_app(cfg, **seams)
    with TestClient(app, raise_server_exceptions=False) as client:
        yield app, client


def event(i: int, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "request_id": f"r-{i}",
        "model": "mixtral_banking",
        "model_version": "mixtral_banking_fp32-v1.0",
        "started_at": time.time(),
        "duration_s": 0.05 + (i % 10) / 100,
        "ttft_s": 0.01,
        "prompt_tokens": 12,
        "output_tokens": 20,
    }
    body.update(extra)
    return body


def wait_for(
    predicate: Any, timeout: float = 30.0, what: str = "condition", *, interval: float = 0.05
) -> Any:
    """`predicate()`'s first true value; the timeout only ends a run that is stuck (generous:
    a loaded 2-core machine must not fail a test that would pass given the time); `what`
    names the condition in the failure."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"{what}: not met within {timeout:g} s")
