"""A stand-in for the `pynvml` module, at its function boundary, for tests and benchmarks
on machines without a GPU.

It answers the functions GPUCollector calls with the shapes nvidia-ml-py returns
(objects with `.used`/`.total`, ctypes GPM structs, `NVMLError` subclasses chosen by
error code) and takes its constants, error class and ctypes structs from the real
nvidia-ml-py, which imports fine without a driver. Make a function fail with
`device.fail["nvmlDeviceGetPowerUsage"] = pynvml.NVML_ERROR_GPU_IS_LOST`.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pynvml

__all__ = ["FakeDevice", "FakeNVML"]

_GIB = 1 << 30


@dataclass
class FakeDevice:
    uuid: str = "GPU-00000000-fake-0000-0000-000000000000"
    name: str = "NVIDIA H100 80GB HBM3"
    gpm: bool = True
    memory_total: int = 80 * _GIB
    memory_used: int = 10 * _GIB
    memory_reserved: int = 512 << 20
    utilization_gpu: int = 97  # percent of time busy
    sm_activity_pct: float = 41.5  # GPM: percent of SMs busy
    sm_occupancy_pct: float = 23.0
    sm_clock_mhz: int = 1980
    temperature_c: int = 51
    power_mw: int = 412_000
    processes: dict[int, int] = field(default_factory=dict)  # pid -> GPU bytes
    fail: dict[str, int] = field(default_factory=dict)  # function -> NVML error code raised


class FakeNVML:
    """Looks like the `pynvml` module to GPUCollector."""

    NVMLError = pynvml.NVMLError

    def __init__(
        self,
        devices: list[FakeDevice] | None = None,
        *,
        init_error: int | None = None,
        memory_v2: bool = True,
    ) -> None:
        self.devices = [FakeDevice()] if devices is None else devices
        self.init_error = init_error
        self.memory_v2 = memory_v2
        self.calls: list[str] = []
        self.initialised = False
        self._samples: dict[int, tuple[FakeDevice, float, float]] = {}  # buffer -> readings
        self._buffers: list[Any] = []

    def __getattr__(self, name: str) -> Any:
        if name.startswith(("NVML_", "nvmlMemory_v", "c_nvml", "struct_c_nvml")):
            return getattr(pynvml, name)
        raise AttributeError(name)

    def _enter(self, name: str, device: FakeDevice | None = None) -> None:
        self.calls.append(name)
        if device is not None and name in device.fail:
            raise pynvml.NVMLError(device.fail[name])

    # -- init ------------------------------------------------------------------------
    def nvmlInit(self) -> None:
        self.calls.append("nvmlInit")
        if self.init_error is not None:
            raise pynvml.NVMLError(self.init_error)
        self.initialised = True

    def nvmlShutdown(self) -> None:
        self.calls.append("nvmlShutdown")
        self.initialised = False

    def nvmlDeviceGetCount(self) -> int:
        self._enter("nvmlDeviceGetCount")
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeDevice:
        self._enter("nvmlDeviceGetHandleByIndex")
        return self.devices[index]

    def nvmlDeviceGetUUID(self, d: FakeDevice) -> str:
        self._enter("nvmlDeviceGetUUID", d)
        return d.uuid

    def nvmlDeviceGetName(self, d: FakeDevice) -> str:
        self._enter("nvmlDeviceGetName", d)
        return d.name

    # -- readings --------------------------------------------------------------------
    def nvmlDeviceGetMemoryInfo(self, d: FakeDevice, version: int | None = None) -> Any:
        self._enter("nvmlDeviceGetMemoryInfo", d)
        if version is not None:
            if not self.memory_v2:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
            free = d.memory_total - d.memory_used - d.memory_reserved
            return SimpleNamespace(
                version=version,
                total=d.memory_total,
                reserved=d.memory_reserved,
                free=free,
                used=d.memory_used,
            )
        return SimpleNamespace(total=d.memory_total, free=d.memory_total - d.memory_used, used=d.memory_used)

    def nvmlDeviceGetUtilizationRates(self, d: FakeDevice) -> Any:
        self._enter("nvmlDeviceGetUtilizationRates", d)
        return SimpleNamespace(gpu=d.utilization_gpu, memory=0)

    def nvmlDeviceGetClockInfo(self, d: FakeDevice, clock_type: int) -> int:
        self._enter("nvmlDeviceGetClockInfo", d)
        if clock_type != pynvml.NVML_CLOCK_SM:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return d.sm_clock_mhz

    def nvmlDeviceGetTemperature(self, d: FakeDevice, sensor: int) -> int:
        self._enter("nvmlDeviceGetTemperature", d)
        return d.temperature_c

    def nvmlDeviceGetPowerUsage(self, d: FakeDevice) -> int:
        self._enter("nvmlDeviceGetPowerUsage", d)
        return d.power_mw

    def nvmlDeviceGetComputeRunningProcesses(self, d: FakeDevice) -> list[Any]:
        self._enter("nvmlDeviceGetComputeRunningProcesses", d)
        return [SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in d.processes.items()]

    # -- GPM -------------------------------------------------------------------------
    def nvmlGpmQueryDeviceSupport(self, d: FakeDevice) -> Any:
        self._enter("nvmlGpmQueryDeviceSupport", d)
        return SimpleNamespace(version=pynvml.NVML_GPM_SUPPORT_VERSION, isSupportedDevice=int(d.gpm))

    def nvmlGpmSampleAlloc(self) -> Any:
        self._enter("nvmlGpmSampleAlloc")
        buffer = ctypes.pointer(pynvml.struct_c_nvmlGpmSample_t())
        self._buffers.append(buffer)
        return buffer

    def nvmlGpmSampleFree(self, buffer: Any) -> None:
        self._enter("nvmlGpmSampleFree")
        self._samples.pop(_address(buffer), None)

    def nvmlGpmSampleGet(self, d: FakeDevice, buffer: Any) -> Any:
        self._enter("nvmlGpmSampleGet", d)
        if not d.gpm:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        self._samples[_address(buffer)] = (d, d.sm_activity_pct, d.sm_occupancy_pct)
        return buffer

    def nvmlGpmMetricsGet(self, request: Any) -> Any:
        first = self._samples.get(_address(request.sample1))
        second = self._samples.get(_address(request.sample2))
        device = None if second is None else second[0]
        self._enter("nvmlGpmMetricsGet", device)
        if first is None or second is None or first[0] is not second[0]:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if _address(request.sample1) == _address(request.sample2):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        readings = {
            pynvml.NVML_GPM_METRIC_SM_UTIL: second[1],
            pynvml.NVML_GPM_METRIC_SM_OCCUPANCY: second[2],
        }
        for i in range(request.numMetrics):
            metric = request.metrics[i]
            if metric.metricId in readings:
                metric.value = readings[metric.metricId]
                metric.nvmlReturn = pynvml.NVML_SUCCESS
            else:
                metric.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
        return request


def _address(buffer: Any) -> int:
    return ctypes.cast(buffer, ctypes.c_void_p).value or 0
