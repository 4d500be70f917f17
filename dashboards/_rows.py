"""The dashboard's serving rows: headline stats, latency, traffic and request shape, SLO and
cost, user satisfaction, and routing. The monitor's own rows and the machine's are
_system_rows.py's.
"""

from __future__ import annotations

from ._panels import (
    RATE,
    Section,
    Target,
    heatmap,
    quantile,
    rate,
    serving,
    stat,
    state_timeline,
    timeseries,
    value_text,
    zero_if_empty,
)

__all__ = [
    "headline",
    "latency",
    "routing",
    "satisfaction",
    "slo_cost",
    "traffic",
]


_DURATION = "gen_ai_server_request_duration_seconds"
_TTFT = "gen_ai_server_time_to_first_token_seconds"
_TPOT = "gen_ai_server_time_per_output_token_seconds"
_QUEUE = "gen_ai_server_request_queue_time_seconds"
_TOKENS = "gen_ai_server_token_usage"
_ERRORS = "gen_ai_server_request_errors_total"
_CLIENT = "infersight_client_outcomes_total"  # refused for the client's fault, hung up, shed: not errors


def _percentiles(histogram: str) -> list[Target]:
    return [
        Target(quantile(q, histogram, serving()), f"p{round(q * 100)} {{{{model_version}}}}")
        for q in (0.5, 0.95, 0.99)
    ]


def headline() -> Section:
    s = serving()
    requests = rate(f"{_DURATION}_count", s, by="")
    return Section(
        "Serving now",
        [
            stat(
                "Serving version",
                [
                    Target(
                        'infersight_model_info{instance=~"$instance", model=~"$model"} == 1',
                        "{{model_version}}",
                        instant=True,
                    )
                ],
                unit="none",
                text_mode="name",
                width=6,
                description="The model version the runtime serves now (infersight_model_info, an instant query: "
                "a version rolled back a minute ago is not shown).",
            ),
            stat("Requests", [Target(requests, "req/s")], unit="reqps", width=4),
            stat(
                "Error ratio",
                [
                    Target(
                        f"(({rate(_ERRORS, s, by='')} or vector(0)) / ({requests} > 0)) or vector(0)",
                        "errors",
                    )
                ],
                unit="percentunit",
                width=4,
                steps=((None, "green"), (0.01, "orange"), (0.05, "red")),
                description="Failed requests over all requests; 0 while none failed (or none came).",
            ),
            stat(
                "p99 latency",
                [Target(quantile(0.99, _DURATION, s, by="model"), "p99")],
                unit="s",
                width=4,
            ),
            stat(
                "Alerts firing",
                [
                    Target(
                        'sum(max by (alertname, severity) (infersight_alerts_firing{instance=~"$instance"})) or vector(0)',
                        "firing",
                    )
                ],
                unit="none",
                width=3,
                steps=((None, "green"), (1, "red")),
            ),
            stat(
                "GPU collector",
                [Target('max(infersight_gpu_collector_enabled{instance=~"$instance"})', "enabled")],
                unit="none",
                width=3,
                mappings=[value_text({"0": ("no GPU", "orange"), "1": ("on", "green")})],
                description="Off when NVML is not usable; see infersight_gpu_collector_disabled_info for why.",
            ),
        ],
    )


def latency() -> Section:
    return Section(
        "Latency",
        [
            timeseries(
                "End-to-end latency p50 / p95 / p99",
                _percentiles(_DURATION),
                unit="s",
                description="histogram_quantile over rate(gen_ai_server_request_duration_seconds_bucket).",
            ),
            timeseries("Time to first token p50 / p95 / p99", _percentiles(_TTFT), unit="s"),
            timeseries(
                "Time per output token p50 / p95 / p99",
                _percentiles(_TPOT),
                unit="s",
                description="Mean inter-token time after the first token.",
            ),
            timeseries(
                "Queue time p50 / p95 / p99",
                _percentiles(_QUEUE),
                unit="s",
                description="Time a request waited before it was scheduled.",
            ),
        ],
    )


def traffic() -> Section:
    s = serving()
    inp = serving('gen_ai_token_type="input"')
    out = serving('gen_ai_token_type="output"')
    return Section(
        "Traffic and request shape",
        [
            timeseries(
                "Throughput",
                [
                    Target(rate(f"{_DURATION}_count", s), "requests/s {{model_version}}"),
                    Target(rate(f"{_TOKENS}_sum", out), "output tokens/s {{model_version}}"),
                ],
                unit="short",
                width=8,
            ),
            timeseries(
                "Queue depth",
                [
                    Target(
                        f"sum by (model_version) (gen_ai_server_requests_waiting{s})",
                        "waiting {{model_version}}",
                    ),
                    Target(
                        f"sum by (model_version) (gen_ai_server_requests_in_flight{s})",
                        "in flight {{model_version}}",
                    ),
                ],
                unit="short",
                width=8,
                min_value=0,
            ),
            timeseries(
                "Errors by type, and what clients caused",
                [
                    Target(rate(_ERRORS, s, by="error_type") + zero_if_empty("error_type"), "{{error_type}}"),
                    Target(rate(_CLIENT, s, by="outcome") + zero_if_empty("outcome"), "client: {{outcome}}"),
                ],
                unit="reqps",
                width=8,
                min_value=0,
                stack=True,
                description="Server errors by error_type; beside them, not counted as errors, requests "
                "refused for the client's fault (client_error: an over-long prompt, an upstream 4xx) "
                "and requests whose client hung up (cancelled); requests SLA routing's length breaker "
                "refused with 503 (shed) count here too, as SLO misses but not errors.",
            ),
            heatmap(
                "Prompt length (input tokens)",
                Target(f"sum by (le) (increase({_TOKENS}_bucket{inp}[{RATE}]))", "{{le}}", fmt="heatmap"),
                unit="short",
            ),
            heatmap(
                "Output length (output tokens)",
                Target(f"sum by (le) (increase({_TOKENS}_bucket{out}[{RATE}]))", "{{le}}", fmt="heatmap"),
                unit="short",
            ),
        ],
    )


