"""Drift calibration conditional on the reference in use, power, and cost.

    .venv/bin/python benchmarks/drift_calibration.py [--references 20] [--null 100]
        [--drifted 20] [--ref-size 1000] [--window 300] [--cost-rounds 3] [--skip-cost]
        [--embedder fp32|int8|openvino]

A team keeps one reference and compares every window with it, so what matters is the
false-alarm rate *given* that reference (and the detector's seed), not its average over
references. On Banking77 (all distinct train and test texts, each embedded once with
all-MiniLM-L6-v2 and kept in `.bench/`):

(a) `--references` references of `--ref-size` texts, each with `--null` windows of
    `--window` other Banking77 texts and `--doubled` windows with one home intent twice as
    likely: per reference, the share of windows on which each test (MMD, the novelty scan
    on prompts; their Holm verdict) flags drift, the verdict before (the scan calibrated
    on a held-out half, Holm with equal shares) and after (the scan calibrated by jackknife
    on the whole reference, weighted Holm: today's default) on the same windows, which
    side runs first alternating window by window; with each side's reported smallest
    detectable share.
(b) Relevance drop on the same references: a request's "response" is another Banking77 text
    of the same intent (a related answer), so relevance is a real cosine with a real spread;
    the new reference-conditional rank test against the plain Mann-Whitney test before it.
(c) Streaming: per reference, the novelty chart's mean run length between false alarms on
    in-control streams resampled from the texts the reference never saw, against its
    target: today's chart (jackknife scores), the chart on a held-out half's scores
    ("split") and the older chart (cross-fitted tail, designed for the empirical rate).
(d) Power: `--drifted` windows per reference with 5%, 10% and 20% NLU++ hotel utterances.
(e) Cost of one evaluation of `--ref-size` against `--window` texts, this tree against the
    tree before that change (`git archive` of `--old-commit` in build/old_tree), alternated in
    fresh processes: encoding excluded (embedded windows) and included (a cold embedder).

`--embedder int8` runs (a)-(d) on embeddings of the int8 ONNX Runtime export, `--embedder
openvino` on those of the int8 OpenVINO one (`default_embedder()` runs the faster of the two
here), instead of the fp32 model's (the tables must agree within noise).

Results go to stdout (markdown) and .bench/drift_calibration.json (`_int8.json`, `_openvino.json` for the others).
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _corpus import EMBEDDERS, OUT, Corpus, load_corpus

ROOT = Path(__file__).resolve().parents[1]
ALPHA = 0.05


def cpu_model() -> str:
    info = Path("/proc/cpuinfo")
    if info.exists():
        for line in info.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


# --- (a), (d): batch tests, before and after, on the same windows ---------------------


# before: MMD + the novelty scan on a held-out half, Holm with equal shares (the tree at
# --old-commit's default); after: MMD + the scan with jackknife calibration, weighted Holm
# (today's default).
SIDES = ("before", "after")


def side_configs(permutations: int) -> dict[str, Any]:
    from dataclasses import replace

    from infersight.monitor.drift import DetectorConfig, TestOptions

    after = DetectorConfig(alpha=ALPHA, options=TestOptions(permutations=permutations))
    before = replace(
        after,
        options=replace(after.options, novelty_calibration="split"),
        test_weights={"mmd": 1.0, "novelty": 1.0},
    )
    return {"before": before, "after": after}


def _verdicts(mmd: Any, novelty: dict[str, Any], configs: dict[str, Any]) -> dict[str, bool]:
    """Per side, its Holm over MMD and that side's novelty scan, effect floors applied."""
    from infersight.monitor.drift._stat_tests import holm_adjust

    out = {}
    for side in SIDES:
        config, nov = configs[side], novelty[side]
        adj = holm_adjust([mmd.p_value, nov.p_value], [config.weight("mmd"), config.weight(nov.test)])
        m = adj[0] < ALPHA and mmd.score >= config.floor("mmd")
        n = adj[1] < ALPHA and nov.score >= config.floor(nov.test)
        out[f"verdict_{side}"] = bool(m or n)
        out[f"novelty_{side}"] = bool(n)
        out[f"mmd_{side}"] = bool(m)
    return out


