"""What client-invented model names cost InferenceStats, with and without the label cap:
the Python heap (tracemalloc) and the /metrics text after N distinct (model, model_version)
pairs, one observation each.

    .venv/bin/python benchmarks/label_cap.py [--names 10000] [--cap 100]
"""

from __future__ import annotations

import argparse
import platform
import tracemalloc

from infersight.collectors import InferenceStats
from prometheus_client import CollectorRegistry, generate_latest


def measure(names: int, cap: int) -> tuple[float, int, int]:
    registry = CollectorRegistry()
    stats = InferenceStats(registry, max_label_values=cap)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(names):
            stats.add(model=f"model-{i}", model_version=f"version-{i}", duration_s=0.1, ttft_s=0.01,
                      prompt_tokens=12, output_tokens=20)  # fmt: skip
        stats.count(60)  # folds what is pending into the windows
        heap = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    return heap / 1e6, len(generate_latest(registry)), len(stats.labels())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--names", type=int, default=10_000)
    parser.add_argument("--cap", type=int, default=100)
    args = parser.parse_args()
    print(f"{platform.processor() or platform.machine()}, Python {platform.python_version()}")
    for label, cap in (("capped", args.cap), ("uncapped", args.names + 1)):
        heap, size, series = measure(args.names, cap)
        print(f"{label:9} max_label_values={cap:<6} names={args.names}: heap +{heap:.1f} MB, "
              f"/metrics {size / 1e6:.2f} MB, {series} series")  # fmt: skip


if __name__ == "__main__":
    main()
