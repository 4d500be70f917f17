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
receivers, delivery), `actions/` (the runner and the evidence it keeps); `release/` (the
canary, the post-deploy analysis and their paired, stratified and sequential checks) decides
rollbacks the runner performs;
`inbound.py` takes Alertmanager's webhooks in (`inbound_router.py` mounts it in FastAPI).
This module is the public API; helpers the stages share, the rule file's parts (`Rule`,
`Route`, `Silence`, ...) and the stages' policies stay in their modules, and every error is
in `errors` (all derive from `AlertsError`).
"""

from __future__ import annotations

from infersight.monitor.extras import require_extra as _require_extra

_require_extra("infersight.alerts", "service")  # one line when the extra is missing

from .actions.evidence import SnapshotSource, open_collection, take_snapshot
from .actions.runner import ActionRunner, Diagnoser, ModelControl, RuntimeControl
from .errors import AlertsError, InvalidMatcher, RuleParseError
from .inbound import AlertmanagerHandler
from .notify.matchers import Matcher, create_silence, expire_silence, list_silences
from .notify.receivers import Dispatcher, HttpRequest, HttpResponse, HttpSender, HttpxSender, build_receivers
from .release.canary import CANARY_ALERT, CanaryController
from .release.post_deploy import REGRESSION_ALERT, AnalysisPolicy, DeployAnalyzer, StoreVersionMetrics
from .rules.config import AlertConfig, export_prometheus, load_config
from .rules.evaluator import Evaluator
from .rules.signals import CompositeSignals, LiveSignals, SignalSource, StoreSignals
from .rules.slo import SLOLedger

__all__ = [
    "CANARY_ALERT",
    "REGRESSION_ALERT",
    "ActionRunner",
    "AlertConfig",
    "AlertmanagerHandler",
    "AlertsError",
    "AnalysisPolicy",
    "CanaryController",
    "CompositeSignals",
    "DeployAnalyzer",
    "Diagnoser",
    "Dispatcher",
    "Evaluator",
    "HttpRequest",
    "HttpResponse",
    "HttpSender",
    "HttpxSender",
    "InvalidMatcher",
    "LiveSignals",
    "Matcher",
    "ModelControl",
    "RuleParseError",
    "RuntimeControl",
    "SLOLedger",
    "SignalSource",
    "SnapshotSource",
    "StoreSignals",
    "StoreVersionMetrics",
    "build_receivers",
    "create_silence",
    "expire_silence",
    "export_prometheus",
    "list_silences",
    "load_config",
    "open_collection",
    "take_snapshot",
]
