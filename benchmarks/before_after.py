"""Run one benchmark on two versions of the code, alternated in rounds inside one run.

    git worktree add /tmp/before <commit>     # or any checkout of the other version
    .venv/bin/python benchmarks/before_after.py --before /tmp/before --rounds 5 \\
        --metric 'sampling 0%\\s+(\\d+)' -- benchmarks/sdk_overhead.py --calls 20000 --rounds 5

Each round runs the benchmark once per side, in alternating order (before first in odd
rounds, after first in even ones), so that a machine whose load drifts during the run
biases neither side. The "before" side runs the checkout's own copy of the script with
`infersight` imported from that checkout (a namespace directory of links on PYTHONPATH,
ahead of this venv's editable install); the "after" side runs this tree's. Each
`--metric` is a regular expression whose first group is a number in the benchmark's
output; the script prints every round's values, the median per side, and after/before.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("engine", "collectors", "monitor", "alerts", "dashboards")


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def _namespace(before: Path, into: Path) -> Path:
    """A directory whose `infersight/<package>` links to the other checkout's packages."""
    ns = into / "infersight"
    ns.mkdir()
    for package in PACKAGES:
        (ns / package).symlink_to(before / package, target_is_directory=True)
    return into


def _run(script: Path, args: list[str], cwd: Path, pythonpath: Path | None) -> str:
    env = dict(os.environ)
    if pythonpath is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(pythonpath), env.get("PYTHONPATH")]))
    done = subprocess.run(
        [sys.executable, str(script), *args], cwd=cwd, env=env, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise SystemExit(f"{script} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return done.stdout


def _values(patterns: list[re.Pattern[str]], text: str) -> list[float | None]:
    out: list[float | None] = []
    for pattern in patterns:
        found = pattern.search(text)
        out.append(float(found.group(1)) if found else None)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--before", type=Path, required=True, help="a checkout of the other version")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--metric", action="append", default=[], help="regex; group 1 is the number")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- SCRIPT [ARGS...]")
    opts = parser.parse_args()
    command = opts.command[1:] if opts.command[:1] == ["--"] else opts.command
    if not command:
        parser.error("give the benchmark after --: -- benchmarks/x.py [args]")
    script, args = Path(command[0]), command[1:]
    before = opts.before.resolve()
    if not (before / script).is_file():
        parser.error(f"{before / script} does not exist: is --before a checkout of the project?")
    patterns = [re.compile(m) for m in opts.metric]
    print(f"{_cpu_model()}, {os.cpu_count()} logical CPUs; python {platform.python_version()}")
    print(f"benchmark: {' '.join(command)}; {opts.rounds} rounds, sides alternated")
    seen: dict[str, list[list[float | None]]] = {"before": [], "after": []}
    with tempfile.TemporaryDirectory() as tmp:
        path = _namespace(before, Path(tmp))
        sides = {"before": (before / script, before, path), "after": (ROOT / script, ROOT, None)}
        for r in range(opts.rounds):
            order = ("before", "after") if r % 2 == 0 else ("after", "before")
            for side in order:
                file, cwd, pythonpath = sides[side]
                text = _run(file, args, cwd, pythonpath)
                values = _values(patterns, text)
                seen[side].append(values)
                shown = ", ".join("-" if v is None else f"{v:g}" for v in values) if patterns else "ok"
                print(f"round {r + 1} {side:6s}: {shown}")
                if not patterns:
                    print(text)
    for i, pattern in enumerate(patterns):
        medians = {}
        for side in ("before", "after"):
            column = [row[i] for row in seen[side] if row[i] is not None]
            medians[side] = statistics.median(column) if column else float("nan")
        ratio = medians["after"] / medians["before"] if medians["before"] else float("nan")
        print(f"{pattern.pattern!r}: median before {medians['before']:g}, after {medians['after']:g}, "
              f"after/before {ratio:.3f}")  # fmt: skip


if __name__ == "__main__":
    main()
