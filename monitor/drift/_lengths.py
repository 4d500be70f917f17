"""Request-length drift: did the token lengths of prompts or outputs change ("did very long
texts appear?").

`length_drift(reference, current) -> LengthDrift` is a pure function of two `RequestLengths`
(token counts per request, prompt and output separately). Per field it runs two tests:

- `length_tail`: how many current requests are longer than the reference's `1 - tail`
  order statistic X_(k). Given the reference, that count is Binomial(m, c_R) where
  c_R = P(X > X_(k)) is the reference's *actual* tail coverage. c_R is Beta(n-k+1, k) over
  references (exactly for continuous lengths, stochastically smaller for discrete ones),
  so the test uses its `1 - delta` quantile as the null share: the p-value is valid
  conditional on every reference except a `delta` share of unlucky ones. This is what
  the novelty test needed too (a test exact only on average over references).
- `length_ks`: Kolmogorov-Smirnov distance between the two empirical CDFs, minus the
  reference's own DKW band eps_R = sqrt(log(2/delta) / 2n) (which holds for every
  reference but a `delta` share, for any distribution, discrete or not); the current
  window's deviation beyond it is bounded by DKW with Massart's constant,
  P(sup|F_m - F| > t) <= 2 exp(-2 m t²).

The `delta`s are split evenly over the tests run (so all their reference bands hold
together for at least `confidence` of references), and Holm's correction across the
tests keeps the section's false-alarm rate at or under `alpha` on those references. Both
bounds are conservative for discrete counts. The section has its own verdict; it does not
enter the semantic (embedding) verdict of the report.
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ._stat_tests import holm_adjust

__all__ = [
    "LENGTH_FIELDS",
    "LengthDrift",
    "LengthSummary",
    "LengthTest",
    "RequestLengths",
    "count_words",
    "length_drift",
    "read_lengths",
]

LENGTH_FIELDS = ("prompt", "output")
_WORDS = re.compile(r"\w+|[^\w\s]")


def count_words(text: str) -> int:
    """Words and punctuation marks: the stand-in for token counts when none were recorded."""
    return len(_WORDS.findall(text))


@dataclass(frozen=True, eq=False)
class RequestLengths:
    """Token counts of a window's requests: prompts and outputs, each of the requests that
    have one (a failed request may have a prompt count and no output count).

    `counted_by`: "tokens" (counted by the serving tokenizer and recorded with the request)
    or "words" (words and punctuation of the texts, when no counts were recorded). Two
    windows are comparable only when counted the same way."""

    prompt_tokens: np.ndarray  # int64 [N]
    output_tokens: np.ndarray  # int64 [M]
    counted_by: str = "tokens"

    @classmethod
    def of(
        cls,
        prompt_tokens: Sequence[int | None],
        output_tokens: Sequence[int | None],
        counted_by: str = "tokens",
    ) -> RequestLengths:
        """From per-request counts; None (not recorded) and negative values are left out."""
        return cls(_counts(prompt_tokens), _counts(output_tokens), counted_by)

    @classmethod
    def of_texts(cls, prompts: Sequence[str], responses: Sequence[str | None] = ()) -> RequestLengths:
        """Word counts of the texts (`counted_by="words"`)."""
        return cls.of(
            [count_words(p) for p in prompts],
            [count_words(r) for r in responses if r is not None],
            "words",
        )

    def field(self, name: str) -> np.ndarray:
        if name == "prompt":
            return self.prompt_tokens
        if name == "output":
            return self.output_tokens
        raise ValueError(f"unknown length field {name!r}: expected 'prompt' or 'output'")


def read_lengths(
    path: str | Path, prompts: Sequence[str], responses: Sequence[str | None] = ()
) -> RequestLengths:
    """The lengths of a window read from `path` (its texts: `prompts`, `responses`): the
    recorded `prompt_tokens` / `output_tokens` of a .jsonl or .csv file when every record
    with a prompt carries a `prompt_tokens` count, else the word counts of the texts."""
    p = Path(path)
    suffix = p.suffix.lower()
    records: list[dict[str, Any]] = []
    try:
        text = p.read_text(encoding="utf-8-sig")
        if suffix in (".jsonl", ".ndjson"):
            records = [obj for line in text.splitlines() if line.strip() for obj in [json.loads(line)]]
        elif suffix == ".csv":
            records = [dict(row) for row in csv.DictReader(io.StringIO(text, newline=""))]
    except (OSError, UnicodeDecodeError, ValueError, csv.Error):
        records = []  # read_window reports what is wrong with the file; lengths fall back to words
    prompt_counts: list[int | None] = []
    output_counts: list[int | None] = []
    for obj in records:
        if not isinstance(obj, dict):
            return RequestLengths.of_texts(prompts, responses)
        prompt = obj.get("prompt", obj.get("text"))
        if not isinstance(prompt, str) or not prompt.strip():
            continue
        count = _as_count(obj.get("prompt_tokens"))
        if count is None:
            return RequestLengths.of_texts(prompts, responses)
        prompt_counts.append(count)
        output_counts.append(_as_count(obj.get("output_tokens")))
    if not prompt_counts or len(prompt_counts) != len(prompts):
        return RequestLengths.of_texts(prompts, responses)
    return RequestLengths.of(prompt_counts, output_counts, "tokens")


def _as_count(value: object) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if value >= 0 else None
    if isinstance(value, str) and value.strip().isascii() and value.strip().isdigit():
        return int(value.strip())
    return None


def _counts(values: Sequence[int | None]) -> np.ndarray:
    kept = [int(v) for v in values if v is not None and int(v) >= 0]
    return np.asarray(kept, dtype=np.int64)


@dataclass(frozen=True)
class LengthTest:
    """One length test on one field, after Holm's correction across the section.

    `statistic`: for length_tail the number of current requests longer than the reference's
    tail length, for length_ks the KS distance. `score` (the effect): the current share above
    the tail length minus the bounded null share, or the distance beyond the reference's band.
    """

    __test__ = False  # not a pytest class

    field: str  # prompt, output
    test: str  # length_tail, length_ks
    statistic: float
    score: float
    null_share: float | None  # length_tail: the bounded share above the tail length under no drift
    tail_tokens: int | None  # length_tail: the reference's tail length (X_(k))
    p_value: float
    p_adjusted: float
    drifted: bool
    n_reference: int
    n_current: int


@dataclass(frozen=True)
class LengthSummary:
    field: str
    window: str  # reference, current
    n: int
    mean: float | None
    p50: float | None
    p95: float | None
    max: int | None


@dataclass(frozen=True)
class LengthDrift:
    """The length section of a report: its own verdict, tests and the two windows' summaries."""

    drifted: bool
    p_value: float  # smallest Holm-adjusted p-value (1.0 when nothing was tested)
    decided_by: str | None  # "output length_tail": the drifted test with the smallest adjusted p
    alpha: float
    confidence: float  # share of references on which the guarantee holds
    tail: float
    correction: str  # e.g. "holm(4)"
    counted_by: str
    tests: tuple[LengthTest, ...]
    summaries: tuple[LengthSummary, ...]
    notes: tuple[str, ...] = field(default=())

    def test(self, field_name: str, test: str) -> LengthTest | None:
        return next((t for t in self.tests if t.field == field_name and t.test == test), None)

    def field_p_value(self, field_name: str) -> float | None:
        """The smallest adjusted p-value of the field's tests; None when it was not tested."""
        mine = [t.p_adjusted for t in self.tests if t.field == field_name]
        return min(mine) if mine else None

    def to_json(self) -> dict[str, Any]:
        return {
            "drift": self.drifted,
            "p_value": self.p_value,
            "decided_by": self.decided_by,
            "alpha": self.alpha,
            "confidence": self.confidence,
            "tail": self.tail,
            "correction": self.correction,
            "counted_by": self.counted_by,
            "tests": [asdict(t) for t in self.tests],
            "summaries": [asdict(s) for s in self.summaries],
            "notes": list(self.notes),
        }


