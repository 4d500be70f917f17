"""Every PromQL expression of the dashboard reads only metrics the project exports.

Checked twice: against the metric table of docs/dashboards.md (the contract), and against
the metric families actually registered by the collectors (the probe
builds each collector with its own registry per the contract and reads `registry.collect()`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path

import pytest
from infersight import collectors
from infersight.collectors import fake_nvml as fake
from infersight.dashboards import build_dashboard, metric_names
from infersight.monitor import records
from prometheus_client import CollectorRegistry

ROOT = Path(__file__).resolve().parents[1]
_SUFFIXES = {"histogram": ("_bucket", "_count", "_sum"), "counter": ("",), "gauge": ("",)}


def _documented() -> dict[str, str]:
    """name -> type from the `Metric names (Prometheus)` table, shorthand (`_reserved_bytes`) expanded."""
    text = (ROOT / "docs" / "dashboards.md").read_text()
    section = text.split("## Metric names (Prometheus)", 1)[1].split("\n## ", 1)[0]
    out: dict[str, str] = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 2 or not cells[0].startswith("`"):
            continue
        kind = cells[1].split()[0]
        names = re.findall(r"`([A-Za-z_:][\w:]*)`", cells[0])
        first = names[0]
        for name in names:
            if name.startswith("_"):  # shorthand: replaces as many trailing parts of the first name
                keep = first.split("_")[: -len(name.strip("_").split("_"))]
                name = "_".join(keep) + name
            out[name] = kind
    return out


def _exported(documented: dict[str, str]) -> set[str]:
    return {name + suffix for name, kind in documented.items() for suffix in _SUFFIXES.get(kind, ("",))}


def _dashboard_queries() -> list[tuple[str, str]]:
    dash = build_dashboard()
    out = [(p["title"], t["expr"]) for p in dash["panels"] for t in p.get("targets", [])]
    out += [(f"annotation {a['name']}", a["expr"]) for a in dash["annotations"]["list"] if "expr" in a]
    out += [
        (f"variable {v['name']}", v["definition"]) for v in dash["templating"]["list"] if v["type"] == "query"
    ]
    return out


def _dashboard_metrics() -> set[str]:
    return {name for _, expr in _dashboard_queries() for name in metric_names(expr)}


def test_metric_table_parses_into_the_documented_names() -> None:
    documented = _documented()
    assert documented["gen_ai_server_request_duration_seconds"] == "histogram"
    assert documented["infersight_gpu_memory_reserved_bytes"] == "gauge"
    assert documented["infersight_gpu_power_watts"] == "gauge"
    assert len(documented) > 35


def test_every_dashboard_query_uses_only_documented_metrics() -> None:
    exported = _exported(_documented())
    unknown = {
        (title, name)
        for title, expr in _dashboard_queries()
        for name in metric_names(expr)
        if name not in exported
    }
    assert not unknown, f"dashboard reads metrics the project does not export: {sorted(unknown)}"


def test_dashboard_covers_the_documented_serving_and_gpu_metrics() -> None:
    used = {re.sub(r"_(bucket|count|sum)$", "", n) for n in _dashboard_metrics()}
    wanted = {
        n for n in _documented() if n.startswith(("gen_ai_server_", "infersight_gpu_", "infersight_drift_p"))
    }
    assert wanted - used <= {"infersight_gpu_collector_disabled_info"}, sorted(wanted - used)


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        (
            'histogram_quantile(0.99, sum by (le) (rate(a_bucket{x=~"$v", y="b c"}[$__rate_interval])))',
            {"a_bucket"},
        ),
        ("a == 1 unless (a offset 2m == 1)", {"a"}),
        ("sum(b) or vector(0)", {"b"}),
        ("rate(c_total[5m]) / 1e6 * 2e-9", {"c_total"}),
        ("sum by (reason) (rate(d[1m])) / on (reason) group_left (x) e", {"d", "e"}),
        ('label_values(f{model=~"$model"}, model_version)', {"f"}),
        ("label_values(model)", set()),
        ('g{le="+Inf", name="sum(h)"}', {"g"}),
    ],
)
def test_metric_names_are_parsed_out_of_promql(expr: str, names: set[str]) -> None:
    assert metric_names(expr) == names


# ---- the second check: names present in the collectors' real registries ---------------------------


def _families(registry: CollectorRegistry) -> set[str]:
    """Sample names a registry exports, from its families (labelled metrics with no children count too)."""
    out: set[str] = set()
    for family in registry.collect():
        suffixes = {"histogram": ("_bucket", "_count", "_sum"), "counter": ("_total",), "info": ("_info",)}
        for suffix in suffixes.get(family.type, ("",)):
            out.add(family.name + suffix)
        out.update(sample.name for sample in family.samples)
    return out


def _inference_registry() -> CollectorRegistry:
    registry = CollectorRegistry()
    stats = collectors.InferenceStats(registry)
    stats.observe(
        records.InferenceRecord(
            request_id="r1",
            model="m",
            model_version="v1",
            started_at=1.7e9,
            duration_s=0.2,
            ttft_s=0.05,
            tpot_s=0.01,
            queue_s=0.001,
            prompt_tokens=12,
            output_tokens=30,
        )
    )
    stats.observe(
        records.InferenceRecord(
            request_id="r2",
            model="m",
            model_version="v1",
            started_at=1.7e9,
            duration_s=0.1,
            error_type="Timeout",
        )
    )
    stats.observe(
        records.InferenceRecord(
            request_id="r3",
            model="m",
            model_version="v1",
            started_at=1.7e9,
            duration_s=0.05,
            error_type="cancelled",
        )
    )
    return registry


def _gpu_registry() -> CollectorRegistry:
    """GPUCollector over the collectors' fake NVML (a GPM device and a pre-Hopper one, for the fallback)."""
    registry = CollectorRegistry()
    now = [100.0]
    nvml = fake.FakeNVML(
        [fake.FakeDevice(processes={os.getpid(): 1 << 30}), fake.FakeDevice(uuid="GPU-2", gpm=False)]
    )
    nvml.devices[1].fail["nvmlDeviceGetPowerUsage"] = fake.pynvml.NVML_ERROR_UNKNOWN  # counted, by function
    gpu = collectors.GPUCollector(registry, nvml=nvml, clock=lambda: now[0])
    for _ in range(3):  # GPM metrics need two samples; slopes need a trend
        gpu.sample_once()
        now[0] += 1.0
    return registry


def _process_registry() -> CollectorRegistry:
    registry = CollectorRegistry()
    now = [100.0]
    process = collectors.ProcessCollector(registry, clock=lambda: now[0])
    for _ in range(3):
        process.sample_once()
        now[0] += 1.0
    return registry


_PROBES: dict[str, tuple[tuple[str, ...], Callable[[], CollectorRegistry]]] = {
    "collectors.InferenceStats": (("gen_ai_server_", "infersight_client_"), _inference_registry),
    "collectors.GPUCollector": (("infersight_gpu_", "infersight_nvml_"), _gpu_registry),
    "collectors.ProcessCollector": (("infersight_process_",), _process_registry),
}


@pytest.mark.parametrize("probe", sorted(_PROBES))
def test_dashboard_metrics_exist_in_the_collectors_registries(probe: str) -> None:
    prefixes, build = _PROBES[probe]
    registry = build()
    exported = _families(registry)
    wanted = {n for n in _dashboard_metrics() if n.startswith(prefixes)}
    assert wanted, f"dashboard reads no metric with prefixes {prefixes}"
    missing = sorted(wanted - exported)
    assert not missing, f"{probe} does not export {missing} (it exports {sorted(exported)})"


_GROUPING = re.compile(r"\b(?:by|without)\s*\(([^()]*)\)")
_LEGEND_LABEL = re.compile(r"\{\{\s*(\w+)\s*\}\}")


def _labels(registry: CollectorRegistry) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for family in registry.collect():
        for sample in family.samples:
            out.setdefault(sample.name, set()).update(sample.labels)
    return out


@pytest.mark.parametrize("probe", sorted(_PROBES))
def test_dashboard_groups_and_legends_by_labels_the_metrics_carry(probe: str) -> None:
    prefixes, build = _PROBES[probe]
    registry = build()
    labels = _labels(registry)
    checked = 0
    for panel in build_dashboard()["panels"]:
        for target in panel.get("targets", []):
            names = metric_names(target["expr"])
            if not names or not all(n.startswith(prefixes) for n in names):
                continue
            carried = set().union(*(labels.get(n, set()) for n in names)) | {
                "le",
                "instance",
            }  # instance: the scrape's
            used = {
                lab.strip()
                for group in _GROUPING.findall(target["expr"])
                for lab in group.split(",")
                if lab.strip()
            }
            used |= set(_LEGEND_LABEL.findall(target["legendFormat"]))
            assert used <= carried, (
                f"{panel['title']!r}: {sorted(used - carried)} not labels of {sorted(names)}"
            )
            checked += 1
    assert checked, f"no dashboard query reads only {probe}'s metrics"


def _group(name: str) -> str:
    """`infersight_drift_p_value` -> `infersight_drift`; `gen_ai_server_x` -> `gen_ai_server`."""
    parts = name.split("_")
    return "_".join(parts[:3] if name.startswith("gen_ai_") else parts[:2])


def test_dashboard_metrics_exist_on_the_services_metrics_endpoint(tmp_path: Path) -> None:
    """Every dashboard metric of a family group the real service exports (drift, alerts, outbox,
    collectors...) is on its /metrics; groups it does not export yet are left to the table check."""
    from fastapi.testclient import TestClient
    from infersight.monitor import service

    app = service.create_app(service.ServiceConfig(data_dir=tmp_path / "data", token="t" * 24))
    with TestClient(app) as client:
        text = client.get("/metrics").text
    exported: set[str] = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(maxsplit=3)
            exported.update(
                name + s for s in (("_bucket", "_count", "_sum") if kind == "histogram" else ("",))
            )
    groups = {_group(n) for n in exported}
    wanted = {n for n in _dashboard_metrics() if _group(n) in groups}
    assert len(wanted) > 20
    missing = sorted(wanted - exported)
    assert not missing, f"the service's /metrics lacks {missing}"
