"""infersight.monitor.business: what latency costs the people who use the service.

- feedback (`_feedback.py`): users' scores on requests, kept apart and joined by request id;
- satisfaction against latency (`_satisfaction.py`): the curve, its band, and what a p99
  cut is worth;
- the environment record (`_environment.py`): the software each start and deploy ran on;
- the slowdown checklist (`_diagnosis.py`): memory, step time, request distribution,
  dependency versions and load, ranked, for a throughput or latency alert.
"""

from ._diagnosis import CHECKS, Check, Diagnosis, StepSample, diagnose
from ._environment import (
    COMPONENTS,
    EnvironmentRecord,
    changed_components,
    current_environment,
    environment_at,
    environment_history,
    record_environment,
)
from ._feedback import (
    FEEDBACK_SOURCES,
    Feedback,
    JoinedFeedback,
    TextKeeping,
    expire_orphans,
    joined_feedback,
    parse_feedback,
    store_feedback,
)
from ._satisfaction import (
    LATENCY_BUCKETS_S,
    METRICS,
    CurvePoint,
    LatencyBucket,
    SatisfactionFit,
    Worth,
    fit_satisfaction,
    satisfaction_by_group,
)
from .errors import BusinessError, FeedbackInvalid, SatisfactionQueryInvalid

__all__ = [
    "CHECKS",
    "COMPONENTS",
    "FEEDBACK_SOURCES",
    "LATENCY_BUCKETS_S",
    "METRICS",
    "BusinessError",
    "Check",
    "CurvePoint",
    "Diagnosis",
    "EnvironmentRecord",
    "Feedback",
    "FeedbackInvalid",
    "JoinedFeedback",
    "LatencyBucket",
    "SatisfactionFit",
    "SatisfactionQueryInvalid",
    "StepSample",
    "TextKeeping",
    "Worth",
    "changed_components",
    "current_environment",
    "diagnose",
    "environment_at",
    "environment_history",
    "expire_orphans",
    "fit_satisfaction",
    "joined_feedback",
    "parse_feedback",
    "record_environment",
    "satisfaction_by_group",
    "store_feedback",
]
