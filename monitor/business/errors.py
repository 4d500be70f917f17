"""Errors of infersight.monitor.business.

BusinessError
├── FeedbackInvalid      a feedback item that cannot be kept (names the field)
└── SatisfactionQueryInvalid   a satisfaction query with a bad parameter
"""

from __future__ import annotations

__all__ = ["BusinessError", "FeedbackInvalid", "SatisfactionQueryInvalid"]


class BusinessError(Exception):
    """Base of this package's errors."""


class FeedbackInvalid(BusinessError, ValueError):
    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


class SatisfactionQueryInvalid(BusinessError, ValueError):
    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason
