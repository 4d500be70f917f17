"""Model version names and metadata: `[arch]_[dataset]_[quant]-v[major].[minor]`.

A version name says what a deployed model is at a glance (`mixtral_banking_int8-v1.2`).
The name is checked, never trusted for behaviour: how a version loads comes from its
metadata (`quant`), which must agree with the name.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import InvalidVersionName, RegistryCorrupt

__all__ = [
    "QUANTS",
    "VERSION_RULE",
    "WEIGHT_QUANTS",
    "VersionInfo",
    "VersionName",
    "hash_weight_files",
    "weight_files",
]

QUANTS = ("fp32", "bf16", "fp16", "int8", "int4")
WEIGHT_QUANTS = ("int8", "int4")  # the quants that load quantized: `load(quantize=quant)`
VERSION_RULE = (
    "a version name is [arch]_[dataset]_[quant]-v[major].[minor]: arch and dataset are lowercase "
    f"letters and digits, quant is one of {', '.join(QUANTS)}, major and minor are integers "
    "(e.g. mixtral_banking_int8-v1.2)"
)
_NAME = re.compile(
    r"^(?P<arch>[a-z][a-z0-9]*)_(?P<dataset>[a-z][a-z0-9]*)_(?P<quant>[a-z0-9]+)"
    r"-v(?P<major>0|[1-9][0-9]*)\.(?P<minor>0|[1-9][0-9]*)$"
)
_HASH_CHUNK = 1 << 20


@dataclass(frozen=True, slots=True, order=True)
class VersionName:
    """A parsed version name; `str()` gives it back."""

    arch: str
    dataset: str
    quant: str
    major: int
    minor: int

    @classmethod
    def parse(cls, name: str) -> VersionName:
        match = _NAME.match(name) if isinstance(name, str) else None
        if match is None:
            raise InvalidVersionName(f"invalid version name {name!r}: {VERSION_RULE}")
        if match["quant"] not in QUANTS:
            raise InvalidVersionName(
                f"invalid version name {name!r}: unknown quant {match['quant']!r}; {VERSION_RULE}"
            )
        return cls(match["arch"], match["dataset"], match["quant"], int(match["major"]), int(match["minor"]))

    def __str__(self) -> str:
        return f"{self.arch}_{self.dataset}_{self.quant}-v{self.major}.{self.minor}"


@dataclass(frozen=True, slots=True)
class VersionInfo:
    """One registered version. `sha256` covers the weight files (`files`: name -> sha256)."""

    name: str
    arch: str
    dataset: str
    quant: str
    major: int
    minor: int
    created_at: float
    sha256: str
    parent: str | None
    path: Path
    files: tuple[tuple[str, str], ...] = ()

    @property
    def quantize(self) -> str | None:
        """The `quantize=` argument of `engine.load` for this version."""
        return self.quant if self.quant in WEIGHT_QUANTS else None

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "arch": self.arch,
            "dataset": self.dataset,
            "quant": self.quant,
            "major": self.major,
            "minor": self.minor,
            "created_at": self.created_at,
            "sha256": self.sha256,
            "parent": self.parent,
            "path": str(self.path),
            "files": dict(self.files),
        }

    @classmethod
    def from_json(cls, data: Any, *, source: Path) -> VersionInfo:
        try:
            parsed = VersionName.parse(data["name"])
            files = data.get("files") or {}
            return cls(
                name=str(parsed),
                arch=parsed.arch,
                dataset=parsed.dataset,
                quant=parsed.quant,
                major=parsed.major,
                minor=parsed.minor,
                created_at=float(data["created_at"]),
                sha256=str(data["sha256"]),
                parent=None if data.get("parent") is None else str(data["parent"]),
                path=Path(data["path"]),
                files=tuple(sorted((str(k), str(v)) for k, v in files.items())),
            )
        except (KeyError, TypeError, ValueError, AttributeError, InvalidVersionName) as exc:
            raise RegistryCorrupt(
                f"{source}: unreadable version metadata ({type(exc).__name__}: {exc})"
            ) from exc


def weight_files(checkpoint_dir: Path) -> list[Path]:
    """The files whose bytes are the model: safetensors shards and their index."""
    files = sorted(checkpoint_dir.glob("*.safetensors"))
    index = checkpoint_dir / "model.safetensors.index.json"
    if index.is_file():
        files.append(index)
    return files


def hash_weight_files(checkpoint_dir: Path) -> tuple[str, tuple[tuple[str, str], ...]]:
    """(combined sha256, per-file sha256) of a checkpoint's weight files.

    The combined digest hashes each file's name and digest in name order, so it changes
    when any byte, name or the set of files changes."""
    per_file: list[tuple[str, str]] = []
    combined = hashlib.sha256()
    for path in weight_files(checkpoint_dir):
        digest = hashlib.sha256()
        with path.open("rb") as fh:
            while chunk := fh.read(_HASH_CHUNK):
                digest.update(chunk)
        per_file.append((path.name, digest.hexdigest()))
        combined.update(f"{path.name}\0{digest.hexdigest()}\n".encode())
    return combined.hexdigest(), tuple(per_file)