def _window_flags(
    ref_rows: np.ndarray, calibrations: dict[str, Any], cur: np.ndarray, configs: dict[str, Any], turn: int
) -> dict[str, bool]:
    """Both sides on one window (one MMD test, shared); which side runs first alternates with `turn`."""
    from infersight.monitor.drift._mmd import mmd_test
    from infersight.monitor.drift._novelty import scan_splits

    mmd = mmd_test(ref_rows, cur, configs["after"].options)
    order = SIDES if turn % 2 == 0 else SIDES[::-1]
    novelty = {side: scan_splits(calibrations[side], cur) for side in order}
    return _verdicts(mmd, novelty, configs)


def _doubled(rng: np.random.Generator, rest: np.ndarray, labels: np.ndarray, size: int) -> np.ndarray:
    """`size` rows of `rest` with one home intent (drawn per window) twice as likely as the others."""
    intent = rng.choice(np.unique(labels[rest]))
    weight = np.where(labels[rest] == intent, 2.0, 1.0)
    return rng.choice(rest, size, replace=False, p=weight / weight.sum())


def batch(corpus: Corpus, args: argparse.Namespace) -> dict[str, Any]:
    from infersight.monitor.drift._detector import detectable_share_for
    from infersight.monitor.drift._novelty import fit_splits

    configs = side_configs(args.permutations)
    home = _home_rows(corpus, args.home)
    labels = _labels(corpus)
    per_ref: list[dict[str, Any]] = []
    seconds = []
    wanted = set(args.only_references) if args.only_references else None
    for r in range(args.references):
        rng = np.random.default_rng(1000 + r)
        order = home[rng.permutation(home.size)]
        if wanted is not None and r not in wanted:
            continue
        ref_idx, rest = order[: args.ref_size], order[args.ref_size :]
        ref_rows = corpus.banking[ref_idx]
        calibrations = {side: fit_splits(ref_rows, configs[side].options) for side in SIDES}
        shares = {
            side: detectable_share_for(ref_rows, args.window, ("mmd", "novelty"), configs[side])
            for side in SIDES
        }
        row: dict[str, Any] = {"reference": r, "detectable_share": shares}
        counts: dict[str, list[int]] = {}
        turn = 0
        start = time.perf_counter()
        arms: list[tuple[str, int, Any]] = [("null", args.null, None), ("doubled", args.doubled, None)]
        arms += [(f"share {s:g}", args.drifted, s) for s in args.shares]
        for arm, windows, s in arms:
            for _ in range(windows):
                if arm == "null":
                    cur = corpus.banking[rng.choice(rest, args.window, replace=False)]
                elif arm == "doubled":
                    cur = corpus.banking[_doubled(rng, rest, labels, args.window)]
                else:
                    n_new = round(args.window * s)
                    cur = np.concatenate(
                        [
                            corpus.banking[rng.choice(rest, args.window - n_new, replace=False)],
                            corpus.hotels[rng.choice(len(corpus.hotel_texts), n_new, replace=False)],
                        ]
                    )
                for name, flag in _window_flags(ref_rows, calibrations, cur, configs, turn).items():
                    c = counts.setdefault(f"{arm}|{name}", [0, 0])
                    c[0] += int(flag)
                    c[1] += 1
                turn += 1
        seconds.append((time.perf_counter() - start) / max(turn, 1))
        row["counts"] = counts
        per_ref.append(row)
        null_b = counts.get("null|verdict_before", [0, 0])
        null_a = counts.get("null|verdict_after", [0, 0])
        p5b = counts.get("share 0.05|verdict_before", [0, 1])
        p5 = counts.get("share 0.05|verdict_after", [0, 1])
        print(
            f"reference {r}: null {null_b[0]}/{null_b[1]} -> {null_a[0]}/{null_a[1]}, "
            f"5% {p5b[0]}/{p5b[1]} -> {p5[0]}/{p5[1]}, detectable share {shares['before']} -> {shares['after']}",
            flush=True,
        )
    return {"per_reference": per_ref, "seconds_per_window": statistics.median(seconds)}


