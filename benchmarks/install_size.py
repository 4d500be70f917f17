"""Install size and time: the base install (`pip install infersight`) against `[all]`.

    .venv/bin/python benchmarks/install_size.py [--rounds 2] [--cold]

Builds the wheel once (`python -m build --wheel`), then, in alternating rounds, makes a
fresh venv and times `pip install infersight-*.whl` (base) and `pip install
'infersight-*.whl[all]'` (all). torch is pinned to the Makefile's 2.13.0 for [all], as
`make` installs it, so both sides resolve the same way on a CPU machine. Reported: the
wall time of the pip command, the number of distributions installed and the size of the
venv's site-packages (du, apparent size). Without `--cold`, pip uses its cache (what a
developer or CI with a warm cache sees); with it, `--no-cache-dir` (downloads count too).
"""

from __future__ import annotations

import argparse
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TORCH = "torch==2.13.0"  # the Makefile's pin


def _cpu() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def _size(site: Path) -> int:
    return sum(p.stat().st_size for p in site.rglob("*") if p.is_file() and not p.is_symlink())


def build_wheel(out: Path) -> Path:
    cmd = [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(out), str(ROOT)]
    subprocess.run(cmd, check=True, capture_output=True)
    (wheel,) = out.glob("infersight-*.whl")
    return wheel


def install(side: str, wheel: Path, where: Path, cold: bool) -> tuple[float, int, int]:
    """(seconds, distributions, site-packages bytes) of one fresh install."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True)
    python = where / "bin" / "python"
    target = str(wheel) if side == "base" else f"{wheel}[all]"
    extra = [] if side == "base" else [TORCH]
    cmd = [sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", target, *extra]
    if cold:
        cmd.append("--no-cache-dir")
    start = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True)
    seconds = time.perf_counter() - start
    site = next((where / "lib").glob("python3*/site-packages"))
    dists = len(list(site.glob("*.dist-info")))
    return seconds, dists, _size(site)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--cold", action="store_true", help="pip --no-cache-dir")
    args = parser.parse_args()
    print(f"CPU: {_cpu()}; python {platform.python_version()}; pip cache: {'off' if args.cold else 'on'}")
    results: dict[str, list[tuple[float, int, int]]] = {"base": [], "all": []}
    with tempfile.TemporaryDirectory() as tmp:
        wheel = build_wheel(Path(tmp) / "dist")
        for r in range(args.rounds):
            for side in ("base", "all") if r % 2 == 0 else ("all", "base"):
                got = install(side, wheel, Path(tmp) / f"{side}-{r}", args.cold)
                results[side].append(got)
                print(f"round {r} {side}: {got[0]:.1f} s, {got[1]} distributions, {got[2] / 2**20:.0f} MiB")
    print("\n| install | time (median) | distributions | site-packages |")
    print("|---|---|---|---|")
    for side, runs in results.items():
        t = statistics.median(x[0] for x in runs)
        print(f"| {side} | {t:.1f} s | {runs[0][1]} | {runs[0][2] / 2**20:.0f} MiB |")
    base, full = (statistics.median(x[0] for x in results[s]) for s in ("base", "all"))
    print(
        f"\n[all] / base: time x{full / base:.1f}, size x{results['all'][0][2] / results['base'][0][2]:.1f}"
    )


if __name__ == "__main__":
    main()
