"""The autoscaling manifests (deploy/k8s/scaling/), checked offline: they build as kustomize
components of deploy/k8s; the ScaledObjects use only the fields and the trigger metadata
KEDA's documentation defines (its ScaledObject specification, the NATS JetStream and CPU
scalers) and name the consumers the code makes for the configured app; the HPAs are
autoscaling/v2 on CPU requests the Deployments set; the NATS monitoring port the scaler
reads is served and KEDA may reach it; a Hands drains its runs before its pod goes."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from baton.app import load_app
from baton.bus.subjects import BusNames
from baton.settings import Settings

K8S = Path(__file__).resolve().parents[2] / "deploy" / "k8s"
SCALING = K8S / "scaling"

# keda.sh/v1alpha1 ScaledObject, per KEDA's documentation ("ScaledObject specification").
SCALED_OBJECT_SPEC = {"scaleTargetRef", "pollingInterval", "cooldownPeriod",
                      "initialCooldownPeriod", "idleReplicaCount", "minReplicaCount",
                      "maxReplicaCount", "fallback", "advanced", "triggers"}
SCALE_TARGET = {"apiVersion", "kind", "name", "envSourceContainerName"}
ADVANCED = {"restoreToOriginalReplicaCount", "horizontalPodAutoscalerConfig",
            "scalingModifiers"}
TRIGGER = {"type", "metadata", "name", "metricType", "authenticationRef", "useCachedMetrics"}
# The nats-jetstream scaler's trigger metadata (KEDA's "NATS JetStream" scaler page).
JETSTREAM_METADATA = {"natsServerMonitoringEndpoint", "account", "stream", "consumer",
                      "lagThreshold", "activationLagThreshold", "useHttps"}
JETSTREAM_REQUIRED = {"natsServerMonitoringEndpoint", "account", "stream", "consumer"}
# The cpu scaler's (KEDA's "CPU" scaler page): metricType on the trigger.
CPU_METADATA = {"value", "containerName"}
# autoscaling/v2 HorizontalPodAutoscalerSpec.
HPA_SPEC = {"scaleTargetRef", "minReplicas", "maxReplicas", "metrics", "behavior"}


def _docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def _config() -> dict[str, str]:
    (config,) = [d for d in _docs(K8S / "config.yaml") if d["kind"] == "ConfigMap"]
    return dict(config["data"])


def _deployments() -> dict[str, dict[str, Any]]:
    found = {}
    for path in K8S.glob("*.yaml"):
        if path.name == "nats-values.yaml":
            continue
        for doc in _docs(path):
            if doc.get("kind") == "Deployment":
                found[doc["metadata"]["name"]] = doc
    return found


def _int_text(value: object) -> int:
    assert isinstance(value, str) and re.fullmatch(r"\d+", value), value  # metadata: strings
    return int(value)


def test_the_scaled_objects_follow_kedas_nats_jetstream_scaler() -> None:
    config = _config()
    names = BusNames(config["BATON_NAMESPACE"])
    app = load_app(config["BATON_APP"])
    settings = Settings()
    deployments = _deployments()
    objects = {d["metadata"]["name"]: d for d in _docs(SCALING / "keda" / "keda.yaml")
               if d["kind"] == "ScaledObject"}
    assert set(objects) == {"baton-brain", "baton-hands"}
    consumers: dict[str, set[tuple[str, str]]] = {}
    for name, obj in objects.items():
        assert obj["apiVersion"] == "keda.sh/v1alpha1"
        assert obj["metadata"]["namespace"] == config["BATON_NAMESPACE"]
        spec = obj["spec"]
        assert set(spec) <= SCALED_OBJECT_SPEC, set(spec) - SCALED_OBJECT_SPEC
        assert set(spec["scaleTargetRef"]) <= SCALE_TARGET
        assert spec["scaleTargetRef"]["name"] == name and name in deployments
        assert set(spec.get("advanced", {})) <= ADVANCED
        assert 0 <= spec["minReplicaCount"] < spec["maxReplicaCount"]
        kinds = set()
        for trigger in spec["triggers"]:
            assert set(trigger) <= TRIGGER, trigger
            meta = trigger["metadata"]
            kinds.add(trigger["type"])
            if trigger["type"] == "cpu":
                assert trigger["metricType"] in ("Utilization", "AverageValue")
                assert set(meta) <= CPU_METADATA and 0 < _int_text(meta["value"]) <= 100
                continue
            assert trigger["type"] == "nats-jetstream", trigger
            assert set(meta) <= JETSTREAM_METADATA, set(meta) - JETSTREAM_METADATA
            assert JETSTREAM_REQUIRED <= set(meta)
            assert all(isinstance(v, str) for v in meta.values()), meta
            assert meta["account"] == "$G"  # users.conf's users live in the global account
            assert meta["useHttps"] in ("true", "false")
            host, port = meta["natsServerMonitoringEndpoint"].rsplit(":", 1)
            assert port == "8222" and "://" not in host
            assert host.startswith(f"nats-headless.{config['BATON_NAMESPACE']}.svc")
            threshold = _int_text(meta["lagThreshold"])
            assert _int_text(meta["activationLagThreshold"]) < threshold
            # The thresholds are the replicas' slots (deploy/README.md, "Autoscaling").
            assert threshold == (settings.hands_concurrency if name == "baton-hands"
                                 else settings.brain_concurrency)
            consumers.setdefault(name, set()).add((meta["stream"], meta["consumer"]))
        # KEDA scales to zero only on a scaler that can wake it: never on CPU alone.
        assert spec["minReplicaCount"] > 0 or kinds - {"cpu", "memory"}
    # The consumers the code makes for the configured app (BusNames), and only those.
    assert consumers["baton-hands"] == {(names.tool_stream, names.tool_durable(t))
                                        for t in app.tools}
    assert consumers["baton-brain"] == {(names.wake_stream, names.wake_durable(a.name, a.compat))
                                        for a in app.agents.values()}
    assert objects["baton-hands"]["spec"]["minReplicaCount"] == 0  # a tool's pool may stop
    assert objects["baton-brain"]["spec"]["minReplicaCount"] >= 1


def test_the_hpas_scale_on_cpu_the_deployments_request() -> None:
    deployments = _deployments()
    hpas = _docs(SCALING / "hpa" / "hpa.yaml")
    assert {h["metadata"]["name"] for h in hpas} == {"baton-brain", "baton-hands"}
    for hpa in hpas:
        assert (hpa["apiVersion"], hpa["kind"]) == ("autoscaling/v2", "HorizontalPodAutoscaler")
        spec = hpa["spec"]
        assert set(spec) <= HPA_SPEC
        ref = spec["scaleTargetRef"]
        assert ref == {"apiVersion": "apps/v1", "kind": "Deployment",
                       "name": hpa["metadata"]["name"]}
        assert 1 <= spec["minReplicas"] < spec["maxReplicas"]
        (metric,) = spec["metrics"]
        assert metric["type"] == "Resource" and metric["resource"]["name"] == "cpu"
        assert metric["resource"]["target"]["type"] == "Utilization"
        # Utilization is measured against the request: every container must set one.
        for container in deployments[ref["name"]]["spec"]["template"]["spec"]["containers"]:
            assert container["resources"]["requests"]["cpu"], container["name"]


def test_keda_reaches_the_nats_monitoring_port() -> None:
    conf = (K8S.parent / "nats" / "nats.conf").read_text()
    assert re.search(r"(?m)^http: 0\.0\.0\.0:8222$", conf)
    values = yaml.safe_load((K8S / "nats-values.yaml").read_text())
    monitor = values["config"]["monitor"]
    assert monitor["enabled"] is True and monitor.get("port", 8222) == 8222
    (policy,) = [d for d in _docs(SCALING / "keda" / "keda.yaml")
                 if d["kind"] == "NetworkPolicy"]
    assert policy["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/name"] == "nats"
    (rule,) = policy["spec"]["ingress"]
    assert rule["ports"] == [{"protocol": "TCP", "port": 8222}]
    (peer,) = rule["from"]
    assert peer["namespaceSelector"] and peer["podSelector"]  # KEDA's operator pods only


def test_a_hands_drains_its_runs_before_its_pod_goes() -> None:
    """A scale-down never cuts a run mid-call: the Hands' drain outlasts the app's longest
    tool timeout, and the grace period the drain and the telemetry flush."""
    hands = _deployments()["baton-hands"]["spec"]["template"]["spec"]
    (container,) = hands["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    drain = float(env.get("BATON_DRAIN_TIMEOUT_S") or _config()["BATON_DRAIN_TIMEOUT_S"])
    app = load_app(_config()["BATON_APP"])
    assert drain > max(t.timeout for t in app.tools.values())
    assert hands["terminationGracePeriodSeconds"] > drain + Settings().telemetry_flush_timeout_s
    readiness = container["readinessProbe"]["httpGet"]["path"]
    assert readiness == "/readyz"  # 503 while draining


def test_a_brain_stops_within_its_grace_period() -> None:
    """A Brain's drain does not wait out a model call (a pass still in one is handed over:
    test_brain_drain.py); its grace period covers the drain and the telemetry flush."""
    brain = _deployments()["baton-brain"]["spec"]["template"]["spec"]
    (container,) = brain["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    drain = float(env.get("BATON_DRAIN_TIMEOUT_S") or _config()["BATON_DRAIN_TIMEOUT_S"])
    assert drain < Settings().model_call_timeout_s
    assert brain["terminationGracePeriodSeconds"] > drain + Settings().telemetry_flush_timeout_s


@pytest.mark.parametrize("component", ["keda", "hpa"])
def test_each_scaling_component_builds_with_the_manifests(component: str,
                                                          tmp_path: Path) -> None:
    if not shutil.which("kubectl"):
        pytest.skip("kubectl (its kustomize) is not installed")
    base = os.path.relpath(K8S, tmp_path)  # kustomize takes no absolute path
    (tmp_path / "kustomization.yaml").write_text(
        f"resources: [{base}]\ncomponents: [{base}/scaling/{component}]\n")
    built = subprocess.run(["kubectl", "kustomize", str(tmp_path)], capture_output=True,
                           text=True, timeout=60, check=False)
    assert built.returncode == 0, built.stderr
    docs = [d for d in yaml.safe_load_all(built.stdout) if d]
    kind = {"keda": "ScaledObject", "hpa": "HorizontalPodAutoscaler"}[component]
    assert sorted(d["metadata"]["name"] for d in docs if d["kind"] == kind) == [
        "baton-brain", "baton-hands"]
    for doc in docs:  # the scaler owns these replica counts; the others keep theirs
        if doc["kind"] == "Deployment":
            scaled = doc["metadata"]["name"] in ("baton-brain", "baton-hands")
            assert ("replicas" in doc["spec"]) is not scaled, doc["metadata"]["name"]