def length_drift(
    reference: RequestLengths,
    current: RequestLengths,
    *,
    alpha: float = 0.05,
    tail: float = 0.01,
    confidence: float = 0.95,
    min_reference: int = 20,
    min_current: int = 5,
) -> LengthDrift:
    """Prompt and output lengths of `current` against `reference`.

    A field with fewer than `min_reference` / `min_current` counts in either window is not
    tested (a note says so); with neither field testable the verdict is "no drift", p = 1."""
    if not 0.0 < alpha < 1.0:
        raise ValueError("alpha must be in (0, 1)")
    if not 0.0 < tail < 0.5:
        raise ValueError("tail must be in (0, 0.5)")
    if not 0.0 < confidence < 1.0:
        raise ValueError("confidence must be in (0, 1)")
    notes: list[str] = []
    counted_by = reference.counted_by
    if reference.counted_by != current.counted_by:
        notes.append(
            f"the reference was counted in {reference.counted_by} and the current window in "
            f"{current.counted_by}: lengths not compared"
        )
        counted_by = f"{reference.counted_by}/{current.counted_by}"
    fields: list[str] = []
    for name in LENGTH_FIELDS if reference.counted_by == current.counted_by else ():
        ref, cur = reference.field(name), current.field(name)
        if ref.size < min_reference or cur.size < min_current:
            if ref.size or cur.size:
                notes.append(
                    f"{name} lengths not tested: {ref.size} reference and {cur.size} current counts "
                    f"(at least {min_reference} and {min_current} needed)"
                )
            continue
        if np.unique(ref).size == 1:
            notes.append(
                f"every reference {name} has {int(ref[0])} {counted_by}: any other length counts as a change"
            )
        fields.append(name)
    delta = (1.0 - confidence) / max(1, 2 * len(fields))
    raw: list[tuple[str, str, float, float, float | None, int | None, int, int, float]] = []
    for name in fields:
        ref, cur = reference.field(name), current.field(name)
        raw.append((name, "length_tail", *_tail_test(ref, cur, tail, delta)))
        raw.append((name, "length_ks", *_ks_test(ref, cur, delta)))
    adjusted = holm_adjust([r[-1] for r in raw])
    tests = tuple(
        LengthTest(
            field=name,
            test=test,
            statistic=statistic,
            score=score,
            null_share=null_share,
            tail_tokens=tail_tokens,
            p_value=p,
            p_adjusted=p_adj,
            drifted=bool(p_adj < alpha and score > 0),
            n_reference=n_ref,
            n_current=n_cur,
        )
        for (name, test, statistic, score, null_share, tail_tokens, n_ref, n_cur, p), p_adj in zip(
            raw, adjusted, strict=True
        )
    )
    drifted = [t for t in tests if t.drifted]
    decider = min(drifted, key=lambda t: (t.p_adjusted, -t.score)) if drifted else None
    summaries = tuple(
        _summary(name, window, lengths.field(name))
        for name in LENGTH_FIELDS
        for window, lengths in (("reference", reference), ("current", current))
    )
    return LengthDrift(
        drifted=bool(drifted),
        p_value=min((t.p_adjusted for t in tests), default=1.0),
        decided_by=None if decider is None else f"{decider.field} {decider.test}",
        alpha=alpha,
        confidence=confidence,
        tail=tail,
        correction=f"holm({len(tests)})",
        counted_by=counted_by,
        tests=tests,
        summaries=summaries,
        notes=tuple(notes),
    )


