"""CPU used by the collectors sampling every second, as a share of one core.

    .venv/bin/python benchmarks/collector_cpu.py [--seconds 20]

Runs the process collector (psutil, this process) and the GPU collector on their
background samplers at 1 s for `--seconds`, with a scrape of the registry every
second as Prometheus would, while the main thread sleeps; the figure is this
process's CPU time over the run minus an idle run of the same length, divided by the
wall time. Without a GPU the GPU collector samples a fake NVML device (GPM-capable) at
the pynvml function boundary: that measures the collector's own Python work, not the
driver's time inside NVML calls. Target: under one percent of one core.
"""

from __future__ import annotations

import argparse
import os
import time

from infersight.collectors import GPUCollector, InferenceStats, ProcessCollector
from infersight.collectors.fake_nvml import FakeDevice, FakeNVML
from prometheus_client import CollectorRegistry, generate_latest


def _cpu_over(seconds: float, registry: CollectorRegistry | None) -> float:
    t_cpu, t_wall = time.process_time(), time.monotonic()
    end = t_wall + seconds
    while time.monotonic() < end:
        time.sleep(1.0)
        if registry is not None:
            generate_latest(registry)
    return (time.process_time() - t_cpu) / (time.monotonic() - t_wall)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    args = parser.parse_args()
    from infersight.engine.native import cpu_model

    print(f"CPU: {cpu_model()}; {os.cpu_count()} logical CPUs", flush=True)

    idle = _cpu_over(args.seconds, None)
    registry = CollectorRegistry()
    gpu = GPUCollector(registry, interval_s=1.0)
    source = "real NVML"
    if not gpu.enabled:
        source = f"fake NVML, 8 GPM devices ({gpu.disabled_reason})"
        devices = [FakeDevice(uuid=f"GPU-fake-{i}", processes={os.getpid(): 1 << 30}) for i in range(8)]
        registry = CollectorRegistry()
        gpu = GPUCollector(registry, nvml=FakeNVML(devices), interval_s=1.0)
    process = ProcessCollector(registry, interval_s=1.0)
    InferenceStats(registry).series("m", "v1")  # exported too, as in the sidecar
    gpu.start()
    process.start()
    busy = _cpu_over(args.seconds, registry)
    gpu.close()
    process.stop()
    print(f"GPU collector source: {source}")
    print(f"idle: {idle * 100:.3f}% of one core; sampling at 1 s + a scrape a second: {busy * 100:.3f}%")
    print(f"collectors' share: {(busy - idle) * 100:.3f}% of one core over {args.seconds:.0f} s")


if __name__ == "__main__":
    main()
