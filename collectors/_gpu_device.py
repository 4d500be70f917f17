"""One NVML device: its handle, identity, GPM sampler and memory trend; reads a GPUSample."""

from __future__ import annotations

from typing import Any

from ._gpm import GPMSampler
from ._gpu_sample import GPUSample
from ._nvml import NVMLCalls
from ._trend import Trend

__all__ = ["Device"]


class Device:
    def __init__(self, calls: NVMLCalls, index: int, *, trend_window_s: float) -> None:
        self._calls = calls
        self.index = index
        self.handle = calls("nvmlDeviceGetHandleByIndex", index, device=index)
        self.uuid = _text(calls("nvmlDeviceGetUUID", self.handle, device=index)) or f"GPU-{index}"
        self.name = _text(calls("nvmlDeviceGetName", self.handle, device=index)) or "unknown"
        support = calls("nvmlGpmQueryDeviceSupport", self.handle, device=index)
        self.gpm = (
            GPMSampler(calls, self.handle, index)
            if support is not None and bool(getattr(support, "isSupportedDevice", False))
            else None
        )
        self.trend = Trend(trend_window_s)

    def read(self, now: float, pid: int) -> GPUSample:
        calls, nvml, h, i = self._calls, self._calls.nvml, self.handle, self.index
        used, reserved, total = self._memory()
        if used is not None:
            self.trend.add(now, float(used))
        if self.gpm is not None:
            self.gpm.sample(now)
        util = calls("nvmlDeviceGetUtilizationRates", h, device=i)
        clock = calls("nvmlDeviceGetClockInfo", h, nvml.NVML_CLOCK_SM, device=i)
        temp = calls("nvmlDeviceGetTemperature", h, nvml.NVML_TEMPERATURE_GPU, device=i)
        power = calls("nvmlDeviceGetPowerUsage", h, device=i)
        return GPUSample(
            index=i,
            uuid=self.uuid,
            name=self.name,
            at=now,
            gpm_supported=self.gpm is not None and self.gpm.usable,
            sm_activity=None if self.gpm is None else self.gpm.sm_activity,
            sm_occupancy=None if self.gpm is None else self.gpm.sm_occupancy,
            busy_time_ratio=None if util is None else float(util.gpu) / 100.0,
            memory_used_bytes=used,
            memory_reserved_bytes=reserved,
            memory_total_bytes=total,
            process_memory_bytes=self._process_memory(pid),
            sm_clock_hz=None if clock is None else float(clock) * 1e6,
            temperature_celsius=None if temp is None else float(temp),
            power_watts=None if power is None else float(power) / 1000.0,
            memory_used_slope_bytes_per_minute=self.trend.slope_per_minute(),
        )

    def _memory(self) -> tuple[int | None, int | None, int | None]:
        calls, nvml = self._calls, self._calls.nvml
        v2 = "nvmlDeviceGetMemoryInfo_v2"
        if calls.supported(v2, self.index):
            info = calls(
                "nvmlDeviceGetMemoryInfo", self.handle, version=nvml.nvmlMemory_v2, device=self.index, key=v2
            )
            if info is not None:
                return int(info.used), int(info.reserved), int(info.total)
            if calls.supported(v2, self.index):
                return None, None, None  # a passing failure; counted
        # a driver without the v2 struct: v1 from now on (no `reserved`)
        info = calls("nvmlDeviceGetMemoryInfo", self.handle, device=self.index)
        if info is None:
            return None, None, None
        return int(info.used), None, int(info.total)

    def _process_memory(self, pid: int) -> int | None:
        procs = self._calls("nvmlDeviceGetComputeRunningProcesses", self.handle, device=self.index)
        if procs is None:
            return None
        return sum(int(p.usedGpuMemory or 0) for p in procs if p.pid == pid)

    def close(self) -> None:
        if self.gpm is not None:
            self.gpm.close()


def _text(value: Any) -> str | None:
    if value is None:
        return None
    return value.decode() if isinstance(value, bytes) else str(value)
