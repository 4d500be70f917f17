"""What the GPU collector read from one device in one sampling pass."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["GPUSample"]


@dataclass(frozen=True, slots=True)
class GPUSample:
    """One device, one pass. A field is None when NVML could not answer it."""

    index: int
    uuid: str
    name: str
    at: float  # the collector's clock (monotonic seconds)
    gpm_supported: bool
    sm_activity: float | None  # GPM: fraction of SMs busy (0..1), Hopper+
    sm_occupancy: float | None  # GPM: active warps / theoretical maximum (0..1), Hopper+
    busy_time_ratio: float | None  # nvmlDeviceGetUtilizationRates: time a kernel ran, NOT SM efficiency
    memory_used_bytes: int | None
    memory_reserved_bytes: int | None
    memory_total_bytes: int | None
    process_memory_bytes: int | None  # the supervised pid's own GPU memory (0 when it holds none)
    sm_clock_hz: float | None
    temperature_celsius: float | None
    power_watts: float | None
    memory_used_slope_bytes_per_minute: float | None
