"""A directory of model versions: `root/<name>/version.json`, one per registered version.

A version points at a Hugging Face checkpoint directory (by default where it already
lies; `copy=True` copies it into the registry) and records the sha256 of its weight
files at registration, so a deploy can tell when the bytes on disk changed since.
Versions are immutable: registering a name twice is refused. The deploy history of a
runtime serving from this registry lives beside the versions (`deploys.json`).

Model version names and metadata: `[arch]_[dataset]_[quant]-v[major].[minor]`.

A version name says what a deployed model is at a glance (`mixtral_banking_int8-v1.2`).
The name is checked, never trusted for behaviour: how a version loads comes from its
metadata (`quant`), which must agree with the name.

The deploy history of a registry, persisted as JSON so that a restart knows the last
good version.

`good` is a stack of versions that served successfully: a deploy or a failover pushes
its version, a rollback pops the current one and returns to the one beneath. `records`
keeps every attempt (refused ones too), newest last, capped at `MAX_RECORDS`.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from .errors import InvalidVersionName, NotACheckpoint, RegistryCorrupt, VersionExists, VersionNotFound

__all__ = [
    "MAX_RECORDS",
    "QUANTS",
    "VERSION_RULE",
    "WEIGHT_QUANTS",
    "DeployHistory",
    "DeployRecord",
    "Registry",
    "VersionInfo",
    "VersionName",
    "hash_weight_files",
    "weight_files",
]


_META = "version.json"
_HISTORY = "deploys.json"


class Registry:
    """Versions under `root` (created if absent)."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root).resolve()
        if self.root.exists() and not self.root.is_dir():
            raise NotACheckpoint(f"registry root {self.root} exists and is not a directory")
        self.root.mkdir(parents=True, exist_ok=True)
        self.history = DeployHistory(self.root / _HISTORY)

    def register(
        self,
        name: str,
        checkpoint_dir: str | os.PathLike[str],
        *,
        quantize: str | None = None,
        parent: str | None = None,
        copy: bool = False,
    ) -> VersionInfo:
        """Record `checkpoint_dir` as version `name`. `quantize` must agree with the name's
        quant (`int8` <-> "int8", `int4` <-> "int4"); `parent`, when given, must already be
        registered."""
        parsed = VersionName.parse(name)
        if quantize is not None and quantize not in WEIGHT_QUANTS:
            raise InvalidVersionName(
                f"quantize must be None or one of {', '.join(WEIGHT_QUANTS)}, got {quantize!r}"
            )
        wanted = parsed.quant if parsed.quant in WEIGHT_QUANTS else None
        if wanted != quantize:
            raise InvalidVersionName(
                f"version {name!r} says quant {parsed.quant!r} but quantize={quantize!r}: "
                f"a {'/'.join(WEIGHT_QUANTS)} name needs that quantize= and the other quants need none"
            )
        if parent is not None:
            self.get(parent)
        source = Path(checkpoint_dir).resolve()
        _check_checkpoint(source)
        version_dir = self.root / name
        try:
            version_dir.mkdir()
        except FileExistsError:
            raise VersionExists(f"version {name!r} is already registered in {self.root}") from None
        try:
            path = source
            if copy:
                path = version_dir / "checkpoint"
                shutil.copytree(source, path)
            sha256, files = hash_weight_files(path)
            quantization = _quantization(path)
            info = VersionInfo(
                name=name,
                arch=parsed.arch,
                dataset=parsed.dataset,
                quant=parsed.quant,
                major=parsed.major,
                minor=parsed.minor,
                created_at=time.time(),
                sha256=sha256,
                parent=parent,
                path=path,
                files=files,
                quantization=quantization,
            )
            _write_json(version_dir / _META, info.to_json())
        except BaseException:
            shutil.rmtree(version_dir, ignore_errors=True)
            raise
        return info

    def get(self, name: str) -> VersionInfo:
        VersionName.parse(name)
        meta = self.root / name / _META
        if not meta.is_file():
            known = ", ".join(v.name for v in self.versions()[-10:]) or "none"
            raise VersionNotFound(f"no version {name!r} in {self.root} (known: {known})")
        return _read_info(meta)

    def versions(self) -> list[VersionInfo]:
        """Every registered version, oldest first."""
        infos = [_read_info(meta) for meta in self.root.glob(f"*/{_META}")]
        return sorted(infos, key=lambda v: (v.created_at, v.name))

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and (self.root / name / _META).is_file()

    def __repr__(self) -> str:
        return f"Registry({str(self.root)!r})"


