"""A request's outcome: one vocabulary that every part reads.

    Outcome          recorded `error_type`           counted as
    SUCCESS          None                            a served request
    CLIENT_ERROR     "client_error"                  the caller's doing (over-long prompt, bad request, 4xx)
    CANCELLED        "cancelled"                     the caller hung up
    REFUSED          "shed", "overloaded"            protection doing its job: an SLO miss, no error
    SERVER_ERROR     anything else (a class name)    the server failed: error rates, release checks

Refused requests are the service protecting itself: SLA routing's length breaker shed the
request (`shed`, a 503 with Retry-After) or admission control found its queue full or its
predicted wait too long (`overloaded`, a 429). They miss their SLO but are never a server
error, and never a release's: a client bursting on a canary's arm fills the canary's queue
without the canary having failed at anything (a release whose replica is slower sheds more,
which its latency checks see).

The engine's errors map here once, by class (`ENGINE_OUTCOMES`, resolved along each class's
MRO, so a subclass inherits its family's outcome). The engine's failure events carry the
raised class's name (`RequestFailed.error_type`); `engine_label` reads that name back to the
class through the table of the engine's own classes, so no name is written by hand here.
A name that is not an engine error (the model raised something else) is a server error.

Collectors, records, the canary, the post-deploy analysis, the SLO burn and the pages read
`outcome_of` / `is_server_error`; nothing else keeps a list of "not errors".
"""

from __future__ import annotations

import enum
from collections.abc import Iterator, Mapping

from infersight.engine import errors as engine_errors

__all__ = [
    "CANCELLED",
    "CLIENT_DISCONNECTED",
    "CLIENT_ERROR",
    "CLIENT_OUTCOMES",
    "ENGINE_OUTCOMES",
    "NOT_ERRORS",
    "OVERLOADED",
    "REFUSED_BY_SERVICE",
    "SHED",
    "Outcome",
    "client_error_names",
    "engine_error_classes",
    "engine_label",
    "engine_outcome",
    "is_server_error",
    "outcome_of",
]


class Outcome(enum.Enum):
    """How a request ended, from the service's point of view."""

    SUCCESS = "success"
    CLIENT_ERROR = "client_error"
    CANCELLED = "cancelled"
    REFUSED = "refused"
    SERVER_ERROR = "server_error"


# The labels kept in `error_type` for the outcomes that are not server errors, so that they
# are seen (dashboards, /metrics) but never counted as errors.
CLIENT_ERROR = "client_error"
CANCELLED = "cancelled"
SHED = "shed"  # SLA routing's length breaker refused it
OVERLOADED = "overloaded"  # admission control refused it: queue full or predicted wait too long
CLIENT_OUTCOMES = frozenset({CLIENT_ERROR, CANCELLED})
REFUSED_BY_SERVICE = frozenset({SHED, OVERLOADED})  # refused to protect the service: SLO misses
NOT_ERRORS = CLIENT_OUTCOMES | REFUSED_BY_SERVICE  # outcomes kept under their own label, never errors
# The name an SDK user's client raises when the caller goes away (recorded as it is)
CLIENT_DISCONNECTED = "ClientDisconnected"

_OUTCOME_OF_LABEL: Mapping[str, Outcome] = {
    CLIENT_ERROR: Outcome.CLIENT_ERROR,
    CANCELLED: Outcome.CANCELLED,
    CLIENT_DISCONNECTED: Outcome.CANCELLED,
    SHED: Outcome.REFUSED,
    OVERLOADED: Outcome.REFUSED,
}


def outcome_of(error_type: str | None) -> Outcome:
    """The outcome of a recorded request by its `error_type` (None: it succeeded): one of the
    labels above, an engine error's class name (an SDK user may record those as they are),
    or anything else, a server error."""
    if error_type is None:
        return Outcome.SUCCESS
    known = _OUTCOME_OF_LABEL.get(error_type)
    if known is not None:
        return known
    cls = _ENGINE_BY_NAME.get(error_type)
    return engine_outcome(cls) if cls is not None else Outcome.SERVER_ERROR


def is_server_error(error_type: str | None) -> bool:
    """True when a call with this `error_type` failed on the server's side: what error
    rates, error-rate alerts, the canary and the post-deploy analysis count."""
    return outcome_of(error_type) is Outcome.SERVER_ERROR


# The engine's errors by family -> the label a request failing with one is recorded under
# (None: the class's own name, a server error). Resolved along the MRO: the nearest entry wins.
ENGINE_OUTCOMES: Mapping[type[engine_errors.EngineError], str | None] = {
    # refused in `submit` before the model saw it: over the length limits, bad parameters
    engine_errors.InvalidArgument: CLIENT_ERROR,
    engine_errors.PathOverloaded: SHED,
    engine_errors.QueueFull: OVERLOADED,
    engine_errors.EngineError: None,
}


def engine_error_classes() -> Iterator[type[engine_errors.EngineError]]:
    """Every error class the engine defines (EngineError and all its subclasses)."""
    seen: set[type[engine_errors.EngineError]] = set()
    stack: list[type[engine_errors.EngineError]] = [engine_errors.EngineError]
    while stack:
        cls = stack.pop()
        if cls in seen:
            continue
        seen.add(cls)
        yield cls
        stack.extend(cls.__subclasses__())


def _engine_entry(cls: type[engine_errors.EngineError]) -> str | None:
    for base in cls.__mro__:
        if base in ENGINE_OUTCOMES:
            return ENGINE_OUTCOMES[base]
    return None


def engine_outcome(cls: type[engine_errors.EngineError]) -> Outcome:
    """The outcome of a request that failed with the engine error `cls`."""
    label = _engine_entry(cls)
    return Outcome.SERVER_ERROR if label is None else outcome_of(label)


_ENGINE_BY_NAME = {cls.__name__: cls for cls in engine_error_classes()}


def client_error_names() -> tuple[str, ...]:
    """Every `error_type` that is the client's doing (client errors and hang-ups), for
    queries that must exclude them by name (the SLO burn's PromQL): the labels, then the
    engine's client-error classes, those `Runtime.submit` raises first."""
    first = (engine_errors.PromptTooLong, engine_errors.InvalidRequest)
    rest = sorted(
        (c for c in engine_error_classes() if engine_outcome(c) is Outcome.CLIENT_ERROR and c not in first),
        key=lambda c: c.__name__,
    )
    return (CLIENT_ERROR, CANCELLED, CLIENT_DISCONNECTED, *(c.__name__ for c in (*first, *rest)))


def engine_label(error_type: str) -> str:
    """The `error_type` to record for an engine failure event, whose `error_type` is the
    raised class's name: the outcome's label, or that name when it is a server error."""
    cls = _ENGINE_BY_NAME.get(error_type)
    if cls is None:
        return error_type  # not one of the engine's errors: the model or the runtime failed
    label = _engine_entry(cls)
    return error_type if label is None else label