def slo_cost() -> Section:
    """SLOs (alerts/rules/slo.py: `slos:` in the rule file) and cost per 1k output tokens (`cost:`)."""
    return Section(
        "SLOs and cost",
        [
            stat(
                "Error budget remaining",
                [Target("min by (slo) (infersight_slo_error_budget_remaining_ratio)", "{{slo}}")],
                unit="percentunit",
                width=6,
                steps=((None, "red"), (0.25, "orange"), (0.5, "green")),
                description="Share of each SLO's error budget left over its window (below 0: overspent).",
            ),
            timeseries(
                "SLO attainment",
                [Target('min by (slo) (infersight_slo_attainment_ratio{slo!=""})', "{{slo}}")],
                unit="percentunit",
                width=6,
                max_value=1,
                description="Share of the SLO's requests that were good over its window.",
            ),
            timeseries(
                "SLO burn rate",
                [
                    Target(
                        'max by (slo, window) (infersight_slo_burn_rate{window=~"5m|1h|6h"})',
                        "{{slo}} {{window}}",
                    )
                ],
                unit="short",
                width=6,
                min_value=0,
                threshold=14.4,
                description="Bad share / error budget; 1 spends the budget exactly over the window, "
                "14.4 over 1h and 5m pages.",
            ),
            timeseries(
                "Cost per 1k output tokens",
                [
                    Target(
                        f"max by (model_version) (infersight_cost_per_1k_output_tokens{serving()})",
                        "{{model_version}}",
                    )
                ],
                unit="short",
                width=6,
                min_value=0,
                description="cost.per_hour shared by busy time among versions, per 1000 output tokens.",
            ),
        ],
    )


def satisfaction() -> Section:
    """Users' feedback against latency (monitor/business): the rate, the rate by latency
    bucket, and what halving the p99 is worth by the fitted curve (prompt length held fixed)."""
    versions = 'version=~"$model_version"'
    return Section(
        "Satisfaction",
        [
            timeseries(
                "Satisfaction of rated requests",
                [
                    Target(
                        f"max by (version, path) (infersight_satisfaction_ratio{{{versions}}})",
                        "{{version}} {{path}}",
                    )
                ],
                unit="percentunit",
                width=8,
                min_value=0,
                max_value=1,
                description="Mean feedback score (thumbs, ratings and scores normalised to 0..1) of the "
                "requests rated over the last week, per version and SLA path.",
            ),
            timeseries(
                "Satisfaction by end-to-end latency",
                [
                    Target(
                        f'max by (le) (infersight_satisfaction_bucket_ratio{{metric="e2e", {versions}}})',
                        "up to {{le}} s",
                    )
                ],
                unit="percentunit",
                width=8,
                min_value=0,
                max_value=1,
                description="Mean score of the rated requests in each latency bucket, as observed (the "
                "fitted curve and its band: GET /api/v1/satisfaction).",
            ),
            stat(
                "Worth of halving the p99",
                [
                    Target(
                        f'max by (version, path) (infersight_satisfaction_worth_points{{bound="estimate", '
                        f'metric="e2e", {versions}}})',
                        "{{version}} {{path}}",
                        instant=True,
                    )
                ],
                unit="short",
                width=8,
                steps=((None, "blue"),),
                description="Points of satisfaction a p99 cut to half is worth by the fitted curve, adjusted "
                "for prompt length by stratification (its 95% interval: bound=low/high).",
            ),
        ],
    )


_ROUTE = "infersight_route_request_duration_seconds"


def routing() -> Section:
    """SLA routing (`routing:`): where requests went, each path's latency against its SLA,
    attainment, the length breaker and the batch cap."""
    return Section(
        "SLA routing",
        [
            timeseries(
                "Routed requests by path and reason",
                [
                    Target(
                        f"sum by (path, reason) (rate(infersight_route_requests_total[{RATE}]))",
                        "{{path}} {{reason}}",
                    )
                ],
                unit="reqps",
                width=6,
                stack=True,
                description="short/long: by length; classifier(_error); spill: predicted queueing; "
                "breaker: sent standard by the breaker; shed: refused (503).",
            ),
            timeseries(
                "p99 latency by path (dashed: SLA)",
                [
                    Target(
                        f"histogram_quantile(0.99, sum by (le, path) (rate({_ROUTE}_bucket[{RATE}])))",
                        "p99 {{path}}",
                    ),
                    Target("max by (path) (infersight_route_sla_seconds)", "SLA {{path}}"),
                ],
                unit="s",
                width=6,
                min_value=0,
                description="Arrival to last token on each path, against the path's sla_ms.",
            ),
            timeseries(
                "SLA attainment by path",
                [
                    Target(
                        'min by (path, window) (infersight_slo_attainment_ratio{path!=""})',
                        "{{path}} {{window}}",
                    )
                ],
                unit="percentunit",
                width=6,
                max_value=1,
                description="Share of each path's requests within its SLA (errors and shed requests miss).",
            ),
            state_timeline(
                "Length breaker",
                [Target("max by (path) (infersight_route_breaker_state)", "{{path}}")],
                width=6,
                mappings=[
                    {
                        "type": "value",
                        "options": {
                            "0": {"text": "closed", "color": "green"},
                            "1": {"text": "half-open", "color": "orange"},
                            "2": {"text": "open", "color": "red"},
                        },
                    }
                ],
                description="Open: the path's p99 is over its SLA and longer requests are shed.",
            ),
        ],
    )
