"""Dashboard rows about answer quality and the monitor itself: drift, relevance, alerts, delivery."""

from __future__ import annotations

from ._layout import Section
from ._panels import Target, state_timeline, timeseries, value_text
from ._queries import RATE, quantile, serving

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
    return Section(
        "Alerts and delivery",
        [
            timeseries(
                "Alerts firing",
                [
                    Target(
                        "sum by (alertname, severity) (infersight_alerts_firing)",
                        "{{alertname}} ({{severity}})",
                    )
                ],
                unit="short",
                width=8,
                min_value=0,
            ),
            timeseries(
                "Notifications",
                [
                    Target(
                        f"sum by (receiver, outcome) (rate(infersight_notifications_total[{RATE}]))",
                        "{{receiver}} {{outcome}}",
                    ),
                    Target("infersight_outbox_pending", "outbox pending"),
                    Target("infersight_outbox_dead_letters", "dead letters"),
                ],
                unit="short",
                width=8,
                min_value=0,
            ),
            timeseries(
                "Deploys and SDK losses",
                [
                    Target(
                        f"sum by (outcome) (increase(infersight_deploys_total[{RATE}]))",
                        "deploys {{outcome}}",
                    ),
                    Target(
                        f"sum by (reason) (rate(infersight_sdk_records_dropped_total[{RATE}]))",
                        "dropped {{reason}}",
                    ),
                    Target(
                        f"sum by (reason) (rate(infersight_sdk_records_rejected_total[{RATE}]))",
                        "rejected {{reason}}",
                    ),
                ],
                unit="short",
                width=8,
                min_value=0,
            ),
        ],
    )
