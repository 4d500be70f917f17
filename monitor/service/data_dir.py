"""The data directory's permissions: what an upgrade finds, it narrows.

Everything the service keeps under its data directory holds users' text or a credential:
the SQLite database (prompts and answers), snapshots, exports, the API token. Today's code
creates each of them owner-only (the directory 0700, files 0600), but a directory made by an
older version, or by hand under a umask of 0022, is 0755 with files 0644, and stays so
across upgrades unless something narrows it.

`narrow_data_dir` runs at service start, before the token is read and the database
opened. Every directory under the data directory (itself included) more open than 0700
becomes 0700 and every regular file more open than 0600 becomes 0600; symbolic links are
left alone (a chmod would follow them out of the directory). What changed is said in ONE
warning. An API token file that others could read is no secret any more: when it holds
the service's token, it is deleted so that a new token is made in its place, and the
warning says so: clients need the new one from that file. With a configured token
(`INFERSIGHT_TOKEN`) the file is not what the service checks and is only narrowed:
rotating a configured token is its operator's to do.
"""

from __future__ import annotations

import logging
import os
import stat
from dataclasses import dataclass
from pathlib import Path

__all__ = ["TOKEN_FILE", "Narrowed", "narrow_data_dir"]

log = logging.getLogger(__name__)

TOKEN_FILE = "api-token"
_SHOWN = 8  # paths named in the warning; the rest are counted


@dataclass(frozen=True)
class Narrowed:
    """What `narrow_data_dir` changed: paths relative to the data directory narrowed, each
    with the mode it had; whether the token was rotated; paths it could not change."""

    changed: tuple[tuple[str, int], ...] = ()
    token_rotated: bool = False
    refused: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.changed or self.token_rotated or self.refused)


def narrow_data_dir(data_dir: Path, *, token_from_file: bool = True) -> Narrowed:
    """Narrow `data_dir` (which exists) to its owner: directories 0700, files 0600; an
    exposed token file deleted, to be made anew, when it holds the service's token
    (`token_from_file`; a configured token's file is only narrowed). One warning when
    anything changed."""
    changed: list[tuple[str, int]] = []
    refused: list[str] = []
    token_rotated = False
    for root, dirs, files in os.walk(data_dir, followlinks=False):
        here = Path(root)
        for path, wanted in [(here, 0o700), *((here / name, 0o600) for name in files)]:
            try:
                info = path.lstat()
            except OSError:  # gone since the walk listed it
                continue
            if stat.S_ISLNK(info.st_mode) or not (stat.S_ISDIR(info.st_mode) or stat.S_ISREG(info.st_mode)):
                continue
            mode = stat.S_IMODE(info.st_mode)
            if not mode & 0o077:
                continue
            shown = "." if path == data_dir else str(path.relative_to(data_dir))
            if (
                token_from_file
                and path == data_dir / TOKEN_FILE
                and stat.S_ISREG(info.st_mode)
                and mode & 0o044
            ):
                try:
                    path.unlink()  # read by others: no secret now; the service makes a new one
                except OSError:
                    refused.append(shown)
                    continue
                token_rotated = True
                continue
            try:
                path.chmod(wanted)
            except OSError:  # not ours to change
                refused.append(shown)
                continue
            changed.append((shown, mode))
        dirs[:] = [d for d in dirs if not (here / d).is_symlink()]
    narrowed = Narrowed(tuple(changed), token_rotated, tuple(refused))
    if narrowed:
        log.warning("%s", _warning(data_dir, narrowed))
    return narrowed


def _warning(data_dir: Path, narrowed: Narrowed) -> str:
    names = [f"{name} ({mode:04o})" for name, mode in narrowed.changed]
    parts = []
    if names:
        more = f" and {len(names) - _SHOWN} more" if len(names) > _SHOWN else ""
        parts.append(
            f"narrowed to the owner (directories 0700, files 0600): {', '.join(names[:_SHOWN])}{more}"
        )
    if narrowed.token_rotated:
        parts.append(
            f"the API token in {TOKEN_FILE} was readable by other users and has been rotated: "
            f"clients need the new token from {data_dir / TOKEN_FILE}"
        )
    if narrowed.refused:
        parts.append(f"could not narrow (not this user's): {', '.join(narrowed.refused[:_SHOWN])}")
    return f"data directory {data_dir} was open to other users; " + "; ".join(parts)
