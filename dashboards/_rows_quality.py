"""Dashboard rows about answer quality and the monitor itself: drift, relevance, alerts, delivery."""

from __future__ import annotations

from ._layout import Section
from ._panels import Target, state_timeline, timeseries, value_text
from ._queries import RATE, machine, quantile, serving, zero_if_empty

__all__ = ["drift_row", "pipeline_row"]


def drift_row() -> Section:
    s = serving()
    return Section(
        "Drift and relevance",
        [
            timeseries(
                "Drift p-value",
                [Target(f"infersight_drift_p_value{s}", "{{field}} {{model_version}}")],
                unit="none",
                log_scale=True,
                threshold=0.05,
                description="Latest batch drift test per field; below the dashed line (alpha 0.05) is significant.",
            ),
            timeseries(
                "Drift effect size and novelty",
                [
                    Target(f"infersight_drift_score{s}", "effect {{field}} {{model_version}}"),
                    Target(f"infersight_drift_novelty_rate{s}", "novelty {{field}} {{model_version}}"),
                ],
                unit="none",
                min_value=0,
            ),
            timeseries(
                "Prompt-response relevance",
                [
                    Target(f"infersight_relevance_mean{s}", "mean {{model_version}}"),
                    Target(quantile(0.1, "infersight_relevance_score", s), "p10 {{model_version}}"),
                ],
                unit="none",
                description="Cosine between each prompt and its answer; a drop means answers stopped matching questions.",
            ),
            state_timeline(
                "Drift detected",
                [Target(f"max by (field) (infersight_drift_detected{s})", "{{field}}")],
                mappings=[value_text({"0": ("no drift", "green"), "1": ("drift", "red")})],
            ),
        ],
    )


def pipeline_row() -> Section:
    # Alerts and the outbox are read from the shared store: every replica exports the same
    # figures, so they are taken once (max over instances), never summed.
    m = machine()
    return Section(
        "Alerts and delivery",
        [
            timeseries(
                "Alerts firing",
                [
                    Target(
                        f"max by (alertname, severity) (infersight_alerts_firing{m})"
                        + zero_if_empty("alertname"),
                        "{{alertname}} ({{severity}})",
                    )
                ],
                unit="short",
                width=6,
                min_value=0,
            ),
            timeseries(
                "Notifications",
                [
                    Target(
                        f"sum by (receiver, outcome) (rate(infersight_notifications_total{m}[{RATE}]))",
                        "{{receiver}} {{outcome}}",
                    ),
                    Target(f"max(infersight_outbox_pending{m})", "outbox pending"),
                    Target(f"max(infersight_outbox_dead_letters{m})", "dead letters"),
                ],
                unit="short",
                width=6,
                min_value=0,
                description="Delivery attempts by receiver and outcome (each from 0), and the outbox backlog.",
            ),
            timeseries(
                "Deploys",
                [
                    Target(
                        f"sum by (outcome) (increase(infersight_deploys_total{m}[{RATE}]))",
                        "{{outcome}}",
                    )
                ],
                unit="short",
                width=6,
                min_value=0,
                description="Deploys, rollbacks and refused deploys of the embedded runtime (each outcome from 0).",
            ),
            timeseries(
                "Ingest losses",
                [
                    Target(
                        f'sum by (outcome) (rate(infersight_ingest_events_total{{instance=~"$instance", '
                        f'outcome=~"rejected|dropped"}}[{RATE}]))',
                        "events {{outcome}}",
                    ),
                    Target(
                        f'sum(rate(infersight_ingest_batches_total{{instance=~"$instance", outcome="error"}}'
                        f"[{RATE}]))",
                        "batches refused",
                    ),
                ],
                unit="short",
                width=6,
                min_value=0,
                description=(
                    "Events the service received and did not keep: rejected (invalid, the field named in the "
                    "answer) or dropped (the store's write queue was full). An SDK's own losses before sending "
                    "are counted in its process (infersight_sdk_records_dropped_total), not here."
                ),
            ),
        ],
    )
