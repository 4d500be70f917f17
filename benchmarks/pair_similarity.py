"""Where the paired similarity check's line sits: how alike two sampled answers are by chance.

    .venv/bin/python benchmarks/pair_similarity.py [--prompts 120] [--max-tokens 16]
        [--candidates int8,fp8,gptq,int4row,terse,noise] [--work .bench/relcheck]

The similarity check (alerts/release/paired_checks.py) compares the mean cosine between the
two versions' answers to the same request against a fixed line (`PairPolicy.min_similarity`).
The runtime gives both sides of a pair the same seed, so two faithful versions sample the
same tokens until their distributions first part, and then two unrelated continuations. This
measures, on SmolLM2-135M-Instruct's fp32 import and the release-check benchmarks' candidates
(benchmarks/_candidates.py, built under --work), the mean cosine between answers to the same
Banking77 test questions at temperature 1, embedded as the service embeds a pair's answers:

- fp32 against fp32 with another seed: two independent samples of one model, the similarity
  an unchanged release shows once its pairs are no longer coupled by the seed;
- fp32 against fp32 with the same seed: the coupled figure (1.0 unless the run is not
  deterministic);
- fp32 against each candidate with the same seed, as the service pairs them.

Each version answers under its own chat template (the terse candidate's system message is
its change). Prints the CPU model, the per-row mean, its spread over the questions and the
share of answers under the shipped line.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _candidates import CANDIDATES, RealModel, build


def answers(registry: Path, version: str, encode_of: object, questions: list[str], seeds: list[int],
            max_tokens: int) -> list[tuple[tuple[int, ...], str]]:  # fmt: skip
    """`version`'s answer to each question, sampled at temperature 1 with that question's seed:
    its tokens and its text as the service decodes a pair's answers."""
    from infersight.engine import Registry, Runtime

    runtime = Runtime(
        Registry(registry), max_batch_size=8, max_prompt_tokens=192, max_seq_len=192 + max_tokens
    )
    runtime.start(version)
    try:
        encode = encode_of(runtime)  # type: ignore[operator]
        handles = [
            runtime.submit(encode(q, version), max_new_tokens=max_tokens, temperature=1.0, seed=s)
            for q, s in zip(questions, seeds, strict=True)
        ]
        out = [tuple(h.result(timeout=900).token_ids) for h in handles]
        tok = runtime.tokenizer  # type: ignore[attr-defined]
        return [(ids, str(tok.decode(list(ids), skip_special_tokens=True)) or " ") for ids in out]
    finally:
        runtime.stop(drain=False)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=120)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--candidates", default="int8,fp8,gptq,int4row,terse,noise")
    parser.add_argument("--work", type=Path, default=Path(".bench/relcheck"))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    names = tuple(n for n in args.candidates.split(",") if n)
    unknown = [n for n in names if n not in CANDIDATES]
    if unknown:
        parser.error(f"unknown candidates {unknown}; choose from {', '.join(CANDIDATES)}")

    from infersight.engine.native import cpu_model
    from infersight.monitor import data
    from infersight.monitor.drift import DriftDetector, TextWindow

    print(f"CPU: {cpu_model()}", flush=True)
    candidates = build(args.work, names)
    model = RealModel(candidates, names, 1)
    rng = random.Random(args.seed)
    questions = rng.sample([u.text for u in data.banking77("test")], args.prompts)
    seeds = [rng.getrandbits(62) for _ in questions]
    others = [rng.getrandbits(62) for _ in questions]
    t = time.perf_counter()
    rows: dict[str, tuple[str, list[tuple[tuple[int, ...], str]], list[tuple[tuple[int, ...], str]]]] = {}
    fp32 = answers(candidates.registry, candidates.stable, model.encoder, questions, seeds, args.max_tokens)
    rows["fp32, another seed"] = (candidates.stable, fp32, answers(
        candidates.registry, candidates.stable, model.encoder, questions, others, args.max_tokens))  # fmt: skip
    rows["fp32, the same seed"] = (candidates.stable, fp32, answers(
        candidates.registry, candidates.stable, model.encoder, questions, seeds, args.max_tokens))  # fmt: skip
    for name in names:
        version = candidates.versions[name]
        rows[name] = (version, fp32, answers(candidates.registry, version, model.encoder, questions, seeds,
                                             args.max_tokens))  # fmt: skip
    print(f"{len(rows)} rows of {len(questions)} answers in {time.perf_counter() - t:.0f} s", flush=True)

    detector = DriftDetector()  # the service's embedder, as it scores pairs
    line = 0.6
    print(f"\n{args.prompts} Banking77 test questions, temperature 1, max_tokens {args.max_tokens}; "
          f"the shipped line {line}\n")  # fmt: skip
    print("| answers against fp32's | mean similarity | sd over questions | under the line | same tokens |")
    print("|---|---:|---:|---:|---:|")
    for label, (_, a, b) in rows.items():
        ea, eb = detector.embed(
            TextWindow.of(questions, [t for _, t in a]), TextWindow.of(questions, [t for _, t in b])
        )
        sims = [float(s) for s in (ea.response_embeddings * eb.response_embeddings).sum(axis=1)]
        under = sum(s < line for s in sims) / len(sims)
        same = sum(x[0] == y[0] for x, y in zip(a, b, strict=True)) / len(a)
        print(f"| {label} | {statistics.mean(sims):.3f} | {statistics.stdev(sims):.3f} | {under:.0%} | "
              f"{same:.0%} |", flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
