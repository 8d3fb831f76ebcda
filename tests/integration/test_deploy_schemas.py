"""Every Kubernetes manifest of deploy/k8s validates against the Kubernetes JSON schemas,
offline (no cluster, no network): the schemas come bundled with kubernetes-validate, in its
strict form, so a misspelled or misplaced field fails as an unknown property, not only a wrong
type or a missing required field. Checked are every document of every file (the manifests
`kubectl apply -k` applies, the example Secret and the scaling components' own files) and what
kustomize renders from them, alone and with each scaling component (scaling/keda, scaling/hpa).

Against two Kubernetes releases: the oldest the manifests are checked for and the newest the
pinned schemas know, so neither a field too new for the one nor an API the other removed gets
through. Custom resources have no schema here (KEDA's ScaledObject): they are skipped by kind,
and test_deploy_scaling.py checks them against KEDA's documented fields instead; any other
kind without a schema (a misspelled kind or apiVersion) fails."""

from __future__ import annotations

import copy
import os
import shutil
import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

K8S = Path(__file__).resolve().parents[2] / "deploy" / "k8s"
# The oldest release the manifests are validated for, and the newest kubernetes-validate
# 1.37.0 (the dev lock's) bundles.
VERSIONS = ("1.30", "1.37")
# Not manifests: Helm's values for the NATS chart, and kustomize's own files.
NOT_MANIFESTS = {"nats-values.yaml", "kustomization.yaml"}
# Custom resources: no Kubernetes schema (test_deploy_scaling.py checks them).
CUSTOM_KINDS = {("keda.sh/v1alpha1", "ScaledObject")}
COMPONENTS = ("keda", "hpa")


def _manifest_files() -> list[Path]:
    return sorted(p for p in K8S.rglob("*.yaml") if p.name not in NOT_MANIFESTS)


def _docs(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if d]


def _invalid(docs: Iterable[tuple[str, dict[str, Any]]], version: str) -> list[str]:
    """What fails to validate in strict mode, one line per document: where, which object, why."""
    failures = []
    for where, doc in docs:
        if (doc.get("apiVersion"), doc.get("kind")) in CUSTOM_KINDS:
            continue
        name = f"{where}: {doc.get('kind')}/{(doc.get('metadata') or {}).get('name')}"
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as e:
            failures.append(f"{name}: {'.'.join(map(str, e.path)) or '(top)'}: {e.message}")
        except kubernetes_validate.SchemaNotFoundError as e:
            failures.append(f"{name}: {e.message}")
    return failures


def _kustomize(tmp_path: Path, component: str | None) -> str:
    if not shutil.which("kubectl"):
        pytest.skip("kubectl (its kustomize) is not installed")
    base = os.path.relpath(K8S, tmp_path)  # kustomize takes no absolute path
    components = f"components: [{base}/scaling/{component}]\n" if component else ""
    (tmp_path / "kustomization.yaml").write_text(f"resources: [{base}]\n{components}")
    built = subprocess.run(["kubectl", "kustomize", str(tmp_path)], capture_output=True,
                           text=True, timeout=60, check=False)
    assert built.returncode == 0, built.stderr
    return built.stdout


def test_the_manifests_are_the_ones_expected() -> None:
    """Nothing is left out by accident: every file is a manifest or named as not one, every
    document says what it is, and the custom kinds skipped are the ones the files use."""
    names = {p.relative_to(K8S).as_posix() for p in _manifest_files()}
    assert {"namespace.yaml", "config.yaml", "secret.example.yaml", "scaling/keda/keda.yaml",
            "scaling/hpa/hpa.yaml"} <= names
    kinds = set()
    for path in _manifest_files():
        for doc in _docs(path.read_text()):
            assert doc.get("apiVersion") and doc.get("kind"), path.name
            kinds.add((doc["apiVersion"], doc["kind"]))
    assert CUSTOM_KINDS <= kinds


@pytest.mark.parametrize("version", VERSIONS)
def test_every_manifest_file_validates_against_the_kubernetes_schemas(version: str) -> None:
    docs = [(p.relative_to(K8S).as_posix(), d) for p in _manifest_files()
            for d in _docs(p.read_text())]
    assert len(docs) > 20
    failures = _invalid(docs, version)
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("component", [None, *COMPONENTS])
@pytest.mark.parametrize("version", VERSIONS)
def test_the_rendered_kustomization_validates(version: str, component: str | None,
                                              tmp_path: Path) -> None:
    """What `kubectl apply -k` sends: namespaces set, the image transformed, the scaling
    component's patches applied (the Deployments without replicas)."""
    docs = _docs(_kustomize(tmp_path, component))
    assert {d["kind"] for d in docs} >= {"Namespace", "Deployment", "StatefulSet", "Job"}
    where = f"kustomize{f' +scaling/{component}' if component else ''}"
    failures = _invalid(((where, d) for d in docs), version)
    assert not failures, "\n".join(failures)


def test_a_misspelled_field_or_kind_fails() -> None:
    """The check is not vacuous: strict mode rejects an unknown field deep in a pod template,
    and a kind the schemas do not know is a failure, not a skip."""
    (hands, *_) = [d for d in _docs((K8S / "hands.yaml").read_text())
                   if d["kind"] == "Deployment"]
    assert _invalid([("hands.yaml", hands)], VERSIONS[0]) == []
    typo = copy.deepcopy(hands)
    typo["spec"]["template"]["spec"]["containers"][0]["imagePullPolcy"] = "Always"
    (failure,) = _invalid([("hands.yaml", typo)], VERSIONS[0])
    assert "spec.template.spec.containers.0" in failure and "imagePullPolcy" in failure
    unknown = copy.deepcopy(hands)
    unknown["apiVersion"] = "apps/v2"
    (failure,) = _invalid([("hands.yaml", unknown)], VERSIONS[0])
    assert "Couldn't find schema" in failure
