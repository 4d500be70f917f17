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

An alert passes down the folders in order: `rules/` (the rule file, signals, evaluation,
SLOs, the PromQL export), `notify/` (routing, grouping, inhibition, silences, outbox,
receivers, delivery), `actions/` (the runner, evidence, post-deploy and canary analysis);
`inbound.py` takes Alertmanager's webhooks in (`inbound_router.py` mounts it in FastAPI).
This module is the public API; helpers the stages share stay in their modules.
"""

from __future__ import annotations

from infersight.monitor.extras import require_extra as _require_extra

_require_extra("infersight.alerts", "service")  # one line when the extra is missing

from .actions.analysis import (
    REGRESSION_ALERT,
    AnalysisPolicy,
    DeployAnalyzer,
    StoreVersionMetrics,
    VersionStats,
)
from .actions.canary import CANARY_ALERT, CanaryAnalysis, CanaryController, CanaryPolicy
from .actions.evidence import SnapshotSource, open_collection, take_snapshot
from .actions.runner import FAILURE_ALERT, ActionRunner, ModelControl, RuntimeControl
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
from .inbound import AlertmanagerHandler
from .notify.matchers import (
    InhibitRule,
    Matcher,
    ReceiverConfig,
    Route,
    Silence,
    create_silence,
    expire_silence,
    list_silences,
    parse_matcher,
)
from .notify.outbox import Notification, NotifiedAlert
from .notify.receivers import (
    Dispatcher,
    HttpRequest,
    HttpResponse,
    HttpSender,
    HttpxSender,
    RetryPolicy,
    build_receivers,
)
from .rules.config import DEFAULT_RULES, AlertConfig, export_prometheus, load_config, parse_config
from .rules.evaluator import Evaluator
from .rules.rules import ActionSpec, Condition, Rule, RuleGroup
from .rules.signals import (
    CompositeSignals,
    LiveSignals,
    Sample,
    Signal,
    SignalSource,
    StaticSignals,
    StoreSignals,
)
from .rules.slo import SLO, SLOLedger

__all__ = [
    "CANARY_ALERT",
    "DEFAULT_RULES",
    "FAILURE_ALERT",
    "REGRESSION_ALERT",
    "SLO",
    "ActionFailed",
    "ActionRefused",
    "ActionRunner",
    "ActionSpec",
    "AlertConfig",
    "AlertmanagerHandler",
    "AlertsError",
    "AnalysisPolicy",
    "CanaryAnalysis",
    "CanaryController",
    "CanaryPolicy",
    "CompositeSignals",
    "Condition",
    "DeliveryFailed",
    "DeployAnalyzer",
    "Dispatcher",
    "Evaluator",
    "HttpRequest",
    "HttpResponse",
    "HttpSender",
    "HttpxSender",
    "InhibitRule",
    "InvalidAlertmanagerPayload",
    "InvalidMatcher",
    "LiveSignals",
    "Matcher",
    "ModelControl",
    "Notification",
    "NotifiedAlert",
    "ReceiverConfig",
    "RetryPolicy",
    "Route",
    "Rule",
    "RuleGroup",
    "RuleParseError",
    "RuntimeControl",
    "SLOLedger",
    "Sample",
    "Signal",
    "SignalSource",
    "Silence",
    "SnapshotSource",
    "StaticSignals",
    "StoreSignals",
    "StoreVersionMetrics",
    "UnknownSignal",
    "VersionStats",
    "build_receivers",
    "create_silence",
    "expire_silence",
    "export_prometheus",
    "list_silences",
    "load_config",
    "open_collection",
    "parse_config",
    "parse_matcher",
    "take_snapshot",
]
