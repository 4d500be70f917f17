"""Errors of the alert engine. Each is named for what went wrong.

```
AlertsError
├── RuleParseError          a rule/notification file is refused at load (file, line, reason)
├── UnknownSignal           a signal kind, metric or parameter the engine does not know
├── InvalidMatcher          a label matcher (silence, route, inhibit rule) that does not parse
├── DeliveryFailed          one HTTP delivery attempt failed (retryable or not, Retry-After)
├── ActionRefused           an action was not run: cooldown, daily cap, duplicate, bad parameters
├── ActionFailed            an action ran and failed; the serving version was verified after
└── InvalidAlertmanagerPayload  an inbound Alertmanager webhook body is malformed (field, reason)
```
"""

from __future__ import annotations

__all__ = [
    "ActionFailed",
    "ActionRefused",
    "AlertsError",
    "DeliveryFailed",
    "InvalidAlertmanagerPayload",
    "InvalidMatcher",
    "RuleParseError",
    "UnknownSignal",
]


class AlertsError(Exception):
    """Base of every error raised by `infersight.alerts`."""


class RuleParseError(AlertsError):
    """A rule file is refused: `file`, 1-based `line` (None when unknown) and `reason`."""

    def __init__(self, file: str, line: int | None, reason: str) -> None:
        where = f"{file}:{line}" if line is not None else file
        super().__init__(f"{where}: {reason}")
        self.file = file
        self.line = line
        self.reason = reason


class UnknownSignal(AlertsError):
    """A signal kind, metric or parameter is not one the engine knows; the message lists the valid ones."""


class InvalidMatcher(AlertsError):
    """A label matcher such as `severity=~"crit.*"` does not parse."""


class DeliveryFailed(AlertsError):
    """One delivery attempt failed. `retryable` says whether to try again; `retry_after`
    is the receiver's requested delay in seconds (from `Retry-After`), when it gave one."""

    def __init__(
        self,
        reason: str,
        *,
        retryable: bool,
        status: int | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(reason)
        self.reason = reason
        self.retryable = retryable
        self.status = status
        self.retry_after = retry_after


class ActionRefused(AlertsError):
    """An action was not run. `reason` is one of: cooldown, daily_cap, bad_parameters, unavailable."""

    def __init__(self, action: str, reason: str, detail: str = "") -> None:
        super().__init__(f"{action} refused: {reason}" + (f" ({detail})" if detail else ""))
        self.action = action
        self.reason = reason
        self.detail = detail


class ActionFailed(AlertsError):
    """An action ran and failed. `serving_version` is what the engine serves afterwards."""

    def __init__(self, action: str, reason: str, *, serving_version: str | None = None) -> None:
        super().__init__(f"{action} failed: {reason}")
        self.action = action
        self.reason = reason
        self.serving_version = serving_version


class InvalidAlertmanagerPayload(AlertsError):
    """An inbound Alertmanager webhook body is malformed; the HTTP layer answers 400 with `field` and `reason`."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason
