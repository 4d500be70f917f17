"""Drift benchmark: throughput, MMD permutation-test time, and a side-by-side with
Alibi Detect and Evidently on the same windows of real utterances.

    .venv/bin/python benchmarks/drift.py [--draws 50] [--alibi .bench/alibi/bin/python]
                                         [--evidently .bench/evidently/bin/python]

(a) texts/s of `DriftDetector.score` (embedding with the text-hash cache, both tests,
    the explanation) against sentence-transformers' raw `encode` of the same texts,
    alternated, two rounds each; the ratio of medians is reported.
(b) the MMD permutation test with 1000 permutations: 1000 vs 1000 and 5000 vs 5000
    embeddings (as the detector picks: exact kernel, or random features above 4000
    pooled), plus the exact kernel at 5000 vs 5000 for comparison.
(c) detection rate (10% hotel utterances in a 300-text window against 600 Banking77
    texts) and false-alarm rate (300 Banking77 texts) over `--draws` draws each, and the
    time per draw: ours (MMD + novelty, Holm), Alibi Detect MMDDrift and Evidently's
    embedding drift, each in its own venv, embeddings passed as a .npz file.
Results go to stdout (markdown) and .bench/drift_benchmark.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from infersight.monitor.data import banking77, hotels
from infersight.monitor.drift import (
    CachedEmbedder,
    DetectorConfig,
    DriftDetector,
    SentenceTransformerEmbedder,
    TestOptions,
    TextWindow,
)
from infersight.monitor.drift._detector import run_tests
from infersight.monitor.drift._mmd import mmd_exact_test, mmd_test
from infersight.monitor.drift._stat_tests import novelty_test
from infersight.monitor.drift._windows import EmbeddedWindow

ROOT = Path(__file__).resolve().parents[1]
BASELINES = ROOT / "benchmarks" / "drift_baselines"
OUT = ROOT / ".bench"


def machine() -> dict[str, object]:
    cpu = ""
    info = Path("/proc/cpuinfo")
    if info.exists():
        names = [
            ln.split(":", 1)[1].strip() for ln in info.read_text().splitlines() if ln.startswith("model name")
        ]
        cpu = names[0] if names else ""
    import torch

    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
    }


def throughput(inner: SentenceTransformerEmbedder, texts: list[str]) -> dict[str, Any]:
    model = inner._load()
    half = len(texts) // 2
    raw, ours = [], []
    for _ in range(2):
        start = time.perf_counter()
        model.encode(texts, batch_size=inner.batch_size, normalize_embeddings=True, convert_to_numpy=True)
        raw.append(time.perf_counter() - start)
        detector = DriftDetector(CachedEmbedder(inner), DetectorConfig())  # a cold cache every round
        start = time.perf_counter()
        detector.score(TextWindow.of(texts[:half]), TextWindow.of(texts[half:]))
        ours.append(time.perf_counter() - start)
    r, o = statistics.median(raw), statistics.median(ours)
    return {
        "texts": len(texts),
        "raw_encode_texts_per_s": len(texts) / r,
        "score_texts_per_s": len(texts) / o,
        "ratio": r / o,
        "raw_s": raw,
        "score_s": ours,
    }


def _spread(rows: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
    """n distinct unit rows from real embeddings (resampled, slightly perturbed)."""
    picked = (
        rows[rng.integers(0, rows.shape[0], n)]
        + rng.standard_normal((n, rows.shape[1])).astype(np.float32) * 0.02
    )
    return picked / np.linalg.norm(picked, axis=1, keepdims=True)


def mmd_timing(rows: np.ndarray) -> list[dict[str, object]]:
    rng = np.random.default_rng(0)
    out = []
    options = TestOptions(permutations=1000)
    cases = [
        (1000, mmd_test),
        (5000, mmd_test),
        (5000, mmd_exact_test),
        (1000, novelty_test),
        (5000, novelty_test),
    ]
    for n, fn in cases:
        x, y = _spread(rows, n, rng), _spread(rows, n, rng)
        times, method = [], ""
        for _ in range(3):
            start = time.perf_counter()
            method = fn(x, y, options).method
            times.append(time.perf_counter() - start)
        out.append(
            {
                "n": n,
                "function": fn.__name__,
                "method": method,
                "seconds_median": statistics.median(times),
                "seconds": times,
            }
        )
    return out


def make_windows(bank: np.ndarray, hotel: np.ndarray, draws: int, path: Path) -> np.ndarray:
    rng = np.random.default_rng(1)
    arrays: dict[str, np.ndarray] = {}
    truth = []
    for i in range(2 * draws):
        drifted = i < draws
        idx = rng.permutation(bank.shape[0])
        ref = bank[idx[:600]]
        if drifted:
            cur = np.concatenate([bank[idx[600:870]], hotel[rng.choice(hotel.shape[0], 30, replace=False)]])
            cur = cur[rng.permutation(300)]
        else:
            cur = bank[idx[600:900]]
        arrays[f"ref_{i}"], arrays[f"cur_{i}"] = ref, cur
        truth.append(drifted)
    arrays["n"], arrays["drifted"] = np.array(2 * draws), np.array(truth)
    np.savez(path, **arrays)  # type: ignore[arg-type]
    return np.array(truth)


def ours(path: Path) -> list[dict[str, Any]]:
    data = np.load(path)
    results = []
    for i in range(int(data["n"])):
        ref, cur = EmbeddedWindow.from_arrays(data[f"ref_{i}"]), EmbeddedWindow.from_arrays(data[f"cur_{i}"])
        start = time.perf_counter()
        tests = run_tests(ref, cur, DetectorConfig(options=TestOptions(seed=i)))
        seconds = time.perf_counter() - start
        p = {t.test: t.p_value for t in tests}
        results.append(
            {
                "draw": i,
                "drift": any(t.drifted for t in tests),
                "seconds": seconds,
                "mmd_alone": p["mmd"] < 0.05,
                "novelty_alone": p["novelty"] < 0.05,
            }
        )
    return results


def baseline(
    python: str, script: str, path: Path, *extra: str, per_class: int | None = None
) -> list[dict[str, Any]] | str:
    out = OUT / f"{Path(script).stem}{'_' + '_'.join(extra) if extra else ''}.json"
    env = {**os.environ, "PYTHONPATH": str(BASELINES), "OMP_NUM_THREADS": "2"}
    if per_class is not None:
        env["DRIFT_DRAWS_PER_CLASS"] = str(per_class)
    done = subprocess.run(
        [python, str(BASELINES / script), str(path), str(out), *extra],
        capture_output=True,
        text=True,
        env=env,
        timeout=3600,
    )
    if done.returncode != 0:
        return f"failed: {done.stderr.strip().splitlines()[-1] if done.stderr.strip() else done.returncode}"
    return json.loads(out.read_text())


def summarize(results: list[dict[str, Any]], truth: np.ndarray, key: str = "drift") -> dict[str, Any]:
    flags = np.array([bool(r[key]) for r in results])
    real = np.array([bool(truth[int(r["draw"])]) for r in results])
    out: dict[str, Any] = {
        "draws": [int(real.sum()), int((~real).sum())],
        "detection_rate": float(flags[real].mean()),
        "false_alarm_rate": float(flags[~real].mean()),
        "seconds_per_draw_median": statistics.median(float(r["seconds"]) for r in results),
    }
    extra = [float(r["report_seconds"]) for r in results if "report_seconds" in r]
    if extra:
        out["whole_report_seconds"] = extra
    return out


def only_ours(draws: int) -> int:
    """Our rates on many draws (cheap: no baselines), written to .bench/drift_ours.json."""
    OUT.mkdir(exist_ok=True)
    cache = CachedEmbedder(SentenceTransformerEmbedder())
    rng = np.random.default_rng(0)
    bank_texts = sorted({u.text for u in banking77("train")})
    bank_texts = [bank_texts[i] for i in rng.choice(len(bank_texts), 2000, replace=False)]
    bank, hotel = cache.encode(bank_texts), cache.encode(sorted({u.text for u in hotels()}))
    path = OUT / "drift_windows_ours.npz"
    truth = make_windows(bank, hotel, draws, path)
    mine = ours(path)
    result = {
        "draws": draws,
        "combined": summarize(mine, truth),
        "mmd_alone": summarize(mine, truth, "mmd_alone"),
        "novelty_alone": summarize(mine, truth, "novelty_alone"),
    }
    (OUT / "drift_ours.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result))
    return 0


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--draws", type=int, default=50)
    parser.add_argument("--alibi", default=str(OUT / "alibi" / "bin" / "python"))
    parser.add_argument("--evidently", default=str(OUT / "evidently" / "bin" / "python"))
    parser.add_argument("--skip-throughput", action="store_true")
    parser.add_argument(
        "--only-ours",
        type=int,
        metavar="DRAWS",
        help="only our detection and false-alarm rates, on DRAWS draws each",
    )
    args = parser.parse_args()
    if args.only_ours:
        return only_ours(args.only_ours)
    OUT.mkdir(exist_ok=True)
    report: dict[str, object] = {"machine": machine(), "command": " ".join(sys.argv)}
    inner = SentenceTransformerEmbedder()
    rng = np.random.default_rng(0)
    bank_texts = sorted({u.text for u in banking77("train")})
    bank_texts = [bank_texts[i] for i in rng.choice(len(bank_texts), 2000, replace=False)]
    hotel_texts = sorted({u.text for u in hotels()})
    if not args.skip_throughput:
        report["throughput"] = throughput(inner, bank_texts)
        print("(a) throughput", json.dumps(report["throughput"]), flush=True)
    cache = CachedEmbedder(inner)
    bank = cache.encode(bank_texts)
    hotel = cache.encode(hotel_texts)
    report["mmd_timing"] = mmd_timing(bank)
    print("(b) mmd timing", json.dumps(report["mmd_timing"]), flush=True)
    path = OUT / "drift_windows.npz"
    truth = make_windows(bank, hotel, args.draws, path)
    side: dict[str, object] = {}
    mine = ours(path)
    side["infersight (MMD + novelty, Holm)"] = summarize(mine, truth)
    side["infersight MMD alone (raw p)"] = summarize(mine, truth, "mmd_alone")
    side["infersight novelty alone (raw p)"] = summarize(mine, truth, "novelty_alone")
    print("(c) ours", json.dumps(side), flush=True)
    few = max(1, args.draws // 10)
    runs: list[tuple[str, str, str, tuple[str, ...], int | None]] = [
        ("Alibi Detect MMDDrift (100 permutations, its default)", args.alibi, "alibi_mmd.py", ("100",), None),
        (f"Alibi Detect MMDDrift (1000 permutations, {few}+{few} draws)", args.alibi, "alibi_mmd.py", ("1000",), few),
        ("Evidently embedding drift (model(), its default)", args.evidently, "evidently_embeddings.py", ("model",),
         None),
        ("Evidently embedding drift (mmd())", args.evidently, "evidently_embeddings.py", ("mmd",), None),
    ]  # fmt: skip
    for label, python, script, extra, per_class in runs:
        if not Path(python).exists():
            side[label] = f"not run: {python} missing"
            continue
        got = baseline(python, script, path, *extra, per_class=per_class)
        side[label] = got if isinstance(got, str) else summarize(got, truth)
        print("(c)", label, json.dumps(side[label]), flush=True)
    report["side_by_side"] = side
    (OUT / "drift_benchmark.json").write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
