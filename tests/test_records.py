"""InferenceRecord.from_json is the one gate untrusted events pass: every refusal names its field."""

from __future__ import annotations

import math

import pytest
from infersight.monitor.records import MAX_TEXT_CHARS, InferenceRecord, InvalidRecord, build_record

GOOD = {
    "request_id": "r-1",
    "model": "mixtral",
    "model_version": "mixtral_banking_fp32-v1.0",
    "started_at": 1_764_000_000.0,
    "duration_s": 0.25,
    "ttft_s": 0.05,
    "prompt_tokens": 12,
    "output_tokens": 30,
    "prompt": "How do I locate my card?",
    "response": "card locate",
}


def test_a_valid_record_round_trips_through_json() -> None:
    record = InferenceRecord.from_json(GOOD)
    assert record.model_version == "mixtral_banking_fp32-v1.0"
    assert record.source == "sdk" and record.tpot_s is None
    assert InferenceRecord.from_json(record.to_json()) == record


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"request_id": None}, "request_id"),
        ({"model": ""}, "model"),
        ({"model_version": 7}, "model_version"),
        ({"started_at": None}, "started_at"),
        ({"duration_s": math.nan}, "duration_s"),
        ({"duration_s": -0.1}, "duration_s"),
        ({"duration_s": math.inf}, "duration_s"),
        ({"ttft_s": "fast"}, "ttft_s"),
        ({"queue_s": True}, "queue_s"),
        ({"prompt_tokens": 1.5}, "prompt_tokens"),
        ({"output_tokens": -1}, "output_tokens"),
        ({"output_tokens": 2**31}, "output_tokens"),
        ({"started_at": 1e12}, "started_at"),
        ({"prompt": 42}, "prompt"),
        ({"response": "x" * (MAX_TEXT_CHARS + 1)}, "response"),
        ({"error_type": ""}, "error_type"),
        ({"source": "carrier-pigeon"}, "source"),
        ({"model": "m" * 257}, "model"),
        ({"colour": "blue"}, "colour"),
    ],
)
def test_each_bad_field_is_refused_by_name(change: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidRecord) as caught:
        InferenceRecord.from_json({**GOOD, **change})
    assert caught.value.field == field
    assert caught.value.reason


def test_a_non_object_event_is_refused() -> None:
    with pytest.raises(InvalidRecord) as caught:
        InferenceRecord.from_json(["not", "an", "object"])
    assert caught.value.field == "event"


def test_build_record_makes_the_same_immutable_record_as_the_constructor() -> None:
    from dataclasses import FrozenInstanceError, fields

    values = (
        "r1",
        "m",
        "v1",
        1.5,
        0.25,
        0.1,
        0.01,
        0.02,
        7,
        9,
        "Timeout",
        "p",
        "r",
        "proxy",
        "fast",
        "be brief",
        64,
        True,
        "length",
    )
    assert len(values) == len(fields(InferenceRecord))
    built = build_record(*values)
    assert type(built) is InferenceRecord
    assert built == InferenceRecord(*values) and hash(built) == hash(InferenceRecord(*values))
    assert built.to_json()["source"] == "proxy" and built.output_tokens == 9 and built.path == "fast"
    assert built.system_prompt == "be brief"
    # `path` and `system_prompt` are optional (the SDK omits them)
    assert build_record(*values[:-1]) == InferenceRecord(*values[:-1])
    assert build_record(*values[:-2]) == InferenceRecord(*values[:-2])
    with pytest.raises(FrozenInstanceError):
        built.model = "other"  # type: ignore[misc]
