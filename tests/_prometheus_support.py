"""A real Prometheus (Debian's package) on a free loopback port, scraping given targets
every second, and the two HTTP API calls the tests make of it."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from conftest import free_port, require_executable

__all__ = ["prometheus_server", "query", "query_range", "wait_for_prometheus"]


@contextmanager
def prometheus_server(tmp_path: Path, targets: list[int], rule_files: Sequence[Path] = ()) -> Iterator[str]:
    """Prometheus scraping 127.0.0.1:<port> for each of `targets` (evaluating `rule_files`);
    yields its base URL."""
    binary = require_executable("prometheus")
    port = free_port()
    config = tmp_path / "prometheus.yml"
    listed = ", ".join(f"'127.0.0.1:{t}'" for t in targets)
    config.write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        + (f"rule_files: [{', '.join(repr(str(r)) for r in rule_files)}]\n" if rule_files else "")
        + "scrape_configs:\n  - job_name: infersight\n    static_configs:\n"
        f"      - targets: [{listed}]\n"
    )
    log = (tmp_path / "prometheus.log").open("w")
    process = subprocess.Popen(
        [binary, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'prometheus-data'}",
         f"--web.listen-address=127.0.0.1:{port}"],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)
        log.close()


def _get(base: str, path: str, params: dict[str, str]) -> Any:
    url = f"{base}{path}?{urllib.parse.urlencode(params)}"
    with urllib.request.urlopen(url, timeout=10) as response:
        body = json.load(response)
    assert body["status"] == "success", body
    return body["data"]["result"]


def query(base: str, promql: str, at: float | None = None) -> list[dict[str, Any]]:
    """An instant query (at `at`, default now)."""
    return list(_get(base, "/api/v1/query", {"query": promql, **({"time": f"{at:.3f}"} if at else {})}))


def query_range(base: str, promql: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
    """A range query, as a Grafana time-series panel runs it."""
    params = {"query": promql, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}"}
    return list(_get(base, "/api/v1/query_range", params))


def wait_for_prometheus(what: str, check: Any, timeout: float = 40.0) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = check()
        except OSError as exc:  # not listening yet
            last = exc
        else:
            if last:
                return last
        time.sleep(0.25)
    raise AssertionError(f"timed out waiting for {what}; last: {last!r}")
