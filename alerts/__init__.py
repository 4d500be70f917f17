"""infersight's alert engine: rules over the project's own signals, Alertmanager-style
notifications that are never lost, and automated remediation.

- Rules: `load_config(path)` reads a reviewable YAML rule file (`default_rules.yaml`
  ships with the package); `export_prometheus(config)` writes the PromQL equivalent.
- Evaluation: `Evaluator(engine, config, signals).tick()` steps every alert through
  inactive → pending → firing → resolved and, in the same transaction, writes the
  history, the queued actions and the notifications (`Notifier`) to the outbox.
- Delivery: `Dispatcher(engine, build_receivers(config.receivers), HttpxSender()).run_once()`
  delivers the outbox with backoff and full jitter; dead letters raise their own alert.
- Actions: `ActionRunner` (snapshot, rollback, hot_reload, failover), `DeployAnalyzer`
  (post-deploy checks and automatic rollback), `CanaryController` (a canary against the
  stable version, sequential tests, stepwise promotion or rollback), `alertmanager_router`
  (inbound webhooks).
- Seams: `SignalSource`, `ModelControl`, `SnapshotSource`, `HttpSender`, and a clock.
"""

from __future__ import annotations

from .actions import (
    FAILURE_ALERT,
    ActionOutcome,
    ActionRunner,
    CollectionOpened,
    ModelControl,
    ReplicaTargets,
    RuntimeControl,
    SnapshotResult,
    SnapshotSource,
    open_collection,
    take_snapshot,
)
from .alertmanager import ACTION_LABEL, AlertmanagerHandler, InboundAlert, InboundResult, parse_payload
from .analysis import (
    REGRESSION_ALERT,
    AnalysisPolicy,
    CheckResult,
    DeployAnalyzer,
    FailedCheck,
    StoreVersionMetrics,
    VersionMetrics,
    VersionStats,
)
from .backoff import RetryPolicy
from .canary import (
    CANARY_ALERT,
    CLIENT_ERRORS,
    CanaryAnalysis,
    CanaryController,
    CanaryDecision,
    CanaryPolicy,
    CanaryRuntime,
    CheckState,
    StoredRequest,
    Verdict,
    msprt_lambda,
)
from .config import AlertConfig, InhibitRule, ReceiverConfig, Route
from .dispatcher import DeliveryResult, Dispatcher
from .errors import (
    ActionFailed,
    ActionRefused,
    AlertsError,
    DeliveryFailed,
    InvalidAlertmanagerPayload,
    InvalidMatcher,
    RuleParseError,
    UnknownSignal,
)
from .evaluator import EvaluationResult, Evaluator
from .live_signals import InferenceStatsLike, LiveSignals, QualitySource, RemoteResources
from .loader import DEFAULT_RULES, load_config, parse_config
from .matchers import Matcher, parse_matcher
from .notification import Notification, NotifiedAlert
from .notifier import FlushResult, Notifier
from .outbox import OutboxEntry, requeue_dead
from .promql import PrometheusExport, export_prometheus, signal_promql
from .receivers import PagerDutyReceiver, Receiver, SlackReceiver, WebhookReceiver, build_receivers
from .rules import ACTION_TYPES, COLLECT_KINDS, ActionSpec, Condition, Rule, RuleGroup
from .signals import SIGNAL_KINDS, Sample, Signal, SignalKind, SignalSource
from .silences import Silence, create_silence, expire_silence, list_silences
from .slo import BURN_WINDOWS, CLIENT_ERROR_TYPES, SLO, BurnWindow
from .slo_ledger import SLOLedger, SLOStatus
from .state import ActiveAlert, Transition
from .static_signals import StaticSignals
from .store_signals import CompositeSignals, StoreSignals
from .transport import HttpRequest, HttpResponse, HttpSender, HttpxSender, url_problem

__all__ = [
    "ACTION_LABEL",
    "ACTION_TYPES",
    "BURN_WINDOWS",
    "CANARY_ALERT",
    "CLIENT_ERRORS",
    "CLIENT_ERROR_TYPES",
    "COLLECT_KINDS",
    "DEFAULT_RULES",
    "FAILURE_ALERT",
    "REGRESSION_ALERT",
    "SIGNAL_KINDS",
    "SLO",
    "ActionFailed",
    "ActionOutcome",
    "ActionRefused",
    "ActionRunner",
    "ActionSpec",
    "ActiveAlert",
    "AlertConfig",
    "AlertmanagerHandler",
    "AlertsError",
    "AnalysisPolicy",
    "BurnWindow",
    "CanaryAnalysis",
    "CanaryController",
    "CanaryDecision",
    "CanaryPolicy",
    "CanaryRuntime",
    "CheckResult",
    "CheckState",
    "CollectionOpened",
    "CompositeSignals",
    "Condition",
    "DeliveryFailed",
    "DeliveryResult",
    "DeployAnalyzer",
    "Dispatcher",
    "EvaluationResult",
    "Evaluator",
    "FailedCheck",
    "FlushResult",
    "HttpRequest",
    "HttpResponse",
    "HttpSender",
    "HttpxSender",
    "InboundAlert",
    "InboundResult",
    "InferenceStatsLike",
    "InhibitRule",
    "InvalidAlertmanagerPayload",
    "InvalidMatcher",
    "LiveSignals",
    "Matcher",
    "ModelControl",
    "Notification",
    "NotifiedAlert",
    "Notifier",
    "OutboxEntry",
    "PagerDutyReceiver",
    "PrometheusExport",
    "QualitySource",
    "Receiver",
    "ReceiverConfig",
    "RemoteResources",
    "ReplicaTargets",
    "RetryPolicy",
    "Route",
    "Rule",
    "RuleGroup",
    "RuleParseError",
    "RuntimeControl",
    "SLOLedger",
    "SLOStatus",
    "Sample",
    "Signal",
    "SignalKind",
    "SignalSource",
    "Silence",
    "SlackReceiver",
    "SnapshotResult",
    "SnapshotSource",
    "StaticSignals",
    "StoreSignals",
    "StoreVersionMetrics",
    "StoredRequest",
    "Transition",
    "UnknownSignal",
    "Verdict",
    "VersionMetrics",
    "VersionStats",
    "WebhookReceiver",
    "build_receivers",
    "create_silence",
    "expire_silence",
    "export_prometheus",
    "list_silences",
    "load_config",
    "msprt_lambda",
    "open_collection",
    "parse_config",
    "parse_matcher",
    "parse_payload",
    "requeue_dead",
    "signal_promql",
    "take_snapshot",
    "url_problem",
]
