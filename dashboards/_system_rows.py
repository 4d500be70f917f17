"""The dashboard's system rows: the monitor itself (drift, relevance, alerts, delivery: the
pipeline), and the machine (GPU efficiency and memory, and the supervised process).

Each replica's machine is its own: every system series is per `instance` (the dashboard's
`instance` variable selects which), and legends name the instance.
"""

from __future__ import annotations

from ._panels import (
    RATE,
    Section,
    Target,
    gpu,
    machine,
    quantile,
    serving,
    state_timeline,
    timeseries,
    value_text,
    zero_if_empty,
)

__all__ = ["drift_row", "gpu_rows", "pipeline_row", "process_row"]


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


def gpu_rows() -> Section:
    g = gpu()
    return Section(
        "GPU",
        [
            timeseries(
                "SM activity and occupancy",
                [
                    Target(f"infersight_gpu_sm_activity_ratio{g}", "SM activity {{instance}} GPU {{gpu}}"),
                    Target(f"infersight_gpu_sm_occupancy_ratio{g}", "SM occupancy {{instance}} GPU {{gpu}}"),
                    Target(
                        f"infersight_gpu_busy_time_ratio{g}",
                        "time busy {{instance}} GPU {{gpu}} (fallback: NOT SM efficiency)",
                    ),
                ],
                unit="percentunit",
                min_value=0,
                max_value=1,
                description=(
                    "SM activity and occupancy come from NVML GPM (Hopper and newer). Elsewhere only "
                    "'time busy' is available: the share of time any kernel ran, which says nothing "
                    "about how many SMs it used."
                ),
            ),
            timeseries(
                "GPU memory",
                [
                    Target(f"infersight_gpu_memory_used_bytes{g}", "used {{instance}} GPU {{gpu}}"),
                    Target(f"infersight_gpu_memory_reserved_bytes{g}", "reserved {{instance}} GPU {{gpu}}"),
                    Target(f"infersight_gpu_memory_total_bytes{g}", "total {{instance}} GPU {{gpu}}"),
                    Target(
                        f"sum by (instance, gpu) (infersight_gpu_process_memory_bytes{g})",
                        "supervised process {{instance}} GPU {{gpu}}",
                    ),
                ],
                unit="bytes",
                min_value=0,
            ),
            timeseries(
                "GPU memory slope (per minute)",
                [Target(f"infersight_gpu_memory_used_slope_bytes_per_minute{g}", "{{instance}} GPU {{gpu}}")],
                unit="bytes",
                threshold=0,
                description="Least-squares slope of used memory over the trend window: steadily positive means a leak.",
            ),
            timeseries(
                "Clock, temperature and power",
                [
                    Target(f"infersight_gpu_temperature_celsius{g}", "temperature {{instance}} GPU {{gpu}}"),
                    Target(f"infersight_gpu_power_watts{g}", "power (W) {{instance}} GPU {{gpu}}"),
                    Target(
                        f"infersight_gpu_sm_clock_hertz{g} / 1e6", "SM clock (MHz) {{instance}} GPU {{gpu}}"
                    ),
                ],
                unit="short",
            ),
            timeseries(
                "NVML call failures",
                [
                    Target(
                        f"sum by (instance, function) (rate(infersight_nvml_errors_total{machine()}[{RATE}]))",
                        "{{instance}} {{function}}",
                    )
                ],
                unit="ops",
                width=24,
                height=5,
                min_value=0,
                description="Failing NVML calls are counted, never raised; a steady rate means a metric is missing.",
            ),
        ],
    )


def process_row() -> Section:
    m = machine()
    return Section(
        "Supervised process",
        [
            timeseries(
                "Resident memory (RSS)",
                [Target(f"infersight_process_resident_memory_bytes{m}", "RSS {{instance}} pid {{pid}}")],
                unit="bytes",
                width=8,
                min_value=0,
            ),
            timeseries(
                "RSS slope (per minute)",
                [
                    Target(
                        f"infersight_process_resident_memory_slope_bytes_per_minute{m}",
                        "{{instance}} pid {{pid}}",
                    )
                ],
                unit="bytes",
                width=8,
                threshold=0,
                description="Steadily positive: the process is leaking host memory.",
            ),
            timeseries(
                "CPU and threads",
                [
                    Target(
                        f"rate(infersight_process_cpu_seconds_total{m}[{RATE}])",
                        "CPU cores {{instance}} pid {{pid}}",
                    ),
                    Target(f"infersight_process_threads{m}", "threads {{instance}} pid {{pid}}"),
                ],
                unit="short",
                width=8,
                min_value=0,
            ),
        ],
    )
