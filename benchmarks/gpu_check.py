"""Exercise the GPU collector against the real NVML library on a real GPU and print what it read.

    .venv/bin/python benchmarks/gpu_check.py [--seconds 3] [--interval 0.25] [--load]

On a machine without a GPU, driver or pynvml this prints that NVML is unavailable and
why, and exits 0. With `--load` and a CUDA build of torch, it keeps the GPU busy with
matrix multiplications while sampling, so SM activity and occupancy (GPM, Hopper+)
and the time-busy ratio have something to show.
"""

from __future__ import annotations

import argparse
import os
import threading
import time

from infersight.collectors import GPUCollector
from prometheus_client import CollectorRegistry, generate_latest


def _load(stop: threading.Event) -> str:
    try:
        import torch
    except ImportError:
        return "torch not installed: no load"
    if not torch.cuda.is_available():
        return "torch has no CUDA: no load"

    def spin() -> None:
        a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
        while not stop.is_set():
            for _ in range(20):
                a = (a @ a).clamp_(-1, 1)
            torch.cuda.synchronize()

    threading.Thread(target=spin, daemon=True).start()
    return "bf16 8192x8192 matmuls on cuda:0"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--interval", type=float, default=0.25)
    parser.add_argument("--load", action="store_true", help="busy the GPU with torch matmuls while sampling")
    args = parser.parse_args()
    from infersight.engine.native import cpu_model

    print(f"CPU: {cpu_model()}; {os.cpu_count()} logical CPUs", flush=True)

    registry = CollectorRegistry()
    gpu = GPUCollector(registry, interval_s=args.interval)
    if not gpu.enabled:
        print(f"NVML unavailable: {gpu.disabled_reason}")
        print("GPU collector disabled; exported: infersight_gpu_collector_enabled 0 and the reason above.")
        return 0
    import pynvml  # initialised by the collector (NVML counts its inits)

    print(f"driver {pynvml.nvmlSystemGetDriverVersion()}, NVML {pynvml.nvmlSystemGetNVMLVersion()}")
    stop = threading.Event()
    if args.load:
        print("load:", _load(stop))
        time.sleep(1.0)
    gpu.start()
    time.sleep(args.seconds)
    gpu.stop()
    stop.set()
    for index, s in sorted(gpu.latest().items()):
        print(f"GPU {index}: {s.name} {s.uuid} gpm_supported={s.gpm_supported}")
        for field in (
            "sm_activity", "sm_occupancy", "busy_time_ratio", "memory_used_bytes", "memory_reserved_bytes",
            "memory_total_bytes", "process_memory_bytes", "sm_clock_hz", "temperature_celsius", "power_watts",
            "memory_used_slope_bytes_per_minute",
        ):  # fmt: skip
            print(f"  {field:36} {getattr(s, field)}")
    print(f"pid {os.getpid()}; NVML errors by function: {gpu.nvml_errors() or 'none'}")
    print("--- exposition ---")
    print(
        "\n".join(
            line for line in generate_latest(registry).decode().splitlines() if not line.startswith("#")
        )
    )
    gpu.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