def _quantization(path: Path) -> tuple[tuple[str, str], ...]:
    """A quantized build's record (engine/quantized_store.py's quantization.json), as pairs."""
    meta = path / "quantization.json"
    if not meta.is_file():
        return ()
    try:
        data = json.loads(meta.read_text())
    except (OSError, ValueError) as exc:
        raise NotACheckpoint(f"{meta} is unreadable: {exc}") from exc
    if not isinstance(data, dict):
        raise NotACheckpoint(f"{meta} is not a JSON object")
    return tuple(sorted((str(k), json.dumps(v)) for k, v in data.items()))


def _check_checkpoint(path: Path) -> None:
    if not path.is_dir():
        raise NotACheckpoint(f"checkpoint directory {path} does not exist")
    if not (path / "config.json").is_file():
        raise NotACheckpoint(f"{path} has no config.json: not a Hugging Face checkpoint")
    if not weight_files(path):
        raise NotACheckpoint(f"{path} has no *.safetensors weight files")


def _read_info(meta: Path) -> VersionInfo:
    try:
        data = json.loads(meta.read_text())
    except (OSError, ValueError) as exc:
        raise RegistryCorrupt(f"{meta}: {exc}") from exc
    return VersionInfo.from_json(data, source=meta)


def _write_json(path: Path, data: object) -> None:
    """Write atomically: a reader sees the old file or the new one, never half of one."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)


QUANTS = ("fp32", "bf16", "fp16", "int8", "int4", "fp8")
WEIGHT_QUANTS = ("int8", "int4", "fp8")  # the quants that load quantized: `load(quantize=quant)`
VERSION_RULE = (
    "a version name is [arch]_[dataset]_[quant]-v[major].[minor]: arch and dataset are lowercase "
    f"letters and digits, quant is one of {', '.join(QUANTS)}, major and minor are integers "
    "(e.g. mixtral_banking_int8-v1.2)"
)
_NAME = re.compile(
    r"(?P<arch>[a-z][a-z0-9]*)_(?P<dataset>[a-z][a-z0-9]*)_(?P<quant>[a-z0-9]+)"
    r"-v(?P<major>0|[1-9][0-9]*)\.(?P<minor>0|[1-9][0-9]*)"
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
        match = _NAME.fullmatch(name) if isinstance(name, str) else None
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
    # a build that carries its quantized weights: its quantization.json (method, group size,
    # head precision...), as (key, JSON value) pairs; () for a plain checkpoint
    quantization: tuple[tuple[str, str], ...] = ()

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
        } | ({"quantization": {k: json.loads(v) for k, v in self.quantization}} if self.quantization else {})

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
                quantization=tuple(
                    sorted((str(k), json.dumps(v)) for k, v in (data.get("quantization") or {}).items())
                ),
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


MAX_RECORDS = 500
# the last four: canaries ("resumed": a restart picked up the canary the history left open)
Outcome = Literal["deployed", "refused", "started", "reweighted", "rolled_back", "resumed"]


@dataclass(frozen=True, slots=True)
class DeployRecord:
    at: float
    from_version: str | None
    to_version: str
    reason: str  # "start", "deploy", "failover", "rollback", "canary", "canary-promote"
    outcome: Outcome
    message: str = ""
    weight: float | None = None  # a canary's share of users after this record


class DeployHistory:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()

    def records(self) -> list[DeployRecord]:
        """Every recorded attempt, oldest first."""
        return self._load()[0]

    def good_versions(self) -> list[str]:
        """The stack of good versions, the serving (or last serving) one last."""
        return self._load()[1]

    def last_good(self) -> str | None:
        stack = self.good_versions()
        return stack[-1] if stack else None

    def previous_good(self) -> str | None:
        """The version a rollback returns to."""
        stack = self.good_versions()
        return stack[-2] if len(stack) >= 2 else None

    def record(self, record: DeployRecord) -> None:
        """Append `record` and, when it deployed, update the stack of good versions."""
        with self._lock:
            records, stack = self._load()
            records.append(record)
            if record.outcome == "deployed":
                if record.reason == "rollback" and len(stack) >= 2 and stack[-2] == record.to_version:
                    stack.pop()
                elif not stack or stack[-1] != record.to_version:
                    stack.append(record.to_version)
            payload = {"good": stack, "records": [asdict(r) for r in records[-MAX_RECORDS:]]}
            tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps(payload, indent=2) + "\n")
            os.replace(tmp, self.path)

    def _load(self) -> tuple[list[DeployRecord], list[str]]:
        if not self.path.exists():
            return [], []
        try:
            data = json.loads(self.path.read_text())
            records = [DeployRecord(**r) for r in data["records"]]
            stack = [str(v) for v in data["good"]]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise RegistryCorrupt(
                f"{self.path}: unreadable deploy history ({type(exc).__name__}: {exc})"
            ) from exc
        return records, stack
