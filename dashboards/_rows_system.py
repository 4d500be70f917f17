"""Dashboard rows about the machine: GPU efficiency and memory, and the supervised process."""

from __future__ import annotations

from ._layout import Section
from ._panels import Target, timeseries
from ._queries import RATE, gpu

__all__ = ["gpu_rows", "process_row"]


def gpu_rows() -> Section:
    g = gpu()
    return Section(
        "GPU",
        [
            timeseries(
                "SM activity and occupancy",
                [
                    Target(f"infersight_gpu_sm_activity_ratio{g}", "SM activity GPU {{gpu}}"),
                    Target(f"infersight_gpu_sm_occupancy_ratio{g}", "SM occupancy GPU {{gpu}}"),
                    Target(
                        f"infersight_gpu_busy_time_ratio{g}",
                        "time busy GPU {{gpu}} (fallback: NOT SM efficiency)",
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
                    Target(f"infersight_gpu_memory_used_bytes{g}", "used GPU {{gpu}}"),
                    Target(f"infersight_gpu_memory_reserved_bytes{g}", "reserved GPU {{gpu}}"),
                    Target(f"infersight_gpu_memory_total_bytes{g}", "total GPU {{gpu}}"),
                    Target(
                        f"sum by (gpu) (infersight_gpu_process_memory_bytes{g})",
                        "supervised process GPU {{gpu}}",
                    ),
                ],
                unit="bytes",
                min_value=0,
            ),
            timeseries(
                "GPU memory slope (per minute)",
                [Target(f"infersight_gpu_memory_used_slope_bytes_per_minute{g}", "GPU {{gpu}}")],
                unit="bytes",
                threshold=0,
                description="Least-squares slope of used memory over the trend window: steadily positive means a leak.",
            ),
            timeseries(
                "Clock, temperature and power",
                [
                    Target(f"infersight_gpu_temperature_celsius{g}", "temperature GPU {{gpu}}"),
                    Target(f"infersight_gpu_power_watts{g}", "power (W) GPU {{gpu}}"),
                    Target(f"infersight_gpu_sm_clock_hertz{g} / 1e6", "SM clock (MHz) GPU {{gpu}}"),
                ],
                unit="short",
            ),
            timeseries(
                "NVML call failures",
                [Target(f"sum by (function) (rate(infersight_nvml_errors_total[{RATE}]))", "{{function}}")],
                unit="ops",
                width=24,
                height=5,
                min_value=0,
                description="Failing NVML calls are counted, never raised; a steady rate means a metric is missing.",
            ),
        ],
    )


def process_row() -> Section:
    return Section(
        "Supervised process",
        [
            timeseries(
                "Resident memory (RSS)",
                [Target("infersight_process_resident_memory_bytes", "RSS pid {{pid}}")],
                unit="bytes",
                width=8,
                min_value=0,
            ),
            timeseries(
                "RSS slope (per minute)",
                [Target("infersight_process_resident_memory_slope_bytes_per_minute", "pid {{pid}}")],
                unit="bytes",
                width=8,
                threshold=0,
                description="Steadily positive: the process is leaking host memory.",
            ),
            timeseries(
                "CPU and threads",
                [
                    Target(f"rate(infersight_process_cpu_seconds_total[{RATE}])", "CPU cores pid {{pid}}"),
                    Target("infersight_process_threads", "threads pid {{pid}}"),
                ],
                unit="short",
                width=8,
                min_value=0,
            ),
        ],
    )
