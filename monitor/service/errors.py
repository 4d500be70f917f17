"""Errors of the service.

    ServiceError
    ├── ConfigInvalid          the config file or an environment variable is wrong (names the field)
    │   └── ConfigFileInvalid     `infersight config check`: the same, with the line in the file
    │       ├── ConfigUnreadable     the file cannot be read (missing, not UTF-8)
    │       ├── ConfigNotYAML        the text does not parse as YAML
    │       ├── ConfigKeyUnknown     a key no section has
    │       ├── ConfigKeyMissing     a required key of a section given is absent
    │       ├── ConfigTypeWrong      a value of the wrong type (a string for an integer, ...)
    │       └── ConfigValueBad       a value of the right type out of its bounds or set
    ├── InsecureBind           a non-loopback address was asked for without a token
    ├── BackendUnavailable     no embedded runtime and no upstream: /v1 cannot be served
    │   └── UpstreamUnreachable   the upstream server did not answer (connection, timeout)
    ├── NoRuntime              a model operation needs the embedded runtime (proxy mode has none)
    ├── UnknownRelease         a release verdict was asked of a version never seen here (names the field)
    └── IngestOverloaded       the store's write queue is full: the client should retry later

HTTP mapping (routers): ConfigInvalid never reaches HTTP; BackendUnavailable 503,
UpstreamUnreachable 502, NoRuntime 409, IngestOverloaded 503 with Retry-After, UnknownRelease 404.
"""

from __future__ import annotations

__all__ = [
    "BackendUnavailable",
    "ConfigFileInvalid",
    "ConfigInvalid",
    "ConfigKeyMissing",
    "ConfigKeyUnknown",
    "ConfigNotYAML",
    "ConfigTypeWrong",
    "ConfigUnreadable",
    "ConfigValueBad",
    "IngestOverloaded",
    "InsecureBind",
    "NoRuntime",
    "ServiceError",
    "UnknownRelease",
    "UpstreamUnreachable",
]


class ServiceError(Exception):
    """Base class of the service's errors."""


class ConfigInvalid(ServiceError):
    """`field` is the dotted path in the config file (or the environment variable)."""

    def __init__(self, field: str, reason: str, *, source: str | None = None) -> None:
        where = f"{source}: " if source else ""
        super().__init__(f"{where}{field}: {reason}")
        self.field = field
        self.reason = reason
        self.source = source


class ConfigFileInvalid(ConfigInvalid):
    """A bad config file, located: `line` is 1-based (None when the key is not in the file).
    One line: `FILE:LINE: KEY: REASON`, the kind said once."""

    kind = "invalid"
    said_by = ""  # a reason holding this already says the kind (default: the kind itself)

    def __init__(self, field: str, reason: str, *, source: str, line: int | None) -> None:
        super().__init__(field, reason, source=source)
        self.line = line
        where = f"{source}:{line}" if line is not None else source
        said = (self.said_by or self.kind).lower() in reason.lower()
        self.args = (f"{where}: {field}: {reason if said else f'{self.kind}: {reason}'}",)


class ConfigUnreadable(ConfigFileInvalid):
    kind = "unreadable"


class ConfigNotYAML(ConfigFileInvalid):
    kind = "not YAML"
    said_by = "YAML"


class ConfigKeyUnknown(ConfigFileInvalid):
    kind = "unknown key"


class ConfigKeyMissing(ConfigFileInvalid):
    kind = "missing key"


class ConfigTypeWrong(ConfigFileInvalid):
    kind = "wrong type"


class ConfigValueBad(ConfigFileInvalid):
    kind = "bad value"


class InsecureBind(ServiceError):
    """Binding beyond loopback needs a bearer token (INFERSIGHT_TOKEN or `token:`)."""

    def __init__(self, host: str) -> None:
        super().__init__(
            f"refusing to listen on {host!r} without a token: set INFERSIGHT_TOKEN (or `token:` in "
            "the config file), or bind 127.0.0.1"
        )
        self.host = host


class BackendUnavailable(ServiceError):
    """Neither an embedded runtime nor an upstream server is configured or running."""


class UpstreamUnreachable(BackendUnavailable):
    """The upstream OpenAI-compatible server did not answer."""


class NoRuntime(ServiceError):
    """A model operation (deploy, rollback) needs the embedded runtime."""


class IngestOverloaded(ServiceError):
    """The store's write queue is full; nothing of the batch was accepted."""


class UnknownRelease(ServiceError):
    """A release verdict names a version the service has not seen; `field`: which one."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason
