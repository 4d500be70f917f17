"""deploy/kubernetes/: every manifest valid, offline.

The core kinds (ConfigMap, Secret, Deployment, Service) are validated against the Kubernetes
OpenAPI schemas that kubernetes-validate ships (strict: an unknown field is an error). The
custom resources (ServiceMonitor, PrometheusRule, Rollout, AnalysisTemplate, Canary) have no
schema there: their core structure is checked here instead (the fields their controllers
require, and, for the Rollout, the pod template validated as a core PodTemplateSpec). The
PrometheusRule is exactly what `infersight rules export --prometheus-rule infersight` prints,
and each kustomization names files that exist. Where kubectl is installed, each kustomization
is also rendered and every object of the result validated the same way.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from infersight.monitor.cli import main

ROOT = Path(__file__).resolve().parent.parent / "deploy" / "kubernetes"
K8S_VERSION = "1.30"
CORE = {"ConfigMap", "Secret", "Deployment", "Service", "Job"}
MANIFESTS = sorted(p for p in ROOT.rglob("*.yaml") if p.name != "kustomization.yaml")
KUSTOMIZATIONS = sorted(ROOT.rglob("kustomization.yaml"))


def _docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d is not None]


def _valid_core(doc: dict[str, Any]) -> None:
    try:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    except kubernetes_validate.ValidationError as exc:
        raise AssertionError(f"{doc['kind']} {doc['metadata'].get('name')}: {exc.message}") from None


def _pod_template(template: dict[str, Any]) -> None:
    """A pod template, validated as the core Deployment it would be part of."""
    _valid_core({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "check"},
                 "spec": {"selector": {"matchLabels": template["metadata"]["labels"]}, "template": template}})  # fmt: skip


def _custom(doc: dict[str, Any]) -> None:
    """The core structure of the custom resources, as their controllers read them."""
    kind, spec = doc["kind"], doc["spec"]
    assert doc["metadata"]["name"]
    if kind == "ServiceMonitor":
        assert doc["apiVersion"] == "monitoring.coreos.com/v1"
        assert spec["selector"]["matchLabels"] and spec["endpoints"]
        assert all(e["port"] and e["path"].startswith("/") for e in spec["endpoints"])
    elif kind == "PrometheusRule":
        assert doc["apiVersion"] == "monitoring.coreos.com/v1"
        for group in spec["groups"]:
            assert group["name"] and group["rules"]
            assert all(("alert" in r or "record" in r) and r["expr"] for r in group["rules"])
    elif kind == "Rollout":
        assert doc["apiVersion"] == "argoproj.io/v1alpha1"
        canary = spec["strategy"]["canary"]
        assert canary["steps"] and spec["selector"]["matchLabels"]
        _pod_template(spec["template"])
    elif kind == "AnalysisTemplate":
        assert doc["apiVersion"] == "argoproj.io/v1alpha1"
        for metric in spec["metrics"]:
            (provider,) = metric["provider"]
            assert provider in ("web", "job")
            if provider == "job":
                job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "check"},
                       "spec": metric["provider"]["job"]["spec"]}  # fmt: skip
                _valid_core(job)
    elif kind == "Canary":
        assert doc["apiVersion"] == "flagger.app/v1beta1"
        assert spec["targetRef"]["kind"] == "Deployment" and spec["service"]["port"]
        hooks = spec["analysis"]["webhooks"]
        assert {h["type"] for h in hooks} == {"rollout", "confirm-promotion", "rollback"}
        assert all(
            h["url"].startswith("http") and set(h["metadata"]) >= {"candidate", "baseline"} for h in hooks
        )
    else:
        raise AssertionError(f"no check for the kind {kind}")


def _validate(doc: dict[str, Any]) -> None:
    if doc["kind"] in CORE:
        _valid_core(doc)
    else:
        _custom(doc)


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_manifest_is_valid(path: Path) -> None:
    docs = _docs(path)
    assert docs, path
    for doc in docs:
        _validate(doc)


@pytest.mark.parametrize("path", KUSTOMIZATIONS, ids=lambda p: str(p.relative_to(ROOT)))
def test_each_kustomization_names_what_exists(path: Path) -> None:
    (k,) = _docs(path)
    assert k["apiVersion"] == "kustomize.config.k8s.io/v1beta1" and k["kind"] == "Kustomization"
    for resource in k["resources"]:
        target = path.parent / resource
        assert target.is_file() or (target / "kustomization.yaml").is_file(), (path, resource)
    for patch in k.get("patches", []):
        assert "patch" in patch


def test_the_prometheus_rule_is_what_rules_export_prints(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["rules", "export", "-", "--prometheus-rule", "infersight"]) == 0
    printed = capsys.readouterr().out
    assert (ROOT / "base" / "prometheusrule.yaml").read_text(encoding="utf-8") == printed, (
        "regenerate: infersight rules export deploy/kubernetes/base/prometheusrule.yaml --prometheus-rule infersight"
    )


def test_the_rendered_kustomizations_are_valid() -> None:
    kubectl = shutil.which("kubectl")
    if kubectl is None:  # the files themselves are checked above; rendering needs kubectl's kustomize
        pytest.skip("kubectl is not installed: the kustomizations are not rendered")
    kinds = {}
    for path in KUSTOMIZATIONS:
        out = subprocess.run(
            [kubectl, "kustomize", str(path.parent)], capture_output=True, text=True, timeout=60
        )
        assert out.returncode == 0, out.stderr
        docs = [d for d in yaml.safe_load_all(out.stdout) if d is not None]
        for doc in docs:
            _validate(doc)
        kinds[path.parent.name] = sorted(d["kind"] for d in docs)
    assert "Deployment" not in kinds["argo-rollouts"] and "Rollout" in kinds["argo-rollouts"]
    assert kinds["flagger"].count("Service") == 0 and "Canary" in kinds["flagger"]
