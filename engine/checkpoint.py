"""A checkpoint directory's safetensors files: found, memory-mapped, their headers checked.

`Checkpoint.open` reads only headers (names, shapes, dtypes); `tensor(key)` returns a tensor
that is a view of the file's private memory map (no copy, nothing read until touched).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open

from .errors import CheckpointCorrupt, CheckpointMismatch, CheckpointNotFound, NonFiniteWeights

__all__ = ["Checkpoint", "TensorInfo"]

SINGLE = "model.safetensors"
INDEX = "model.safetensors.index.json"
FLOAT_DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}
_CHUNK = 1 << 24  # elements checked for NaN/Inf at a time: bounds the temporary mask


@dataclass(frozen=True, slots=True)
class TensorInfo:
    key: str
    file: str
    shape: tuple[int, ...]
    dtype: str  # safetensors' name: F32, BF16, ...


class Checkpoint:
    def __init__(self, directory: Path, handles: Mapping[str, Any], infos: Mapping[str, TensorInfo]) -> None:
        self.directory = directory
        self._handles = dict(handles)
        self.infos = dict(infos)

    @classmethod
    def open(cls, directory: str | Path) -> Checkpoint:
        directory = Path(directory)
        if not directory.is_dir():
            raise CheckpointNotFound(str(directory), "is not a directory")
        index = directory / INDEX
        if index.is_file():
            files = _shards(index)
        elif (directory / SINGLE).is_file():
            files = {SINGLE: []}
        elif any(directory.glob("model-*.safetensors")):
            raise CheckpointNotFound(str(index), "sharded weights without their index file")
        else:
            found = ", ".join(sorted(p.name for p in directory.iterdir())) or "nothing"
            raise CheckpointNotFound(
                str(directory / SINGLE), f"no safetensors weights (found: {found}); only safetensors is read"
            )
        handles: dict[str, Any] = {}
        infos: dict[str, TensorInfo] = {}
        for name, listed in files.items():
            path = directory / name
            if not path.is_file():
                example = f", e.g. {listed[0]!r}" if listed else ""
                raise CheckpointNotFound(
                    str(path), f"shard named by {INDEX} for {len(listed)} tensor(s){example} is missing"
                )
            try:
                handle = safe_open(str(path), framework="pt")
                keys = list(handle.keys())
                for key in keys:
                    view = handle.get_slice(key)
                    if key in infos:
                        raise CheckpointMismatch(key, f"stored twice, in {infos[key].file} and {name}")
                    infos[key] = TensorInfo(key, name, tuple(view.get_shape()), view.get_dtype())
            except SafetensorError as exc:
                raise CheckpointCorrupt(str(path), f"not a readable safetensors file: {exc}") from exc
            absent = sorted(set(listed) - set(keys))
            if absent:
                raise CheckpointMismatch(absent[0], f"{INDEX} places it in {name}, which does not hold it")
            handles[name] = handle
        return cls(directory, handles, infos)

    def check(self, expected: Mapping[str, tuple[int, ...]], optional: Iterable[str] = ()) -> None:
        """Raise `CheckpointMismatch` for a missing, unexpected, mis-shaped or non-float tensor."""
        optional = set(optional)
        for key, shape in expected.items():
            info = self.infos.get(key)
            if info is None:
                raise CheckpointMismatch(key, f"missing (expected shape {list(shape)})")
            if info.shape != tuple(shape):
                raise CheckpointMismatch(key, f"shape {list(info.shape)}, expected {list(shape)}")
            if info.dtype not in FLOAT_DTYPES:
                raise CheckpointMismatch(key, f"dtype {info.dtype}, expected one of {sorted(FLOAT_DTYPES)}")
        for key in sorted(self.infos):
            if key not in expected and key not in optional:
                raise CheckpointMismatch(key, f"unexpected tensor in {self.infos[key].file}")

    def tensor(self, key: str) -> torch.Tensor:
        return self._handles[self.infos[key].file].get_tensor(key)

    def check_finite(self, keys: Iterable[str]) -> None:
        """Raise `NonFiniteWeights` naming the first tensor holding NaN or Inf."""
        for key in keys:
            flat = self.tensor(key).reshape(-1)
            for start in range(0, flat.numel(), _CHUNK):
                if not bool(torch.isfinite(flat[start : start + _CHUNK]).all()):
                    raise NonFiniteWeights(key, int((~torch.isfinite(flat)).sum()))


def _shards(index: Path) -> dict[str, list[str]]:
    try:
        raw = json.loads(index.read_text(encoding="utf-8"))
        weight_map = raw["weight_map"]
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            raise TypeError("weight_map must map tensor names to file names")
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as exc:
        raise CheckpointCorrupt(str(index), f"not a valid index: {exc!r}") from exc
    files: dict[str, list[str]] = {}
    for key, name in weight_map.items():
        if Path(name).name != name:
            raise CheckpointCorrupt(str(index), f"shard name {name!r} for {key!r} is not a plain file name")
        files.setdefault(name, []).append(key)
    return files
