"""The public surface of infersight.alerts: `__all__` is complete and every name exists."""

from __future__ import annotations

import importlib
import pkgutil

import infersight.alerts as alerts

# Public in their own module but deliberately not re-exported at the top (why, per module).
SUBMODULE_ONLY = {
    "infersight.alerts.actions": {"render_html"},  # presentation helper of snapshot
    "infersight.alerts.actions.snapshot": {"render_html"},
    "infersight.alerts.config": {"DEFAULT_PAGERDUTY_URL", "ReceiverType"},
    "infersight.alerts.evaluator": {"action_run_key"},
    "infersight.alerts.http": {
        "ALERTMANAGER_PAYLOAD_SCHEMA",
        "InboundHandler",
        "alertmanager_router",
    },  # needs FastAPI: imported from alerts.http
    "infersight.alerts.inhibit": {"inhibited"},
    "infersight.alerts.live_signals": {"least_squares_slope"},
    "infersight.alerts.matchers": {"matches_all"},
    "infersight.alerts.notification": {"Status"},
    "infersight.alerts.outbox": {"claim", "counts", "enqueue", "finish"},  # the dispatcher's primitives
    "infersight.alerts.promql": {"LATENCY_HISTOGRAMS"},
    "infersight.alerts.receivers": {"build_receiver", "pagerduty_event", "sign", "slack_message", "verify"},
    "infersight.alerts.receivers.pagerduty": {"PAGERDUTY_SEVERITIES", "pagerduty_event"},
    "infersight.alerts.receivers.slack": {"slack_message"},
    "infersight.alerts.receivers.webhook": {"SIGNATURE_TOLERANCE_S", "sign", "verify"},
    "infersight.alerts.rules": {"OPS", "Comparison"},
    "infersight.alerts.signals": {"LATENCY_METRICS"},
    "infersight.alerts.silences": {"active_silences", "silenced_by"},
    "infersight.alerts.state": {"AlertState", "episode_id", "fingerprint", "step"},
    "infersight.alerts.store_signals": {"quantile"},
    "infersight.alerts.tables": {
        "action_runs",
        "alert_groups",
        "alert_history",
        "alerts",
        "deploy_analyses",
        "inbound_keys",
        "notification_log",
        "outbox",
        "silences",
    },
    "infersight.alerts.templating": {"TEMPLATE_PIPES", "check_template", "render"},
    "infersight.alerts.transport": {"classify", "parse_retry_after"},
}


def _public_modules() -> list[str]:
    names = ["infersight.alerts"]
    for m in pkgutil.walk_packages(alerts.__path__, "infersight.alerts."):
        if not any(part.startswith("_") for part in m.name.split(".")[2:]):
            names.append(m.name)
    return names


def test_every_public_module_declares_all_and_its_names_exist() -> None:
    for name in _public_modules():
        module = importlib.import_module(name)
        assert hasattr(module, "__all__"), f"{name} has no __all__"
        for item in module.__all__:
            assert hasattr(module, item), f"{name}.__all__ lists missing {item}"


def test_top_level_all_is_complete_and_sorted() -> None:
    top = set(alerts.__all__)
    for name in _public_modules()[1:]:
        module = importlib.import_module(name)
        missing = set(module.__all__) - top - SUBMODULE_ONLY.get(name, set())
        assert not missing, f"{name} exports {sorted(missing)} but infersight.alerts does not"
    assert list(alerts.__all__) == sorted(alerts.__all__, key=lambda n: (not n.isupper(), n))
    assert len(top) == len(alerts.__all__)
