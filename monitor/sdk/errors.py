"""Errors of infersight.monitor.sdk.

```
SDKError                        base of everything raised here
├── SDKConfigError (ValueError) a bad option given to Monitor, configure() or track()
└── SinkError                   a batch could not be delivered (raised by sinks, caught
    │                           by the delivery thread and counted as
    │                           infersight_sdk_records_dropped_total{reason="sink_error"})
    ├── SinkRejected            the receiver refused the batch (HTTP 4xx): not retried
    └── SinkUnavailable         the receiver could not be reached or kept failing (5xx,
                                429, connection errors) after every retry
```

Only `SDKConfigError` ever reaches user code, and only from set-up calls (`Monitor(...)`,
`configure(...)`, `track(...)` with bad options), never from a tracked call: the
decorator records, counts and re-raises the user's own exceptions unchanged, and
swallows (and counts) its own.
"""

from __future__ import annotations

__all__ = ["SDKConfigError", "SDKError", "SinkError", "SinkRejected", "SinkUnavailable"]


class SDKError(Exception):
    """Base class of the errors raised by infersight.monitor.sdk."""


class SDKConfigError(SDKError, ValueError):
    """A bad option for Monitor, configure() or track(); the message names it."""


class SinkError(SDKError):
    """A batch of records could not be delivered."""


class SinkRejected(SinkError):
    """The receiver refused the batch (HTTP 4xx other than 429); retrying would not help."""


class SinkUnavailable(SinkError):
    """The receiver could not be reached, or kept failing, after every retry."""
