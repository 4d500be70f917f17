"""One observed inference call, as the SDK, the engine adapter and the proxy record it,
as the SDK's HTTP sink sends it to `POST /api/v1/events`, and as the store keeps it.

Wire format (JSON): `{"events": [<record>, ...]}` where each record is an object with
exactly the fields of `InferenceRecord` (missing optional fields are null).
`InferenceRecord.from_json` validates one record and raises `InvalidRecord` naming the
field; it is the single place where untrusted input becomes a record. `from_json_many`
validates a batch with the same outcome, the common shape checked inline in one loop.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any, Literal

# the outcome vocabulary is defined in outcomes.py; re-exported here for the record's readers
from .outcomes import (
    CANCELLED,
    CLIENT_ERROR,
    CLIENT_OUTCOMES,
    NOT_ERRORS,
    OVERLOADED,
    REFUSED_BY_SERVICE,
    SHED,
    is_server_error,
)

__all__ = [
    "CANCELLED",
    "CLIENT_ERROR",
    "CLIENT_OUTCOMES",
    "FINISH_REASONS",
    "MAX_TEXT_CHARS",
    "NOT_ERRORS",
    "OVERLOADED",
    "REFUSED_BY_SERVICE",
    "SHED",
    "InferenceRecord",
    "InvalidRecord",
    "RecordLimits",
    "RecordSource",
    "StoredRequest",
    "build_record",
    "from_json_many",
    "is_server_error",
]

RecordSource = Literal["sdk", "engine", "proxy", "otlp"]  # otlp: a GenAI span sent to /v1/traces
_SOURCES = ("sdk", "engine", "proxy", "otlp")
MAX_TEXT_CHARS = 32_768  # prompt/response text beyond this is refused at ingest (the SDK truncates first)
_MAX_LABEL_CHARS = 256
_MAX_EPOCH_S = 253_402_300_799.0  # 9999-12-31T23:59:59Z, the last instant a datetime (and the store) holds
_MAX_TOKENS = 2**31 - 1  # the store's INTEGER
_MAX_DURATION_S = 86_400.0  # a day: no single call lasts longer
# Why a generation ended, as recorded (OpenAI's values, plus what other producers say):
# anything else a producer reports is kept as "other".
FINISH_REASONS = frozenset({"stop", "length", "cancelled", "error", "content_filter", "tool_calls", "other"})


@dataclass(frozen=True, slots=True)
class RecordLimits:
    """What one call can be, beyond which a record is refused by field: a duration
    (`duration_s`, `ttft_s`, `tpot_s`, `queue_s`) of at most `max_duration_s` seconds and
    token counts (`prompt_tokens`, `output_tokens`, `max_tokens`) of at most `max_tokens`.
    A value of 2**64 seconds is no measurement, and kept it would own every percentile."""

    max_duration_s: float = _MAX_DURATION_S
    max_tokens: int = _MAX_TOKENS

    def __post_init__(self) -> None:
        if not 0 < self.max_duration_s < math.inf or not 0 < self.max_tokens <= _MAX_TOKENS:
            raise ValueError(
                f"RecordLimits needs 0 < max_duration_s < inf and 0 < max_tokens <= {_MAX_TOKENS}"
            )


DEFAULT_LIMITS = RecordLimits()


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
    error_type: str | None = (
        None  # exception class name when the call failed; CLIENT_OUTCOMES: the client's doing
    )
    prompt: str | None = None  # sampled text only; None when not sampled
    response: str | None = None
    source: RecordSource = "sdk"
    path: str | None = None  # SLA routing's path ("fast", "standard") in the embedded runtime
    system_prompt: str | None = None  # a chat's system messages, sampled like `prompt` (the cache preload)
    # the request's shape (what the client asked), so release checks compare like with like
    max_tokens: int | None = None  # the output budget the client asked for (None: not said)
    stream: bool | None = None  # the answer was streamed
    finish_reason: str | None = None  # one of FINISH_REASONS

    def to_json(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in _FIELDS}

    @classmethod
    def from_json(cls, obj: object, limits: RecordLimits = DEFAULT_LIMITS) -> InferenceRecord:
        """Validate one untrusted record (a decoded JSON object); `InvalidRecord` names the field.

        Also enforces what the store can hold (start before the year 10000, token counts
        below 2**31) and what one call can be (`limits`), so a record that validates is a
        record that can be kept. Any JSON value in any field is refused by name, never
        raised as another error (an unhashable list, an integer too large for a float).
        """
        if not isinstance(obj, dict):
            raise InvalidRecord("event", "must be a JSON object")
        if not _KNOWN.issuperset(obj):
            raise InvalidRecord(sorted(set(obj) - _KNOWN)[0], "unknown field")
        source = obj.get("source", "sdk")
        if source not in _SOURCES:
            raise InvalidRecord("source", f"must be one of {', '.join(_SOURCES)}")
        started_at = _number(obj, "started_at", _MAX_EPOCH_S, required=True)
        longest, most = limits.max_duration_s, limits.max_tokens
        return build_record(
            _label(obj, "request_id"),
            _label(obj, "model"),
            _label(obj, "model_version"),
            started_at,
            _number(obj, "duration_s", longest, required=True),
            _number(obj, "ttft_s", longest),
            _number(obj, "tpot_s", longest),
            _number(obj, "queue_s", longest),
            _count(obj, "prompt_tokens", most),
            _count(obj, "output_tokens", most),
            _label(obj, "error_type", required=False),
            _text(obj, "prompt"),
            _text(obj, "response"),
            source,
            _label(obj, "path", required=False),
            _text(obj, "system_prompt"),
            _max_tokens(obj, most),
            _flag(obj, "stream"),
            _finish_reason(obj),
        )


_FIELDS = tuple(f.name for f in fields(InferenceRecord))
# added after the first 14, so optional to `build_record`
_OPTIONAL = ("path", "system_prompt", "max_tokens", "stream", "finish_reason")
_KNOWN = frozenset(_FIELDS)


@dataclass(frozen=True)
class StoredRequest:
    """A request as the store recorded it, read back for a release check (the canary's
    `replay` after a restart): the fields its outcome and shape need."""

    version: str
    error_type: str | None
    output_tokens: int | None
    relevance: float | None
    max_tokens: int | None = None
    stream: bool | None = None


def _builder() -> Callable[..., InferenceRecord]:
    """`build_record(*the first 14 fields, positionally, path=None, ...)` (`_OPTIONAL`): an
    `InferenceRecord` without the dataclass `__init__`, for values already checked (by
    `from_json`, or made by the SDK itself).

    A frozen dataclass sets each field through `object.__setattr__`; this writes each slot
    through its member descriptor instead, which about halves the cost (docs/benchmarks/ingest.md):
    it runs once per sampled SDK call and per ingested event.
    The result is an ordinary, equal, immutable record. Generated once, at import, from the
    dataclass's own fields (as `dataclasses` generates `__init__`), so it cannot drift from them.
    """
    assert _FIELDS[-len(_OPTIONAL) :] == _OPTIONAL
    params = ", ".join([*_FIELDS[: -len(_OPTIONAL)], *(f"{name}=None" for name in _OPTIONAL)])
    body = "".join(f"    _set_{name}(record, {name})\n" for name in _FIELDS)
    source = f"def build_record({params}):\n    record = _new(_cls)\n{body}    return record\n"
    namespace: dict[str, Any] = {"_new": object.__new__, "_cls": InferenceRecord}
    namespace.update({f"_set_{name}": getattr(InferenceRecord, name).__set__ for name in _FIELDS})
    exec(source, namespace)  # the source is built from the field names above, nothing else
    builder: Callable[..., InferenceRecord] = namespace["build_record"]
    return builder


build_record = _builder()


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


def _number(obj: dict[str, Any], name: str, largest: float, *, required: bool = False) -> Any:
    value = obj.get(name)
    if value is None:
        if required:
            raise InvalidRecord(name, "is required")
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidRecord(name, "must be a number")
    if isinstance(value, int) and value > largest:  # before float(): 10**400 has no float
        raise InvalidRecord(name, f"larger than {largest:g}")
    value = float(value)
    if not math.isfinite(value) or value < 0:
        raise InvalidRecord(name, "must be finite and non-negative")
    if value > largest:
        raise InvalidRecord(name, f"larger than {largest:g}")
    return value


def _count(obj: dict[str, Any], name: str, largest: int) -> Any:
    value = obj.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidRecord(name, "must be a non-negative integer")
    if value > largest:
        raise InvalidRecord(name, f"larger than {largest}")
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


def _max_tokens(obj: dict[str, Any], largest: int) -> Any:
    value = obj.get("max_tokens")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= largest:
        raise InvalidRecord("max_tokens", f"must be an integer from 1 to {largest}")
    return value


def _flag(obj: dict[str, Any], name: str) -> Any:
    value = obj.get(name)
    if value is not None and not isinstance(value, bool):
        raise InvalidRecord(name, "must be true or false")
    return value


def _finish_reason(obj: dict[str, Any]) -> Any:
    value = obj.get("finish_reason")
    # the type first: a list or an object is unhashable, and `in` a frozenset would raise
    if value is not None and not (isinstance(value, str) and value in FINISH_REASONS):
        raise InvalidRecord("finish_reason", f"must be one of {', '.join(sorted(FINISH_REASONS))}")
    return value


def from_json_many(
    events: list[Any], limits: RecordLimits = DEFAULT_LIMITS
) -> tuple[list[InferenceRecord], list[tuple[int, InvalidRecord]]]:
    """A batch of untrusted records: the records, and (index, error) of those refused, the
    same outcome as `InferenceRecord.from_json` on each. The common shape (every value of
    the type JSON decodes it to, and in range) is checked inline, without a call per field;
    any other event goes through `from_json`, which accepts what it accepts (ints as
    seconds, str subclasses) and names what it refuses. One bad event is refused alone:
    the others are kept."""
    out: list[InferenceRecord] = []
    refused: list[tuple[int, InvalidRecord]] = []
    build, labels, texts, tokens, epoch, reasons, longest = (
        build_record,
        _MAX_LABEL_CHARS,
        MAX_TEXT_CHARS,
        limits.max_tokens,
        _MAX_EPOCH_S,
        FINISH_REASONS,
        limits.max_duration_s,
    )
    for i, obj in enumerate(events):
        if type(obj) is dict and _KNOWN.issuperset(obj):
            get = obj.get
            rid, model, version = get("request_id"), get("model"), get("model_version")
            started, d, a, b, q = (
                get("started_at"),
                get("duration_s"),
                get("ttft_s"),
                get("tpot_s"),
                get("queue_s"),
            )
            p, o, e, path = get("prompt_tokens"), get("output_tokens"), get("error_type"), get("path")
            prompt, response, system, source = (
                get("prompt"),
                get("response"),
                get("system_prompt"),
                get("source", "sdk"),
            )
            budget, stream, finish = get("max_tokens"), get("stream"), get("finish_reason")
            if (
                type(rid) is str and 0 < len(rid) <= labels
                and type(model) is str and 0 < len(model) <= labels
                and type(version) is str and 0 < len(version) <= labels
                and type(started) is float and 0.0 <= started <= epoch
                and type(d) is float and 0.0 <= d <= longest
                and (a is None or (type(a) is float and 0.0 <= a <= longest))
                and (b is None or (type(b) is float and 0.0 <= b <= longest))
                and (q is None or (type(q) is float and 0.0 <= q <= longest))
                and (p is None or (type(p) is int and 0 <= p <= tokens))
                and (o is None or (type(o) is int and 0 <= o <= tokens))
                and (e is None or (type(e) is str and 0 < len(e) <= labels))
                and (path is None or (type(path) is str and 0 < len(path) <= labels))
                and (prompt is None or (type(prompt) is str and len(prompt) <= texts))
                and (response is None or (type(response) is str and len(response) <= texts))
                and (system is None or (type(system) is str and len(system) <= texts))
                and type(source) is str and source in _SOURCES
                and (budget is None or (type(budget) is int and 1 <= budget <= tokens))
                and (stream is None or type(stream) is bool)
                and (finish is None or (type(finish) is str and finish in reasons))
            ):  # fmt: skip
                out.append(build(rid, model, version, started, d, a, b, q, p, o, e, prompt, response, source,
                                 path, system, budget, stream, finish))  # fmt: skip
                continue
        try:
            out.append(InferenceRecord.from_json(obj, limits))
        except InvalidRecord as exc:
            refused.append((i, exc))
    return out, refused