def _home_rows(corpus: Corpus, home: str) -> np.ndarray:
    """Indices of the home pool: every Banking77 text, or only the test split's (texts the
    int8 OpenVINO export was not calibrated on: its calibration set is the train split)."""
    if home == "all":
        return np.arange(len(corpus.banking_texts))
    from infersight.monitor.data import banking77

    test = {u.text for u in banking77("test")} - {u.text for u in banking77("train")}
    return np.asarray([i for i, t in enumerate(corpus.banking_texts) if t in test])


def _labels(corpus: Corpus) -> np.ndarray:
    from infersight.monitor.data import banking77

    label: dict[str, str] = {}
    for u in banking77("train") + banking77("test"):
        label.setdefault(u.text, u.label)
    return np.asarray([label[t] for t in corpus.banking_texts])


def old_relevance_p(reference: np.ndarray, current: np.ndarray) -> float:
    from scipy.stats import mannwhitneyu

    return float(mannwhitneyu(reference, current, alternative="greater", method="auto")[1])


# --- (b) relevance ----------------------------------------------------------------------


def relevance_calibration(corpus: Corpus, args: argparse.Namespace) -> dict[str, list[float]]:
    from infersight.monitor.data import banking77
    from infersight.monitor.drift import TestOptions
    from infersight.monitor.drift._stat_tests import relevance_drop_test

    label = {}
    for u in banking77("train") + banking77("test"):
        label.setdefault(u.text, u.label)
    index = {t: i for i, t in enumerate(corpus.banking_texts)}
    by_label: dict[str, list[int]] = {}
    for t, lab in label.items():
        by_label.setdefault(lab, []).append(index[t])
    rng = np.random.default_rng(7)
    answer = np.empty(len(corpus.banking_texts), dtype=np.int64)
    for members in by_label.values():
        arr = np.asarray(members)
        answer[arr] = np.roll(rng.permutation(arr), 1)  # another text of the same intent
    rel = np.einsum("ij,ij->i", corpus.banking, corpus.banking[answer])  # [N]
    options = TestOptions()
    out: dict[str, list[float]] = {"relevance": [], "relevance_before": []}
    for r in range(args.references):
        rng = np.random.default_rng(2000 + r)
        order = rng.permutation(rel.size)
        ref, rest = rel[order[: args.ref_size]], order[args.ref_size :]
        new = old = 0
        for _ in range(args.null):
            cur = rel[rng.choice(rest, args.window, replace=False)]
            result = relevance_drop_test(ref, cur, options)
            # alone at alpha (the strictest case: in a report it shares alpha through Holm)
            new += result.p_value < ALPHA
            old += old_relevance_p(ref, cur) < ALPHA
        out["relevance"].append(new / args.null)
        out["relevance_before"].append(old / args.null)
    return out


# --- (c) streaming ----------------------------------------------------------------------


def streaming(corpus: Corpus, args: argparse.Namespace) -> dict[str, Any]:
    from dataclasses import replace

    from infersight.monitor.drift import TestOptions
    from infersight.monitor.drift._novelty import fit_novelty
    from infersight.monitor.drift._stat_tests import nearest, split_reference
    from infersight.monitor.drift._streaming import _simulate, design_cusum

    target = args.target_arl
    options = TestOptions()
    out: dict[str, Any] = {"target": target, "now": [], "split": [], "before": []}
    split_options = replace(options, novelty_calibration="split")
    for r in range(args.references):
        rng = np.random.default_rng(3000 + r)
        order = rng.permutation(len(corpus.banking_texts))
        rows = corpus.banking[order[: args.ref_size]]
        unseen = corpus.banking[order[args.ref_size :]]
        now = fit_novelty(rows, options)  # the chart's per-item scores are the batch scan's
        split = fit_novelty(rows, split_options)
        bank_rows, cal_rows = split_reference(rows.shape[0], options.calibration_fraction, seed=options.seed)
        # per chart: its design and the unseen texts' scores as that chart computes them
        designs = {
            "now": (
                design_cusum(
                    now.calibration,
                    target_arl=target,
                    seed=options.seed,
                    reference_confidence=options.reference_confidence,
                ),
                now.score(unseen),
            ),
            "split": (
                design_cusum(
                    split.calibration,
                    target_arl=target,
                    seed=options.seed,
                    reference_confidence=options.reference_confidence,
                ),
                split.score(unseen),
            ),
            "before": (
                design_cusum(
                    np.concatenate(
                        [
                            nearest(rows[cal_rows], rows[bank_rows])[0],
                            nearest(rows[bank_rows], rows[cal_rows])[0],
                        ]
                    ),
                    target_arl=target,
                    seed=options.seed,
                ),
                split.score(unseen),
            ),
        }
        for name, (d, unseen_scores) in designs.items():
            bits = unseen_scores > d.cut

            def draw(g: np.random.Generator, shape: tuple[int, int], bits: np.ndarray = bits) -> np.ndarray:
                return bits[g.integers(0, bits.size, size=shape)]

            streams, steps = 128, int(40 * target)
            alarms = int(
                _simulate(draw, d.up, d.down, np.asarray([d.threshold]), streams, steps, 4000 + r)[0]
            )
            out[name].append(streams * steps / max(alarms, 1))
    return out


# --- (e) cost ---------------------------------------------------------------------------


def cost_once(ref_size: int, window: int, embedder_kind: str) -> dict[str, float]:
    """One process's timings of a `ref_size` vs `window` evaluation (printed as JSON)."""
    from infersight.monitor.drift import DriftDetector, TextWindow, default_embedder
    from infersight.monitor.drift._windows import EmbeddedWindow

    corpus = load_corpus(embedder_kind)  # the cached embeddings: the texts are only picked here
    rng = np.random.default_rng(5)
    order = rng.permutation(len(corpus.banking_texts))
    ref_idx, cur_idx = order[:ref_size], order[ref_size : ref_size + window]
    detector = DriftDetector(default_embedder(cache_entries=0))  # the shipped embedder, no cache
    ref_e = EmbeddedWindow.from_arrays(corpus.banking[ref_idx])
    cur_e = EmbeddedWindow.from_arrays(corpus.banking[cur_idx])
    detector.score(ref_e, cur_e)  # warm: imports, scipy, BLAS threads
    excluded = []
    for _ in range(3):
        start = time.perf_counter()
        detector.score(ref_e, cur_e)
        excluded.append(time.perf_counter() - start)
    ref_t = TextWindow.of([corpus.banking_texts[i] for i in ref_idx])
    cur_t = TextWindow.of([corpus.banking_texts[i] for i in cur_idx])
    detector.embedder.encode(["warm the model up"])
    start = time.perf_counter()
    detector.score(ref_t, cur_t)  # no cache: every text encoded once
    included = time.perf_counter() - start
    return {"excluded": statistics.median(excluded), "included": included}


def cost(args: argparse.Namespace) -> dict[str, Any]:
    old_tree = ROOT / "build" / "old_tree"
    if not (old_tree / "infersight" / "monitor").exists():
        (old_tree / "infersight").mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(
            [
                "git",
                "-C",
                str(ROOT),
                "archive",
                args.old_commit,
                "monitor",
                "engine",
                "collectors",
                "alerts",
                "dashboards",
            ],
            check=True,
            capture_output=True,
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(old_tree)], input=archive, check=True)
        for d in ("monitor", "engine", "collectors", "alerts", "dashboards"):
            (old_tree / "infersight" / d).symlink_to(old_tree / d)
    script = [
        sys.executable,
        __file__,
        "--cost-once",
        "--ref-size",
        str(args.ref_size),
        "--window",
        str(args.window),
        "--embedder",
        args.embedder,
    ]
    runs: dict[str, list[dict[str, float]]] = {"before": [], "now": []}
    for _ in range(args.cost_rounds):
        for name in ("before", "now"):
            env = dict(os.environ)
            if name == "before":
                env["PYTHONPATH"] = str(old_tree)
            done = subprocess.run(script, env=env, check=True, capture_output=True, text=True)
            runs[name].append(json.loads(done.stdout.strip().splitlines()[-1]))
    med = {
        name: {k: statistics.median(r[k] for r in rs) for k in ("excluded", "included")}
        for name, rs in runs.items()
    }
    return {"runs": runs, "median": med}


