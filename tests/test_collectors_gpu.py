"""GPUCollector, driven through a fake NVML at the pynvml function boundary (no GPU here).

The real library on a real GPU is exercised by benchmarks/gpu_check.py.
"""

from __future__ import annotations

import os
import sys
import time

import pynvml
import pytest
from infersight.collectors import GPUCollector
from infersight.collectors._gpu import MIN_GPM_INTERVAL_S
from infersight.collectors.fake_nvml import FakeDevice, FakeNVML
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

GIB = 1 << 30


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def _values(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def _by_name(registry: CollectorRegistry, name: str) -> list[float]:
    return [v for (n, _), v in _values(registry).items() if n == name]


def test_gpm_capable_gpu_reports_sm_activity_and_occupancy_with_fake_nvml() -> None:
    clock = Clock()
    fake = FakeNVML([FakeDevice(sm_activity_pct=62.0, sm_occupancy_pct=31.0)])
    registry = CollectorRegistry()
    gpu = GPUCollector(registry, nvml=fake, clock=clock)
    gpu.sample_once()
    assert gpu.latest()[0].sm_activity is None  # one GPM sample is not a metric yet
    clock.t += 1.0
    sample = gpu.sample_once()[0]
    assert sample.gpm_supported
    assert sample.sm_activity == pytest.approx(0.62) and sample.sm_occupancy == pytest.approx(0.31)
    assert _by_name(registry, "infersight_gpu_sm_activity_ratio") == [pytest.approx(0.62)]
    assert _by_name(registry, "infersight_gpu_sm_occupancy_ratio") == [pytest.approx(0.31)]
    assert _by_name(registry, "infersight_gpu_collector_enabled") == [1.0]
    assert fake.calls.count("nvmlGpmSampleAlloc") == 2  # two buffers per device, reused


def test_gpm_metrics_need_samples_at_least_100ms_apart_with_fake_nvml() -> None:
    clock = Clock()
    device = FakeDevice(sm_activity_pct=10.0)
    fake = FakeNVML([device])
    gpu = GPUCollector(nvml=fake, clock=clock)
    gpu.sample_once()
    clock.t += MIN_GPM_INTERVAL_S / 2
    assert gpu.sample_once()[0].sm_activity is None
    assert "nvmlGpmMetricsGet" not in fake.calls
    clock.t += MIN_GPM_INTERVAL_S  # now 150 ms after the first kept sample
    device.sm_activity_pct = 80.0
    assert gpu.sample_once()[0].sm_activity == pytest.approx(0.8)


def test_gpu_without_gpm_falls_back_to_time_busy_with_fake_nvml() -> None:
    clock = Clock()
    registry = CollectorRegistry()
    fake = FakeNVML([FakeDevice(gpm=False, utilization_gpu=97, uuid="GPU-a100")])
    gpu = GPUCollector(registry, nvml=fake, clock=clock)
    for _ in range(2):
        clock.t += 1
        sample = gpu.sample_once()[0]
    assert not sample.gpm_supported and sample.sm_activity is None
    assert sample.busy_time_ratio == pytest.approx(0.97)
    values = _values(registry)
    assert values[("infersight_gpu_busy_time_ratio", (("gpu", "0"), ("uuid", "GPU-a100")))] == pytest.approx(
        0.97
    )
    assert not _by_name(registry, "infersight_gpu_sm_activity_ratio")
    assert "nvmlGpmSampleGet" not in fake.calls


def test_memory_clock_temperature_power_and_own_process_memory_with_fake_nvml() -> None:
    pid = os.getpid()
    device = FakeDevice(
        memory_used=30 * GIB, memory_reserved=GIB, memory_total=80 * GIB, processes={pid: 7 * GIB, 1: 3 * GIB}
    )
    registry = CollectorRegistry()
    gpu = GPUCollector(registry, nvml=FakeNVML([device]), clock=Clock())
    s = gpu.sample_once()[0]
    assert (s.memory_used_bytes, s.memory_reserved_bytes, s.memory_total_bytes) == (30 * GIB, GIB, 80 * GIB)
    assert s.process_memory_bytes == 7 * GIB  # only the supervised pid's own
    assert s.sm_clock_hz == 1980e6 and s.temperature_celsius == 51 and s.power_watts == 412.0
    values = _values(registry)
    labels = (("gpu", "0"), ("pid", str(pid)), ("uuid", device.uuid))
    assert values[("infersight_gpu_process_memory_bytes", labels)] == 7 * GIB


def test_driver_without_memory_v2_falls_back_to_v1_with_fake_nvml() -> None:
    gpu = GPUCollector(nvml=FakeNVML([FakeDevice()], memory_v2=False), clock=Clock())
    first = gpu.sample_once()[0]
    second = gpu.sample_once()[0]
    assert first.memory_used_bytes == second.memory_used_bytes == 10 * GIB
    assert second.memory_reserved_bytes is None
    assert gpu.nvml_errors() == {"nvmlDeviceGetMemoryInfo_v2": 1}  # asked once, then not again


def test_nvml_error_mid_run_is_counted_not_raised_and_recovers_with_fake_nvml() -> None:
    clock = Clock()
    device = FakeDevice()
    registry = CollectorRegistry()
    gpu = GPUCollector(registry, nvml=FakeNVML([device]), clock=clock)
    gpu.sample_once()
    device.fail["nvmlDeviceGetPowerUsage"] = pynvml.NVML_ERROR_GPU_IS_LOST
    device.fail["nvmlGpmSampleGet"] = pynvml.NVML_ERROR_UNKNOWN
    for _ in range(3):
        clock.t += 1
        sample = gpu.sample_once()[0]
    assert sample.power_watts is None and sample.sm_activity is None
    assert sample.memory_used_bytes == 10 * GIB  # everything else still read
    values = _values(registry)
    assert values[("infersight_nvml_errors_total", (("function", "nvmlDeviceGetPowerUsage"),))] == 3
    assert values[("infersight_nvml_errors_total", (("function", "nvmlGpmSampleGet"),))] == 3
    assert not _by_name(registry, "infersight_gpu_power_watts")
    device.fail.clear()
    for _ in range(2):
        clock.t += 1
        sample = gpu.sample_once()[0]
    assert sample.power_watts == 412.0 and sample.sm_activity == pytest.approx(0.415)


def test_not_supported_function_is_not_asked_again_with_fake_nvml() -> None:
    device = FakeDevice(fail={"nvmlDeviceGetTemperature": pynvml.NVML_ERROR_NOT_SUPPORTED})
    fake = FakeNVML([device])
    gpu = GPUCollector(nvml=fake, clock=Clock())
    for _ in range(3):
        gpu.sample_once()
    assert fake.calls.count("nvmlDeviceGetTemperature") == 1
    assert gpu.nvml_errors()["nvmlDeviceGetTemperature"] == 1


def test_no_driver_disables_the_collector_and_exports_why_with_fake_nvml() -> None:
    registry = CollectorRegistry()
    gpu = GPUCollector(registry, nvml=FakeNVML(init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)).start()
    assert not gpu.enabled and "NVML Shared Library Not Found" in (gpu.disabled_reason or "")
    assert gpu.sample_once() == {} and gpu.latest() == {}
    values = _values(registry)
    assert values[("infersight_gpu_collector_enabled", ())] == 0
    info = [
        labels for (name, labels), _ in values.items() if name == "infersight_gpu_collector_disabled_info"
    ]
    assert info == [(("reason", gpu.disabled_reason),)]
    gpu.stop()


def test_machine_without_any_gpu_disables_the_collector_with_fake_nvml() -> None:
    fake = FakeNVML([])
    gpu = GPUCollector(nvml=fake)
    assert gpu.disabled_reason == "NVML found no GPU on this machine"
    assert fake.calls[-1] == "nvmlShutdown"


def test_missing_pynvml_library_disables_the_collector(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # `import pynvml` raises ImportError
    registry = CollectorRegistry()
    gpu = GPUCollector(registry)
    assert not gpu.enabled and "pynvml (nvidia-ml-py) is not installed" in (gpu.disabled_reason or "")
    assert b"infersight_gpu_collector_enabled 0.0" in generate_latest(registry)


def test_real_nvml_on_this_machine_is_used_or_its_absence_explained() -> None:
    gpu = GPUCollector()
    if gpu.enabled:  # a GPU machine: the real library answered
        assert gpu.sample_once()
        gpu.close()
    else:
        assert gpu.disabled_reason and gpu.disabled_reason.startswith(
            ("nvmlInit failed", "NVML found no GPU")
        )


def test_scrape_reads_the_last_sample_and_makes_no_nvml_call_with_fake_nvml() -> None:
    registry = CollectorRegistry()
    fake = FakeNVML()
    gpu = GPUCollector(registry, nvml=fake, clock=Clock())
    gpu.sample_once()
    before = len(fake.calls)
    generate_latest(registry)
    assert len(fake.calls) == before  # the scrape reads the last sample: no NVML call, so no wait on one


def test_background_sampler_samples_until_stopped_and_close_frees_gpm_with_fake_nvml() -> None:
    fake = FakeNVML()
    gpu = GPUCollector(nvml=fake, interval_s=0.12).start()
    deadline = time.monotonic() + 5
    while fake.calls.count("nvmlGpmSampleGet") < 3 and time.monotonic() < deadline:
        time.sleep(0.02)
    gpu.close()
    assert gpu.latest()[0].sm_activity == pytest.approx(0.415)
    assert fake.calls.count("nvmlGpmSampleFree") == 2 and fake.calls[-1] == "nvmlShutdown"
    assert not gpu.enabled and gpu.disabled_reason == "closed"


def test_memory_leak_shows_as_a_positive_slope_with_fake_nvml() -> None:
    clock = Clock()
    device = FakeDevice()
    registry = CollectorRegistry()
    gpu = GPUCollector(registry, nvml=FakeNVML([device]), clock=clock)
    for _ in range(10):
        clock.t += 60
        device.memory_used += 100 << 20  # 100 MiB a minute
        gpu.sample_once()
    assert gpu.latest()[0].memory_used_slope_bytes_per_minute == pytest.approx(100 << 20)
    assert gpu.memory_slope(180)[0] == pytest.approx(100 << 20)
    assert _by_name(registry, "infersight_gpu_memory_used_slope_bytes_per_minute") == [
        pytest.approx(100 << 20)
    ]
