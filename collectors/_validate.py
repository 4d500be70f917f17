"""Validation of values handed to InferenceStats by code we do not control."""

from __future__ import annotations

import math

from .errors import InvalidObservation

__all__ = ["check_count", "check_label", "check_seconds"]

MAX_LABEL_CHARS = 256


def check_seconds(field: str, value: object, *, required: bool = False) -> float | None:
    if value is None:
        if required:
            raise InvalidObservation(field, "missing_duration")
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidObservation(field, "invalid_number")
    if math.isnan(value):
        raise InvalidObservation(field, "nan_duration")
    if value < 0:
        raise InvalidObservation(field, "negative_duration")
    if math.isinf(value):
        raise InvalidObservation(field, "infinite_duration")
    return float(value)


def check_count(field: str, value: object) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidObservation(field, "invalid_count")
    return value


def check_label(field: str, value: object) -> str:
    if not isinstance(value, str) or not value or len(value) > MAX_LABEL_CHARS:
        raise InvalidObservation(field, "invalid_label")
    return value
