"""One observed inference call, as the SDK, the engine adapter and the proxy record it,
as the SDK's HTTP sink sends it to `POST /api/v1/events`, and as the store keeps it.

Wire format (JSON): `{"events": [<record>, ...]}` where each record is an object with
exactly the fields of `InferenceRecord` (missing optional fields are null).
`InferenceRecord.from_json` validates one record and raises `InvalidRecord` naming the
field; it is the single place where untrusted input becomes a record.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any, Literal

__all__ = ["MAX_TEXT_CHARS", "InferenceRecord", "InvalidRecord", "RecordSource"]

RecordSource = Literal["sdk", "engine", "proxy"]
_SOURCES = ("sdk", "engine", "proxy")
MAX_TEXT_CHARS = 32_768  # prompt/response text beyond this is refused at ingest (the SDK truncates first)
_MAX_LABEL_CHARS = 256


class InvalidRecord(ValueError):
    """A record failed validation; `field` names the offending field."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


@dataclass(frozen=True, slots=True)
class InferenceRecord:
    request_id: str
    model: str
    model_version: str
    started_at: float  # wall clock, seconds since the epoch
    duration_s: float  # end-to-end latency
    ttft_s: float | None = None  # time to first token (streaming calls)
    tpot_s: float | None = None  # mean time per output token after the first
    queue_s: float | None = None
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    error_type: str | None = None  # exception class name when the call failed
    prompt: str | None = None  # sampled text only; None when not sampled
    response: str | None = None
    source: RecordSource = "sdk"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, obj: object) -> InferenceRecord:
        if not isinstance(obj, dict):
            raise InvalidRecord("event", "must be a JSON object")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(obj) - known)
        if unknown:
            raise InvalidRecord(unknown[0], "unknown field")
        values = {
            "request_id": _label(obj, "request_id"),
            "model": _label(obj, "model"),
            "model_version": _label(obj, "model_version"),
            "started_at": _number(obj, "started_at", required=True),
            "duration_s": _number(obj, "duration_s", required=True),
            "ttft_s": _number(obj, "ttft_s"),
            "tpot_s": _number(obj, "tpot_s"),
            "queue_s": _number(obj, "queue_s"),
            "prompt_tokens": _count(obj, "prompt_tokens"),
            "output_tokens": _count(obj, "output_tokens"),
            "error_type": _label(obj, "error_type", required=False),
            "prompt": _text(obj, "prompt"),
            "response": _text(obj, "response"),
            "source": obj.get("source", "sdk"),
        }
        if values["source"] not in _SOURCES:
            raise InvalidRecord("source", f"must be one of {', '.join(_SOURCES)}")
        return cls(**values)


def _label(obj: dict[str, Any], name: str, *, required: bool = True) -> Any:
    value = obj.get(name)
    if value is None:
        if required:
            raise InvalidRecord(name, "is required")
        return None
    if not isinstance(value, str) or not value:
        raise InvalidRecord(name, "must be a non-empty string")
    if len(value) > _MAX_LABEL_CHARS:
        raise InvalidRecord(name, f"longer than {_MAX_LABEL_CHARS} characters")
    return value


def _number(obj: dict[str, Any], name: str, *, required: bool = False) -> Any:
    value = obj.get(name)
    if value is None:
        if required:
            raise InvalidRecord(name, "is required")
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidRecord(name, "must be a number")
    if not math.isfinite(value) or value < 0:
        raise InvalidRecord(name, "must be finite and non-negative")
    return float(value)


def _count(obj: dict[str, Any], name: str) -> Any:
    value = obj.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidRecord(name, "must be a non-negative integer")
    return value


def _text(obj: dict[str, Any], name: str) -> Any:
    value = obj.get(name)
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidRecord(name, "must be a string")
    if len(value) > MAX_TEXT_CHARS:
        raise InvalidRecord(name, f"longer than {MAX_TEXT_CHARS} characters")
    return value
