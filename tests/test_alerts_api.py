"""The public surface of infersight.alerts: one short API at the top, every module's
`__all__` true, and the stages' internals kept in their modules."""

from __future__ import annotations

import importlib
import pkgutil

import infersight.alerts as alerts

# The stages' primitives: public in their module for the other stages and for tests, not
# part of the package's API.
INTERNAL = {
    "claim", "enqueue", "finish", "counts", "requeue_dead",  # the outbox's, used by the dispatcher
    "step", "fingerprint", "push_alert", "load_alerts",  # an alert's lifecycle, used by the stages
    "classify", "parse_retry_after", "sign", "verify", "pagerduty_event", "slack_message",
    "parse_duration", "format_duration", "render", "check_template", "least_squares_slope",
    "msprt_lambda", "alertmanager_router",  # the router needs FastAPI: alerts.inbound_router
    "parse_config", "parse_matcher", "Rule", "RuleGroup", "Condition", "ActionSpec", "Route",  # the rule file's parts
    "Silence", "InhibitRule", "ReceiverConfig", "Notification", "NotifiedAlert", "RetryPolicy",
    "StaticSignals", "Signal", "Sample", "SLO", "CanaryPolicy", "CanaryAnalysis", "VersionStats",
    "FAILURE_ALERT", "DEFAULT_RULES",
}  # fmt: skip
STAGES = (
    "infersight.alerts.rules",
    "infersight.alerts.notify",
    "infersight.alerts.actions",
    "infersight.alerts.release",
)


def _modules() -> list[str]:
    return [m.name for m in pkgutil.walk_packages(alerts.__path__, "infersight.alerts.")]


def test_every_module_declares_all_and_its_names_exist() -> None:
    for name in _modules():
        module = importlib.import_module(name)
        if name in STAGES:  # a stage's folder exports nothing: the API is infersight.alerts
            assert not getattr(module, "__all__", []), f"{name} exports names"
            continue
        assert hasattr(module, "__all__"), f"{name} has no __all__"
        for item in module.__all__:
            assert hasattr(module, item), f"{name}.__all__ lists missing {item}"


def test_top_level_api_is_short_sorted_and_each_name_is_public_where_defined() -> None:
    exported: dict[str, str] = {}
    for name in _modules():
        for item in getattr(importlib.import_module(name), "__all__", []):
            exported.setdefault(item, name)
    for item in alerts.__all__:
        assert item in exported, f"infersight.alerts exports {item}, which no module declares"
        assert getattr(alerts, item) is getattr(importlib.import_module(exported[item]), item)
    assert list(alerts.__all__) == sorted(alerts.__all__, key=lambda n: (not n.isupper(), n))
    assert len(set(alerts.__all__)) == len(alerts.__all__) <= 40
    assert not INTERNAL & set(alerts.__all__)
    assert set(exported) >= INTERNAL, sorted(INTERNAL - set(exported))
    # errors: the package exports the base and the two the service catches; the rest stay in `errors`
    from infersight.alerts import errors

    assert set(errors.__all__) & set(alerts.__all__) == {"AlertsError", "InvalidMatcher", "RuleParseError"}
    assert all(issubclass(getattr(errors, n), errors.AlertsError) for n in errors.__all__)


def test_importing_alerts_does_not_import_fastapi() -> None:
    import subprocess
    import sys

    code = "import sys, infersight.alerts; print('fastapi' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