def _tail_test(
    ref: np.ndarray, cur: np.ndarray, tail: float, delta: float
) -> tuple[float, float, float, int, int, int, float]:
    """(count, excess share, null share, tail length, n, m, p) of the upper-tail test."""
    from scipy.stats import beta, binom  # scipy.stats is slow to import: only when testing

    n, m = ref.size, cur.size
    k = min(n, max(1, math.ceil((1.0 - tail) * n)))  # 1-based order statistic
    threshold = int(np.partition(ref, k - 1)[k - 1])
    # P(X > X_(k)) ~ Beta(n - k + 1, k) for continuous X; a bound for counts (ties only shrink it)
    null_share = float(beta.ppf(1.0 - delta, n - k + 1, k))
    count = int(np.count_nonzero(cur > threshold))
    p = float(binom.sf(count - 1, m, null_share)) if count > 0 else 1.0
    return float(count), count / m - null_share, null_share, threshold, n, m, min(1.0, p)


def _ks_test(
    ref: np.ndarray, cur: np.ndarray, delta: float
) -> tuple[float, float, None, None, int, int, float]:
    """(distance, distance beyond the reference's band, -, -, n, m, p) of the DKW-bounded KS test."""
    n, m = ref.size, cur.size
    r, c = np.sort(ref), np.sort(cur)
    points = np.union1d(r, c)
    ref_cdf = np.searchsorted(r, points, side="right") / n
    cur_cdf = np.searchsorted(c, points, side="right") / m
    distance = float(np.max(np.abs(ref_cdf - cur_cdf)))
    band = math.sqrt(math.log(2.0 / delta) / (2.0 * n))
    excess = distance - band
    p = 1.0 if excess <= 0 else min(1.0, 2.0 * math.exp(-2.0 * m * excess * excess))
    return distance, excess, None, None, n, m, p


def _summary(name: str, window: str, values: np.ndarray) -> LengthSummary:
    if values.size == 0:
        return LengthSummary(name, window, 0, None, None, None, None)
    return LengthSummary(
        field=name,
        window=window,
        n=int(values.size),
        mean=float(values.mean()),
        p50=float(np.quantile(values, 0.5)),
        p95=float(np.quantile(values, 0.95)),
        max=int(values.max()),
    )