# --- output -----------------------------------------------------------------------------


def dist(values: list[float]) -> str:
    v = np.asarray(values)
    return (
        f"{v.min():.2f} | {np.median(v):.2f} | {np.quantile(v, 0.9):.2f} | {v.max():.2f} | "
        f"{int(np.sum(v <= ALPHA))}/{v.size} | {int(np.sum(v > 2 * ALPHA))}/{v.size}"
    )


def _rate(counts: dict[str, list[int]], key: str) -> float:
    hit, n = counts.get(key, [0, 0])
    return hit / n if n else float("nan")


def _share(value: float | None) -> str:
    return "none" if value is None else f"{100 * value:.1f}%"


def print_batch(b: dict[str, Any], args: argparse.Namespace) -> None:
    refs = b["per_reference"]
    arms = ["null", "doubled"] + [f"share {s:g}" for s in args.shares]
    arms = [
        a for a in arms if f"{a}|verdict_after" in refs[0]["counts"]
    ]  # arms run with no window are left out
    print(
        f"\n(a, d) per reference: the verdict's alarm rate, before -> after "
        f"({args.null} null, {args.doubled} doubled-intent, {args.drifted} windows per share)"
    )
    print("| reference | detectable share | " + " | ".join(arms) + " |")
    print("|---|---|" + "---|" * len(arms))
    for row in refs:
        share = row["detectable_share"]
        cells = [
            f"{_rate(row['counts'], f'{a}|verdict_before'):.2f} -> {_rate(row['counts'], f'{a}|verdict_after'):.2f}"
            for a in arms
        ]
        shown = f"{_share(share['before'])} -> {_share(share['after'])}"
        print(f"| {row['reference']} | {shown} | " + " | ".join(cells) + " |")
    print("\n(a, d) over references: pooled, min, p10 | refs at or under alpha, over 2 alpha (null)")
    print(
        "| arm | test | pooled | min | p10 | max | refs <= alpha | refs > 2 alpha |\n|---|---|---|---|---|---|---|---|"
    )
    names = [f"{t}_{side}" for t in ("verdict", "novelty", "mmd") for side in SIDES]
    for a in arms:
        for name in names:
            v = np.asarray([_rate(r["counts"], f"{a}|{name}") for r in refs])
            hit = sum(r["counts"].get(f"{a}|{name}", [0, 0])[0] for r in refs)
            n = sum(r["counts"].get(f"{a}|{name}", [0, 0])[1] for r in refs)
            if n == 0:
                continue
            print(
                f"| {a} | {name} | {hit}/{n} ({hit / n:.3f}) | {v.min():.2f} | {np.quantile(v, 0.1):.2f} | "
                f"{v.max():.2f} | {int(np.sum(v <= ALPHA))}/{v.size} | {int(np.sum(v > 2 * ALPHA))}/{v.size} |"
            )
    for side in SIDES:
        shares = [r["detectable_share"][side] for r in refs if r["detectable_share"][side] is not None]
        if shares:
            print(
                f"detectable share {side} (reported, window {args.window}): min {100 * min(shares):.1f}%, "
                f"median {100 * statistics.median(shares):.1f}%, max {100 * max(shares):.1f}%"
            )
    print(f"median seconds per window (MMD and both scans): {b['seconds_per_window']:.3f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--references", type=int, default=20)
    ap.add_argument("--null", type=int, default=100)
    ap.add_argument("--drifted", type=int, default=20)
    ap.add_argument(
        "--doubled", type=int, default=20, help="windows per reference with one home intent doubled"
    )
    ap.add_argument(
        "--permutations", type=int, default=1000, help="of the MMD test (its p-value's resolution)"
    )
    ap.add_argument(
        "--home",
        choices=["all", "test"],
        default="all",
        help="home texts: all of Banking77, or its test split only",
    )
    ap.add_argument("--shares", type=float, nargs="+", default=[0.05, 0.1, 0.2])
    ap.add_argument(
        "--only-references",
        type=int,
        nargs="+",
        help="run only these of the --references references (same seeds and windows as in a full run)",
    )
    ap.add_argument("--ref-size", type=int, default=1000)
    ap.add_argument("--window", type=int, default=300)
    ap.add_argument("--target-arl", type=float, default=500.0)
    ap.add_argument("--cost-rounds", type=int, default=3)
    ap.add_argument("--old-commit", default="29b2153")
    ap.add_argument("--skip-cost", action="store_true")
    ap.add_argument("--embedder", choices=EMBEDDERS, default="fp32", help="whose embeddings (a)-(d) use")
    ap.add_argument("--only", choices=["batch", "relevance", "streaming", "cost"], nargs="*")
    ap.add_argument("--cost-once", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.cost_once:
        print(json.dumps(cost_once(args.ref_size, args.window, args.embedder)))
        return
    only = set(args.only or ["batch", "relevance", "streaming", "cost"])
    if args.skip_cost:
        only.discard("cost")
    result: dict[str, Any] = {"cpu": cpu_model(), "cores": os.cpu_count(), "args": vars(args)}
    print(f"CPU: {result['cpu']} ({result['cores']} cores), load average {os.getloadavg()[0]:.1f}")
    corpus = load_corpus(args.embedder)
    print(
        f"Banking77: {len(corpus.banking_texts)} distinct texts; hotels: {len(corpus.hotel_texts)}; "
        f"embedded by the {args.embedder} model"
    )
    header = "| | min | median | p90 | max | refs at or under alpha | refs over 2·alpha |\n|---|---|---|---|---|---|---|"
    if "batch" in only:
        b = batch(corpus, args)
        result["batch"] = b
        print_batch(b, args)
    if "relevance" in only:
        rel = relevance_calibration(corpus, args)
        result["relevance"] = rel
        print("\n(b) relevance drop alone at alpha, per reference")
        print(header)
        for name, values in rel.items():
            print(f"| {name} | {dist(values)} |")
    if "streaming" in only:
        s = streaming(corpus, args)
        result["streaming"] = s
        print(
            f"\n(c) novelty chart: mean run length between false alarms per reference (target {s['target']:g})"
        )
        print("| | min | median | p10 | max | refs at or over target |\n|---|---|---|---|---|---|")
        for name in ("now", "split", "before"):
            v = np.asarray(s[name])
            print(
                f"| {name} | {v.min():.0f} | {np.median(v):.0f} | {np.quantile(v, 0.1):.0f} | {v.max():.0f} | "
                f"{int(np.sum(v >= s['target']))}/{v.size} |"
            )
    if "cost" in only:
        c = cost(args)
        result["cost"] = c
        m = c["median"]
        print(
            f"\n(e) cost of one evaluation, {args.ref_size} vs {args.window} texts (median of {args.cost_rounds} alternated runs)"
        )
        print("| | before | now | ratio |\n|---|---|---|---|")
        for k in ("excluded", "included"):
            print(
                f"| encoding {k} | {m['before'][k]:.2f} s | {m['now'][k]:.2f} s | {m['now'][k] / m['before'][k]:.2f}x |"
            )
    OUT.mkdir(exist_ok=True)
    suffix = "" if args.embedder == "fp32" else f"_{args.embedder}"
    (OUT / f"drift_calibration{suffix}.json").write_text(json.dumps(result, indent=1, default=float))


if __name__ == "__main__":
    main()
