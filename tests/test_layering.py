"""The import graph of infersight: no cycles, and packages depend only in the directions
docs/architecture.md allows.

Read from the source with `ast` (nothing is imported). Every import counts, for cycles
and for directions: module-level ones, those under `if TYPE_CHECKING:` (the house rule:
no cycles, not even for type hints), and those inside functions (a lazy import that
breaks a cycle at run time still ties the two modules into one concept). The graph of
module-level imports alone is kept too (`GRAPH[m][0]`); it is a subgraph, so it has no
cycle the full graph lacks.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("engine", "collectors", "monitor", "alerts", "dashboards")

# Who may import whom, by area (the longest matching prefix of a module's name). An
# allowed target is a module or package prefix: "engine.events" allows that module only.
# The service and the CLI compose everything and may import any area.
ALLOWED: dict[str, set[str]] = {
    "engine": set(),
    # the outcome vocabulary maps the engine's error classes (torch-free) once
    "monitor.outcomes": {"engine.errors"},
    "monitor.records": {"monitor.outcomes"},
    "monitor.redaction": set(),  # credentials and query strings out of logs and errors (stdlib)
    "monitor.extras": set(),  # which extra each part needs: every package's __init__ asks it
    "monitor.store": {"monitor.extras", "monitor.records"},  # the writer stores InferenceRecords
    "monitor.data": set(),
    "dashboards": {"monitor.extras", "monitor.redaction"},
    "collectors": {"monitor.records", "monitor.outcomes", "engine.events"},
    "monitor.sdk": {"monitor.records", "monitor.redaction", "collectors"},
    "monitor": {"monitor.sdk"},  # monitor/__init__ re-exports the SDK
    # drift's OpenVINO int8 embedder is calibrated on Banking77 train texts (monitor.data: texts only)
    "monitor.drift": {"monitor.store", "monitor.extras", "monitor.data"},
    "monitor.dataset": {"monitor.store", "monitor.sdk", "monitor.extras"},
    # feedback, satisfaction, the environment record and the slowdown checklist
    "monitor.business": {"monitor.store", "monitor.redaction", "monitor.drift", "monitor.extras"},
    # alerts reads collectors' DURATION_BUCKETS: an SLO's latency threshold must be a
    # bucket bound of the histogram Prometheus computes it from (alerts/rules/config.py)
    "alerts": {
        "monitor.store",
        "monitor.records",
        "monitor.outcomes",
        "monitor.redaction",
        "collectors",
        "monitor.extras",
    },
}
COMPOSERS = ("monitor.service", "monitor.cli")
AREAS = sorted([*ALLOWED, *COMPOSERS], key=len, reverse=True)

# Cycles that are open work in packages being restructured (issue 12): each entry is the set
# of modules one cycle may span today (none is open now). A cycle outside these, or one that
# grows past its entry, fails the test. Remove an entry when its cycle is gone.
OPEN_CYCLES: dict[str, set[str]] = {}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))}


MODULES = _modules()


def _target(name: str) -> str | None:
    """The module of ours an imported dotted name lands in (a name inside a module: the module)."""
    if not name.startswith("infersight."):
        return None
    name = name.removeprefix("infersight.")
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _imports(module: str, path: Path) -> tuple[set[str], set[str]]:
    """(module-level targets, all targets) of one module's imports of our modules."""
    tree = ast.parse(path.read_text(), str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    top: set[str] = set()
    every: set[str] = set()

    def names(node: ast.Import | ast.ImportFrom) -> list[str]:
        if isinstance(node, ast.Import):
            return [a.name for a in node.names]
        if node.level:
            base = package.split(".")
            base = base[: len(base) - (node.level - 1)]
            source = "infersight." + ".".join(base + ([node.module] if node.module else []))
        else:
            source = node.module or ""
        return [f"{source}.{a.name}" for a in node.names]

    def visit(nodes: list[ast.stmt], at_top: bool) -> None:
        for node in nodes:
            if isinstance(node, ast.Import | ast.ImportFrom):
                for name in names(node):
                    target = _target(name)
                    if target is not None and target != module:
                        every.add(target)
                        if at_top:
                            top.add(target)
                continue
            inner = isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
            for field in ("body", "orelse", "finalbody", "handlers"):
                child = getattr(node, field, None)
                if isinstance(child, list):
                    visit(child, at_top and not inner)
            for case in getattr(node, "cases", []):
                visit(case.body, at_top and not inner)

    visit(tree.body, True)
    return top, every


GRAPH = {m: _imports(m, p) for m, p in MODULES.items()}


def _area(module: str) -> str:
    for area in AREAS:
        if module == area or module.startswith(area + "."):
            return area
    raise AssertionError(f"{module} belongs to no area of the layering table")


def _cycles() -> list[set[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []
    counter = 0
    for root in sorted(GRAPH):
        if root in index:
            continue
        work = [(root, iter(sorted(GRAPH[root][1])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(GRAPH[child][1]))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.add(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(component)
    return found


def test_every_module_belongs_to_an_area_of_the_layering_table() -> None:
    assert len(MODULES) > 50
    for module in MODULES:
        _area(module)


def test_no_import_cycles_outside_the_named_open_work() -> None:
    unexplained = []
    for cycle in _cycles():
        if not any(cycle <= allowed for allowed in OPEN_CYCLES.values()):
            unexplained.append(sorted(cycle))
    assert not unexplained, f"import cycles: {unexplained}"


def test_alerts_collectors_drift_and_store_have_no_cycles_even_through_lazy_imports() -> None:
    mine = ("alerts", "collectors", "monitor.drift", "monitor.store", "monitor.records", "monitor.outcomes",
            "dashboards")  # fmt: skip
    for cycle in _cycles():
        assert not any(m.startswith(mine) for m in cycle), sorted(cycle)


def test_packages_import_only_in_the_allowed_directions() -> None:
    wrong = []
    for module, (_top, every) in sorted(GRAPH.items()):
        area = _area(module)
        if area in COMPOSERS:
            continue
        for target in sorted(every):
            there = _area(target)
            if there == area:
                continue
            if not any(target == ok or target.startswith(ok + ".") for ok in ALLOWED[area]):
                wrong.append(f"{module} -> {target}")
    assert not wrong, "imports against the layering of docs/architecture.md:\n" + "\n".join(wrong)


def test_the_checker_sees_a_cycle_and_a_wrong_direction() -> None:
    """The graph is read as Python runs it: relative imports, `from package import module`."""
    top, every = GRAPH["alerts.notify.routing"]
    assert {"alerts.notify.matchers", "alerts.lifecycle", "monitor.store.tables"} <= top <= every
    assert "alerts.inbound" in GRAPH["alerts.inbound_router"][0]
    saved = GRAPH["monitor.store.tables"]
    try:  # the cycle between the store and alerts, put back
        GRAPH["monitor.store.tables"] = (set(), {"alerts.lifecycle"})
        assert any({"monitor.store.tables", "alerts.lifecycle"} <= c for c in _cycles())
    finally:
        GRAPH["monitor.store.tables"] = saved
