"""Errors of the dataset export and of incident data collection.

    DatasetError
    ├── UnknownKind          (.kind)   --kind is not one of KINDS
    ├── InvalidSince         (.value)  --since is neither ISO 8601 nor a duration such as 2h
    ├── InvalidVersion       (.value)  an empty or over-long version name
    └── RedactorInvalid      (.spec)   the configured `redact` hook cannot be imported or called

Each is also a `ValueError`: bad input, reported in one line (CLI exit 2, HTTP 422 naming
the field).
"""

from __future__ import annotations

__all__ = ["DatasetError", "InvalidSince", "InvalidVersion", "RedactorInvalid", "UnknownKind"]


class DatasetError(ValueError):
    field = "dataset"


class UnknownKind(DatasetError):
    field = "kind"

    def __init__(self, kind: str, valid: tuple[str, ...]) -> None:
        super().__init__(f"unknown kind {kind!r}; valid kinds: {', '.join(valid)}")
        self.kind = kind


class InvalidSince(DatasetError):
    field = "since"

    def __init__(self, value: str) -> None:
        super().__init__(
            f"since {value!r} is neither an ISO 8601 time (2026-12-01T10:00:00Z) nor a duration (90m, 2h, 7d)"
        )
        self.value = value


class InvalidVersion(DatasetError):
    field = "version"

    def __init__(self, value: str) -> None:
        super().__init__(f"version {value!r} must be 1 to 256 characters")
        self.value = value


class RedactorInvalid(DatasetError):
    field = "redact"

    def __init__(self, spec: str, reason: str) -> None:
        super().__init__(f"redact hook {spec!r}: {reason}")
        self.spec = spec
