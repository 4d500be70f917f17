"""A directory of model versions: `root/<name>/version.json`, one per registered version.

A version points at a Hugging Face checkpoint directory (by default where it already
lies; `copy=True` copies it into the registry) and records the sha256 of its weight
files at registration, so a deploy can tell when the bytes on disk changed since.
Versions are immutable: registering a name twice is refused. The deploy history of a
runtime serving from this registry lives beside the versions (`deploys.json`).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

from .deploy_history import DeployHistory
from .errors import InvalidVersionName, NotACheckpoint, RegistryCorrupt, VersionExists, VersionNotFound
from .versions import WEIGHT_QUANTS, VersionInfo, VersionName, hash_weight_files, weight_files

__all__ = ["Registry"]

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
            raise InvalidVersionName(f"quantize must be None, 'int8' or 'int4', got {quantize!r}")
        wanted = parsed.quant if parsed.quant in WEIGHT_QUANTS else None
        if wanted != quantize:
            raise InvalidVersionName(
                f"version {name!r} says quant {parsed.quant!r} but quantize={quantize!r}: "
                "an int8 or int4 name needs that quantize= and the other quants need none"
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
