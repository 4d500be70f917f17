"""The SDK's public surface, and the promise that nothing lands in prometheus_client's global REGISTRY."""

from __future__ import annotations

import ast
import inspect
import subprocess
import sys
import textwrap
from pathlib import Path

import infersight.monitor as monitor
import infersight.monitor.sdk as sdk
from infersight.monitor.sdk import _config


def test_all_lists_every_public_name() -> None:
    public = {n for n in vars(sdk) if not n.startswith("_") and not inspect.ismodule(getattr(sdk, n))}
    public -= {"annotations"}
    assert set(sdk.__all__) == public


def test_monitor_package_exports_the_decorator_lazily() -> None:
    for name in ("track", "Monitor", "configure", "default_monitor"):
        assert name in monitor.__all__
        assert getattr(monitor, name) is getattr(sdk, name)


def test_every_exception_is_exported_and_drawn_in_the_tree() -> None:
    exceptions = {n for n, v in vars(_config).items() if inspect.isclass(v) and issubclass(v, Exception)}
    assert exceptions == {"SDKError", "SDKConfigError", "SinkError", "SinkRejected", "SinkUnavailable"}
    for name in exceptions:
        assert issubclass(getattr(sdk, name), sdk.SDKError)
        assert f"{name} " in (_config.__doc__ or "")


def test_importing_and_using_everything_leaves_the_global_registry_untouched() -> None:
    code = textwrap.dedent(
        """
        import asyncio
        from prometheus_client import REGISTRY
        before = sorted(m.name for m in REGISTRY.collect())
        import infersight.monitor
        from infersight.monitor import track, Monitor, configure, default_monitor
        from infersight.collectors import (
            EngineAdapter, GPUCollector, InferenceStats, ProcessCollector, serve_metrics,
        )
        from infersight.collectors.fake_nvml import FakeNVML
        configure(sink=lambda records: None, sample_rate=1.0)

        @track(model="m")
        def f(prompt):
            return prompt

        @track(model="m")
        async def g(prompt):
            return prompt

        f("x"); asyncio.run(g("y"))
        with track(model="m") as call:
            call.token()
        Monitor().track(model="other")(f)("z")
        GPUCollector(nvml=FakeNVML()).sample_once(); GPUCollector()
        ProcessCollector().sample_once()
        EngineAdapter(InferenceStats(), model="m")
        default_monitor().flush(2)
        server = serve_metrics(default_monitor().registry)
        server.close()
        after = sorted(m.name for m in REGISTRY.collect())
        assert before == after, (before, after)
        assert "torch" not in __import__("sys").modules
        print("untouched")
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "untouched"


def test_importing_infersight_monitor_loads_neither_prometheus_nor_torch() -> None:
    code = "import sys, infersight.monitor; print(sorted({'prometheus_client', 'torch', 'numpy'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "[]"


def _sdk_imports() -> dict[str, set[str]]:
    """module -> the SDK modules it imports (relative imports, TYPE_CHECKING ones included)."""
    folder = Path(sdk.__file__).parent
    graph: dict[str, set[str]] = {}
    for path in folder.glob("*.py"):
        deps = graph.setdefault(path.stem, set())
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                deps.update([node.module] if node.module else [a.name for a in node.names])
    return graph


def test_sdk_modules_import_each_other_without_cycles() -> None:
    graph = _sdk_imports()
    assert {"_tracker", "_monitor"} <= set(graph)
    done: set[str] = set()

    def visit(module: str, path: tuple[str, ...]) -> None:
        assert module not in path, f"import cycle: {' -> '.join((*path, module))}"
        if module in done:
            return
        for dep in graph.get(module, ()):
            visit(dep, (*path, module))
        done.add(module)

    for module in graph:
        visit(module, ())
    assert "_monitor" not in graph["_tracker"]  # the tracker sees its monitor through a protocol
