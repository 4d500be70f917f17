"""Request-length drift (monitor/drift/_lengths.py): false alarms per reference and power.

Lengths are real: the word counts (words and punctuation, `count_words`) of the bundled
Banking77 utterances, as `infersight drift` counts texts that carry no token counts. For
each of `--references` references (1000 utterances of the training split) it draws
`--windows` null windows of 300 other training utterances and prints the false-alarm rate
of the length section per reference (min, median, 90th percentile, max). The test split is
not a null: its utterances are shorter (12.7 words on average against 13.9), and the rate
at which windows of it are flagged is printed apart. Power: windows where 5%, 10% or 20% of
the requests are "very long texts" (8 to 20 utterances pasted into one prompt, the
troubleshooting list's question) or merely longer ones (2 to 4 utterances), and windows
where outputs got shorter.

    .venv/bin/python benchmarks/length_drift.py --references 20 --windows 100
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
from infersight.monitor.data import banking77
from infersight.monitor.drift import RequestLengths, length_drift
from infersight.monitor.drift._lengths import count_words


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--references", type=int, default=20)
    ap.add_argument("--windows", type=int, default=100)
    ap.add_argument("--alpha", type=float, default=0.05)
    ap.add_argument(
        "--tail", type=float, default=0.01, help="the tail test's reference quantile (default 0.01)"
    )
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    from infersight.engine.native import cpu_model

    print(f"CPU: {cpu_model()}; {os.cpu_count()} logical CPUs", flush=True)
    rng = np.random.default_rng(args.seed)
    train = np.asarray([count_words(u.text) for u in banking77("train")], dtype=np.int64)
    test = np.asarray([count_words(u.text) for u in banking77("test")], dtype=np.int64)

    # outputs: the answers a 32-token-capped model gives, modelled from the same counts
    # (three utterances' worth of words, capped): discrete, many ties at the cap
    def outputs(pool: np.ndarray, n: int) -> np.ndarray:
        return np.minimum(32, rng.choice(pool, n) + rng.choice(pool, n) + rng.choice(pool, n))

    def window(pool: np.ndarray, n: int) -> RequestLengths:
        return RequestLengths(rng.choice(pool, n, replace=False), outputs(pool, n), "words")

    t0 = time.perf_counter()
    calls = 0
    rates, split_rates = [], []
    for _ in range(args.references):
        order = rng.permutation(train.size)
        ref = RequestLengths(train[order[:1000]], outputs(train, 1000), "words")
        rest = train[order[1000:]]
        alarms = split_alarms = 0
        for _ in range(args.windows):
            alarms += length_drift(ref, window(rest, 300), alpha=args.alpha, tail=args.tail).drifted
            split_alarms += length_drift(ref, window(test, 300), alpha=args.alpha, tail=args.tail).drifted
            calls += 2
        rates.append(alarms / args.windows)
        split_rates.append(split_alarms / args.windows)
    print(
        f"null windows: {args.references} references x {args.windows} windows of 300, alpha {args.alpha}, "
        f"tail {args.tail}"
    )
    for name, values in (("false alarms per reference", rates), ("test split flagged", split_rates)):
        r = np.asarray(values)
        print(
            f"  {name}: min {r.min():.3f}  median {np.median(r):.3f}  p90 {np.quantile(r, 0.9):.3f}  "
            f"max {r.max():.3f}  (share of references <= alpha: {np.mean(r <= args.alpha):.2f})"
        )
    for what, lo, hi in (
        ("very long prompts (8-20 utterances)", 8, 21),
        ("longer prompts (2-4 utterances)", 2, 5),
    ):
        for share in (0.05, 0.10, 0.20):
            detected = 0
            for _ in range(args.windows):
                ref = window(train, 1000)
                cur = window(train, 300)
                k = round(share * 300)
                long = np.asarray([rng.choice(train, rng.integers(lo, hi)).sum() for _ in range(k)])
                prompts = cur.prompt_tokens.copy()
                prompts[:k] = long
                result = length_drift(
                    ref, RequestLengths(prompts, cur.output_tokens, "words"), alpha=args.alpha
                )
                detected += result.drifted
                calls += 1
            print(f"  power, {100 * share:.0f}% {what}: {detected / args.windows:.2f}")
    detected = 0
    for _ in range(args.windows):
        ref = window(train, 1000)
        cur = window(train, 300)
        shorter = np.minimum(32, rng.choice(train, 300) + rng.choice(train, 300))  # two utterances' worth
        detected += length_drift(
            ref, RequestLengths(cur.prompt_tokens, shorter, "words"), alpha=args.alpha
        ).drifted
        calls += 1
    print(f"  power, outputs a third shorter: {detected / args.windows:.2f}")
    print(f"  {1e3 * (time.perf_counter() - t0) / calls:.2f} ms per length_drift call (1000 vs 300)")


if __name__ == "__main__":
    main()
