"""Dashboard rows about the machine: GPU efficiency and memory, and the supervised process.

Each replica's machine is its own: every series here is per `instance` (the dashboard's
`instance` variable selects which), and legends name the instance."""

from __future__ import annotations

from ._layout import Section
from ._panels import Target, timeseries
from ._queries import RATE, gpu, machine

__all__ = ["gpu_rows", "process_row"]


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
