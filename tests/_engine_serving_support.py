"""Shared by the serving and deploy tests: tiny real checkpoints, a registry, a runtime,
an event recorder, and greedy references computed by the engine's own `generate`."""

from __future__ import annotations

import json
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from _engine_checkpoints import save_checkpoint
from infersight.engine import load
from infersight.engine.events import EngineEvent, PairCompleted
from infersight.engine.registry import Registry
from infersight.engine.runtime import Runtime
from safetensors.torch import load_file, save_file

V1 = "mixtral_tiny_fp32-v1.0"
V2 = "mixtral_tiny_fp32-v1.1"
VOCAB = 96


@pytest.fixture(scope="session")
def tiny_checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two real tiny Mixtral checkpoints with different answers (v1.1 negates lm_head)."""
    root = tmp_path_factory.mktemp("serving-ckpt")
    v1 = root / "v1"
    save_checkpoint(v1, seed=0, max_position_embeddings=256)
    config = json.loads((v1 / "config.json").read_text())
    config["eos_token_id"] = None  # no early stop unless a test asks for one
    (v1 / "config.json").write_text(json.dumps(config))
    (v1 / "generation_config.json").unlink(missing_ok=True)  # its eos stops generation as config.json's does
    v2 = perturbed_copy(v1, root / "v2", lambda name, t: -t if name == "lm_head.weight" else t)
    return {V1: v1, V2: v2}


def perturbed_copy(src: Path, dst: Path, change: Callable[[str, torch.Tensor], torch.Tensor]) -> Path:
    """A copy of checkpoint `src` with every tensor passed through `change(name, tensor)`."""
    dst.mkdir(parents=True)
    for f in src.iterdir():
        if f.suffix != ".safetensors":
            shutil.copy(f, dst / f.name)
    for f in src.glob("*.safetensors"):
        tensors = {k: change(k, v).contiguous() for k, v in load_file(str(f)).items()}
        save_file(tensors, str(dst / f.name), metadata={"format": "pt"})
    return dst


@pytest.fixture
def registry(tmp_path: Path, tiny_checkpoints: dict[str, Path]) -> Registry:
    reg = Registry(tmp_path / "registry")
    reg.register(V1, tiny_checkpoints[V1])
    reg.register(V2, tiny_checkpoints[V2], parent=V1)
    return reg


@pytest.fixture(scope="session")
def greedy(tiny_checkpoints: dict[str, Path]) -> Callable[[str, list[int], int], list[int]]:
    """Greedy continuation of one prompt, alone, by `MoEModel.generate` of that version."""
    models = {name: load(path) for name, path in tiny_checkpoints.items()}

    def run(version: str, prompt: list[int], n: int) -> list[int]:
        return models[version].generate(torch.tensor([prompt]), n)[0].tolist()

    return run


class Recorder:
    """A subscriber that keeps every event (thread-safe)."""

    def __init__(self) -> None:
        self.events: list[EngineEvent] = []
        self._lock = threading.Lock()

    def __call__(self, event: EngineEvent) -> None:
        with self._lock:
            self.events.append(event)

    def of(self, kind: type, request_id: str | None = None) -> list:  # type: ignore[type-arg]
        with self._lock:
            return [
                e
                for e in self.events
                if isinstance(e, kind)
                and (request_id is None or getattr(e, "request_id", None) == request_id)
            ]

    def for_request(self, request_id: str) -> list[EngineEvent]:
        with self._lock:
            return [e for e in self.events if getattr(e, "request_id", None) == request_id]


@pytest.fixture
def runtime(registry: Registry) -> Iterator[Runtime]:
    rt = Runtime(registry, max_batch_size=4, max_prompt_tokens=32, max_seq_len=64)
    rt.start(V1)
    try:
        yield rt
    finally:
        rt.stop(drain=False)


def prompt(seed: int, length: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB, (length,), generator=g).tolist()


def completed_pairs(recorder: Recorder, n: int, timeout: float = 60.0) -> list[PairCompleted]:
    """The first `n` (or more) `PairCompleted` events `recorder` saw, waited for up to `timeout` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = recorder.of(PairCompleted)
        if len(found) >= n:
            return found
        time.sleep(0.02)
    raise AssertionError(f"{len(recorder.of(PairCompleted))} pairs, not {n}, within {timeout:g} s")
