"""What one replica's steps cost, measured online while it serves: the basis of SLA routing.

Every batched decode step is timed and kept per batch size as an exponentially weighted
mean; every prefill adds to a per-prompt-token cost. `decode_s(b)` answers for any batch
size from what was measured: the batch size itself when seen, else a line through the
nearest measured sizes on either side (a decode step's cost grows about linearly with
the batch on CPU, and flatter on a GPU, so interpolation between two measured sizes is
safe; beyond the largest measured size the last slope is extended). Nothing here is a
constant about a model or a machine: with nothing measured every prediction is None.

The loop thread writes (one float update per step); router threads read. A read may see
an update half-applied across two sizes, which only makes a prediction one step stale.
On CUDA a decode call returns before the kernels finish, so there the timing reads only
the launch and predictions are optimistic (measured on CPU only so far).

`batch_cap` turns the measurements into a path's batch cap (a rung of the ladder): the rung
that serves the most requests per second while a request in a full batch still finishes
within the SLA. A batch size larger than any measured one is predicted optimistically (a
step never costs less at a larger batch, so the largest measured size's step is a lower
bound): the cap grows to it while the bound holds the SLA, the larger batches get measured
once the load fills them, and the cap comes back down if they turn out too slow. Sizes not
measured for a while count as unmeasured again, so a busy spell does not pin a cap down.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["BATCH_LADDER", "StepTimes", "StepTimesSnapshot", "batch_cap"]

# the batch caps a path may run at, smallest first (the seeds' 1-4-8-16 ladder)
BATCH_LADDER = (1, 4, 8, 16)
_ALPHA = 0.2  # weight of the newest observation: about the last ten steps count
_FRESH_STEPS = 1000  # a batch size not measured for this many steps is a guess again (batch_cap)


@dataclass(frozen=True)
class StepTimesSnapshot:
    """Measured means: decode seconds per step by batch size, prefill seconds per token,
    and a request's service seconds (admission to last token) and output tokens."""

    decode_s: dict[int, float]
    prefill_s_per_token: float | None
    service_s: float | None
    output_tokens: float | None
    steps: int


class StepTimes:
    def __init__(self) -> None:
        self._decode: dict[int, float] = {}
        self._sizes: list[int] = []
        self._seen: dict[int, int] = {}  # batch size -> the step it was last measured at
        self._prefill_per_token: float | None = None
        self._service: float | None = None
        self._output_tokens: float | None = None
        self.steps = 0

    # -- written by the loop thread ------------------------------------------------------

    def observe_decode(self, batch: int, seconds: float) -> None:
        if batch < 1 or not seconds >= 0.0:
            return
        self.steps += 1
        self._seen[batch] = self.steps
        old = self._decode.get(batch)
        if old is None:
            bisect.insort(self._sizes, batch)
            self._decode[batch] = seconds
        else:
            self._decode[batch] = old + _ALPHA * (seconds - old)

    def observe_prefill(self, tokens: int, seconds: float) -> None:
        if tokens < 1 or not seconds >= 0.0:
            return
        self._prefill_per_token = _ewma(self._prefill_per_token, seconds / tokens)

    def observe_service(self, seconds: float, output_tokens: int) -> None:
        """One finished request: admission to last token, and how many tokens it made."""
        if not seconds >= 0.0:
            return
        self._service = _ewma(self._service, seconds)
        self._output_tokens = _ewma(self._output_tokens, float(output_tokens))

    # -- read by anyone ------------------------------------------------------------------

    def decode_s(self, batch: int) -> float | None:
        """Predicted seconds of one decode step at `batch` (None: nothing measured yet)."""
        if batch < 1:
            return 0.0
        sizes = list(self._sizes)
        if not sizes:
            return None
        table = self._decode
        if batch in table:
            return table[batch]
        i = bisect.bisect_left(sizes, batch)
        if i == 0:  # below the smallest measured size: scale it down, never below 0
            lo = sizes[0]
            return table[lo] * batch / lo if len(sizes) == 1 else _line(sizes[0], sizes[1], table, batch)
        if i == len(sizes):  # above the largest: extend the last slope (or proportional)
            hi = sizes[-1]
            return table[hi] * batch / hi if len(sizes) == 1 else _line(sizes[-2], sizes[-1], table, batch)
        return _line(sizes[i - 1], sizes[i], table, batch)

    def optimistic_decode_s(self, batch: int) -> float | None:
        """`decode_s` up to the largest size measured within the last `_FRESH_STEPS` steps;
        above it, that size's step (a lower bound: a larger batch never steps faster). So a
        size measured slow in a busy spell is tried, and measured, again later instead of
        keeping a cap down for good. None: nothing measured yet."""
        fresh = [b for b, at in list(self._seen.items()) if self.steps - at < _FRESH_STEPS]
        if not fresh:
            return None
        top = max(fresh)
        return self._decode[top] if batch > top else self.decode_s(batch)

    def recent_decode_s(self, within_steps: int) -> dict[int, float]:
        """The measured decode step (seconds) of each batch size this replica ran within its
        last `within_steps` steps: what it costs now, with no interpolation."""
        seen = list(self._seen.items())
        return {b: self._decode[b] for b, at in seen if self.steps - at < within_steps}

    def prefill_s(self, tokens: int) -> float | None:
        per = self._prefill_per_token
        return None if per is None else per * max(0, tokens)

    @property
    def service_s(self) -> float | None:
        return self._service

    @property
    def output_tokens(self) -> float | None:
        return self._output_tokens

    def snapshot(self) -> StepTimesSnapshot:
        return StepTimesSnapshot(
            dict(self._decode), self._prefill_per_token, self._service, self._output_tokens, self.steps
        )


def batch_cap(
    times: StepTimes,
    rungs: Sequence[int],
    *,
    sla_s: float,
    output_tokens: float,
    prefill_s: float,
    beside_s: float = 0.0,
    arrival_rate: float = math.inf,
) -> int:
    """The batch cap among `rungs` for a path whose requests make `output_tokens` tokens
    after a `prefill_s` prefill, with `beside_s` of the other replica's work added to every
    step (one loop thread steps both), and `arrival_rate` requests a second (default: as
    many as the batch takes).

    A request in a batch of c is predicted to take its own prefill, those of the requests
    that join while it runs (the arrivals of its lifetime, at most c - 1: a full batch
    turns over about once in a request's life) and `output_tokens` steps at batch c. The cap
    is the rung of most requests per second (c / that latency) among those whose latency
    holds `sla_s`, the larger on a tie; a cap only bounds the batch, so a large one costs
    nothing while the load is light. When no rung holds the SLA, the rung of most requests
    per second. Unmeasured sizes count optimistically (`optimistic_decode_s`), so a larger
    rung is tried, and measured, as long as its lower bound allows it. With nothing
    measured, the largest rung."""
    best: tuple[bool, float, int] | None = None
    for c in rungs:
        step = times.optimistic_decode_s(c)
        if step is None:
            return max(rungs)
        decoding = max(1.0, output_tokens) * (step + beside_s)
        joining = min(c - 1.0, arrival_rate * (decoding + prefill_s))
        latency = (1.0 + joining) * prefill_s + decoding
        per_s = c / latency if latency > 0 else math.inf
        key = (latency <= sla_s, per_s, c)
        if best is None or key >= best:
            best = key
    return best[2] if best is not None else 1


def _ewma(old: float | None, new: float) -> float:
    return new if old is None else old + _ALPHA * (new - old)


def _line(a: int, b: int, table: dict[int, float], x: int) -> float:
    slope = (table[b] - table[a]) / (b - a)
    return max(0.0, table[a] + slope * (x - a))
