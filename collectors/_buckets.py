"""Histogram bucket boundaries for the inference metrics.

One set serves a CPU toy model (requests of 50 ms to tens of seconds, a few ms to
100 ms per token) and a Hopper GPU (TTFT of 10-100 ms, 5-40 ms per output token,
requests of 0.2-60 s). Boundaries are roughly log-spaced, denser where those two
live, so `histogram_quantile` interpolates within a bucket no wider than ~1.5x its
lower edge between 10 ms and 60 s.

- request duration: 1 ms .. 600 s (29 buckets + Inf)
- time to first token: 0.5 ms .. 60 s, finer below 100 ms
- time per output token: 0.5 ms .. 2.5 s, finest between 1 and 50 ms
- queue time: 0.5 ms .. 300 s
- tokens per request: powers of two, 1 .. 131072 (128k context)
"""

from __future__ import annotations

__all__ = [
    "DURATION_BUCKETS",
    "QUEUE_TIME_BUCKETS",
    "TOKEN_BUCKETS",
    "TPOT_BUCKETS",
    "TTFT_BUCKETS",
]

DURATION_BUCKETS: tuple[float, ...] = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75,
    1.0, 1.5, 2.0, 3.0, 4.0, 5.0, 7.5, 10.0, 15.0, 20.0, 30.0, 45.0, 60.0, 120.0, 300.0, 600.0,
)  # fmt: skip
TTFT_BUCKETS: tuple[float, ...] = (
    0.0005, 0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.04, 0.05, 0.075, 0.1,
    0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
)  # fmt: skip
TPOT_BUCKETS: tuple[float, ...] = (
    0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05,
    0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.5,
)  # fmt: skip
QUEUE_TIME_BUCKETS: tuple[float, ...] = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
    30.0, 60.0, 120.0, 300.0,
)  # fmt: skip
TOKEN_BUCKETS: tuple[float, ...] = tuple(float(2**i) for i in range(18))  # 1 .. 131072
