"""The deploy files agree with the code and are accepted by the real servers."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import redis.asyncio as aioredis
import yaml

from baton.auth import ROLES, helm_users_block, nats_users_file, redis_acl_file, with_helm_users
from baton.devkit.servers import NatsServer, RedisServer
from baton.settings import Settings

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
PASSWORDS = {f"{r.upper()}_NATS_PASSWORD": f"{r}pw" for r in ("admin", *ROLES, "route")}
# How compose.yaml and nats-values.yaml give every NATS node its routes.
ROUTES = {"ROUTE_URLS": "[nats-route://route:routepw@nats-2:6222]"}


def test_permission_files_are_generated_from_the_code() -> None:
    # Regenerate with `python -m baton.auth` after changing shared/auth.py.
    assert (DEPLOY / "nats" / "users.conf").read_text() == nats_users_file("baton")
    assert (DEPLOY / "redis" / "users.acl").read_text() == redis_acl_file("baton")
    # The Helm values carry the same users (they had drifted when kept by hand).
    values = (DEPLOY / "k8s" / "nats-values.yaml").read_text()
    assert with_helm_users(values, "baton") == values
    assert helm_users_block("baton") in values
    # The chart's container.env is a map (its nats.env helper ranges over name -> value):
    # a list gave variables named 0, 1, ... and the users' passwords were never set
    env = values.split("\ncontainer:\n", 1)[1].split("\n  env:\n", 1)[1].split("\n  merge:", 1)[0]
    assert "- name:" not in env
    for variable in re.findall(r"<< \$(\w+) >>", helm_users_block("baton")):
        assert f"\n    {variable}:\n      valueFrom: {{secretKeyRef: {{name: baton-credentials, " \
               f"key: {variable}}}}}" in "\n" + env, variable


def test_the_nats_config_is_valid_for_nats_server(tmp_path: Path) -> None:
    for name in ("nats.conf", "users.conf"):
        shutil.copy(DEPLOY / "nats" / name, tmp_path / name)
    conf = tmp_path / "nats.conf"
    text = conf.read_text()
    assert "sync_interval: always" in text and "include ./users.conf" in text
    conf.write_text(text.replace("store_dir: /data", f"store_dir: {tmp_path / 'js'}"))
    binary = NatsServer(tmp_path / "probe")._binary
    done = subprocess.run([binary, "-c", str(conf), "-t"], capture_output=True, text=True,
                          env={**os.environ, **PASSWORDS, **ROUTES, "SERVER_NAME": "nats-1"},
                          timeout=30, check=False)
    assert done.returncode == 0, done.stdout + done.stderr


async def test_the_redis_acl_file_is_accepted_and_durable_settings_are_set(
    tmp_path: Path,
) -> None:
    conf = (DEPLOY / "redis" / "redis.conf").read_text()
    assert re.search(r"(?m)^appendonly yes$", conf)
    assert re.search(r"(?m)^appendfsync always$", conf)
    async with RedisServer(tmp_path) as server:
        admin = aioredis.Redis.from_url(server.url)
        for line in (DEPLOY / "redis" / "users.acl").read_text().splitlines():
            if not line.startswith("user ") or line.split()[1] == "default":
                continue
            rules = re.sub(r"\$\{(\w+)\}", "secret", line).split()[1:]
            await admin.execute_command("ACL", "SETUSER", *rules)
        names = {u.decode() for u in await admin.execute_command("ACL", "USERS")}
        await admin.aclose()
    assert names >= {"admin", *ROLES}


def test_stop_grace_periods_exceed_the_drain_timeout() -> None:
    compose = (DEPLOY / "compose.yaml").read_text()
    drain = int(re.search(r"BATON_DRAIN_TIMEOUT_S=(\d+)", (DEPLOY / ".env.example")
                          .read_text())[1])  # type: ignore[index]
    drain += Settings().telemetry_flush_timeout_s  # then the last spans and metrics
    graces = [int(g) for g in re.findall(r"stop_grace_period: (\d+)s", compose)]
    assert graces and max(graces) > drain
    assert 'BATON_STREAM_REPLICAS: "3"' in compose
    for role in ("brain", "hands", "relay"):
        manifest = (DEPLOY / "k8s" / f"{role}.yaml").read_text()
        grace = int(re.search(r"terminationGracePeriodSeconds: (\d+)", manifest)[1])  # type: ignore[index]
        assert grace > drain and "readinessProbe" in manifest and "PodDisruptionBudget" in manifest



def test_every_baton_service_sends_telemetry_to_the_collector_and_on_to_jaeger() -> None:
    compose = (DEPLOY / "compose.yaml").read_text()
    endpoint = "OTEL_EXPORTER_OTLP_ENDPOINT: http://otel-collector:4318"
    # relay, brain and hands merge the shared block; the client sets its own.
    shared = compose.split("x-baton-env: &baton-env", 1)[1].split("\nservices:", 1)[0]
    client = compose.split("\n  client:", 1)[1].split("\n  otel-collector:", 1)[0]
    assert endpoint in shared and endpoint in client
    for role in ("relay", "brain", "hands", "client"):
        assert f"OTEL_SERVICE_NAME: baton-{role}" in compose
    for role in ("relay", "brain", "hands"):
        block = compose.split(f"\n  {role}:", 1)[1].split("\n\n", 1)[0]
        assert "<<: *baton-env" in block, role
    assert '"127.0.0.1:4318:4318"' in compose and '"127.0.0.1:16686:16686"' in compose
    collector = (DEPLOY / "otel" / "collector.yaml").read_text()
    assert "endpoint: jaeger:4317" in collector
    assert "exporters: [otlp/jaeger" in collector and "    metrics:\n" in collector


def _published_ports(compose: str) -> dict[str, list[str]]:
    """Service -> its ``ports:`` entries, read without a YAML parser (flow or block lists).

    Anything that is not a short-syntax string (e.g. the long ``target:``/``published:``
    form) is returned as its raw line, so the loopback check below fails on it instead of
    missing it.
    """
    services = compose.split("\nservices:\n", 1)[1].split("\nvolumes:\n", 1)[0]
    found: dict[str, list[str]] = {}
    service = ""
    in_ports = False
    for line in services.splitlines():
        if re.match(r"^  [\w-]+:\s*$", line):
            service, in_ports = line.strip()[:-1], False
            continue
        flow = re.match(r"^    ports:\s*\[(.*)\]\s*$", line)
        if flow:
            found.setdefault(service, []).extend(
                p.strip().strip('"\'') for p in flow[1].split(",") if p.strip())
            continue
        if re.match(r"^    ports:\s*$", line):
            in_ports = True
            continue
        if in_ports and re.match(r"^      - ", line):
            found.setdefault(service, []).append(line.split("- ", 1)[1].strip().strip('"\''))
        elif in_ports and not line.startswith("       "):
            in_ports = False
    return found


def test_compose_publishes_nothing_beyond_loopback() -> None:
    compose = (DEPLOY / "compose.yaml").read_text()
    published = _published_ports(compose)
    assert published, "the parser found no ports at all: it no longer reads the file"
    for service, ports in published.items():
        for port in ports:
            assert re.fullmatch(r"127\.0\.0\.1:\d+:\d+(/(tcp|udp))?", port), (service, port)
    # The stores, the bus, the mail service: on the compose network only.
    for internal in ("redis", "nats-1", "nats-2", "nats-3", "mailbox"):
        assert internal not in published, internal
    assert "\n    network_mode: host" not in compose


def test_compose_requires_every_password_and_ships_none(tmp_path: Path) -> None:
    compose = (DEPLOY / "compose.yaml").read_text()
    references = re.findall(r"\$\{(\w*PASSWORD\w*)(:\?[^}]*)?\}", compose)
    assert references
    assert all(required for _, required in references), [n for n, r in references if not r]
    example = (DEPLOY / ".env.example").read_text()
    values = dict(re.findall(r"(?m)^(\w+_PASSWORD)=(.*)$", example))
    assert set(values) == {name for name, _ in references}
    assert all(v == "" for v in values.values()), "the example ships a password"
    # The permission files hold placeholders filled from the environment, no secrets.
    nats_users = (DEPLOY / "nats" / "users.conf").read_text()
    assert re.findall(r"password: (\S+)", nats_users)
    assert all(p.startswith("$") for p in re.findall(r"password: ([^,}\s]+)", nats_users))
    acl = [line for line in (DEPLOY / "redis" / "users.acl").read_text().splitlines()
           if line.startswith("user ")]
    assert all(re.fullmatch(r">\$\{\w+_REDIS_PASSWORD\}", t)
               for line in acl for t in line.split() if t.startswith(">")), acl
    # make_env.py fills every one with a fresh random password and keeps the rest.
    for name in ("make_env.py", ".env.example"):
        shutil.copy(DEPLOY / name, tmp_path / name)
    done = subprocess.run([sys.executable, str(tmp_path / "make_env.py")], capture_output=True,
                          text=True, timeout=30, check=False)
    assert done.returncode == 0, done.stderr
    env = (tmp_path / ".env").read_text()
    made = dict(re.findall(r"(?m)^(\w+_PASSWORD)=(.*)$", env))
    assert set(made) == set(values)
    assert all(re.fullmatch(r"[0-9a-f]{48}", v) for v in made.values())
    assert len(set(made.values())) == len(made)
    assert "BATON_NAMESPACE=baton" in env
    again = subprocess.run([sys.executable, str(tmp_path / "make_env.py")], capture_output=True,
                           text=True, timeout=30, check=False)
    assert again.returncode != 0 and (tmp_path / ".env").read_text() == env


def test_every_setting_the_deploy_guide_names_exists() -> None:
    """The Redis Cluster table (and the rest of the guide) names only real settings."""
    import re


    text = (DEPLOY / "README.md").read_text()
    named = set(re.findall(r"BATON_([A-Z0-9_]+)", text)) - {"FAULT", "WAKE", "TOOLS"}  # streams
    from baton.devkit.stack import OPERATOR_ENV

    known = {name.upper() for name in Settings.model_fields}
    known |= {f"OPERATOR_{name}" for name in OPERATOR_ENV}  # the read-only commands' credential
    prefixes = ("NATS_TLS_", "REDIS_TLS_")  # written as BATON_REDIS_TLS_* in prose
    missing = {n for n in named if n not in known and not n.startswith(prefixes)
               and not n.endswith("_")}
    assert not missing, missing
    for setting in ("REDIS_MIN_REPLICAS", "REDIS_REPLICA_TIMEOUT_MS",
                    "REDIS_IN_DOUBT_RETRY_MS", "NATS_PING_INTERVAL_S"):
        assert f"BATON_{setting}" in text


def test_every_baton_setting_of_the_env_file_reaches_the_services() -> None:
    """.env only feeds compose's ${...}: a BATON_ variable set there but never passed on
    (BATON_EVENT_LOOP was) changes nothing."""
    compose = (DEPLOY / "compose.yaml").read_text()
    names = re.findall(r"^(BATON_\w+)=", (DEPLOY / ".env.example").read_text(), re.M)
    assert names
    for name in names:
        assert f"${{{name}" in compose, name
    assert "cp deploy/.env.example" not in compose  # make_env.py refuses an existing .env


def test_nats_routes_need_the_route_login_in_compose_and_helm() -> None:
    """Issue 46: a server joins the cluster as a route only with the route login (and, in
    Kubernetes, a certificate of the cluster's CA). tests/integration/test_nats_routes.py
    runs nats.conf as a cluster and attacks it; this checks what feeds it."""
    conf = (DEPLOY / "nats" / "nats.conf").read_text()
    cluster = conf.split("\ncluster {\n", 1)[1].split("\n}\n", 1)[0]
    assert "authorization {\n    user: route\n    password: $ROUTE_NATS_PASSWORD\n" in cluster
    assert "\n  routes: $ROUTE_URLS\n" in cluster
    # compose: every node gets the password and the three URLs carrying it
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    for node in ("nats-1", "nats-2", "nats-3"):
        env = compose["services"][node]["environment"]
        assert env["ROUTE_NATS_PASSWORD"] == "${ROUTE_NATS_PASSWORD:?set it in deploy/.env}"
        urls = env["ROUTE_URLS"].replace(env["ROUTE_NATS_PASSWORD"], "pw")
        assert urls == ("[nats-route://route:pw@nats-1:6222, nats-route://route:pw@nats-2:6222, "
                        "nats-route://route:pw@nats-3:6222]")
    # Helm: the same cluster block, the URLs built from the Secret (not the ConfigMap), TLS
    values = yaml.safe_load((DEPLOY / "k8s" / "nats-values.yaml").read_text())
    cluster_values = values["config"]["cluster"]
    assert cluster_values["merge"] == {
        "authorization": {"user": "route", "password": "<< $ROUTE_NATS_PASSWORD >>",
                          "timeout": 2},
        "routes": "<< $ROUTE_URLS >>"}
    assert "routeURLs" not in cluster_values  # it writes the password into the ConfigMap
    assert cluster_values["tls"]["enabled"] and cluster_values["tls"]["secretName"]
    assert cluster_values["tls"]["merge"]["verify"] is True
    env = values["container"]["env"]
    assert env["ROUTE_NATS_PASSWORD"] == {"valueFrom": {"secretKeyRef": {
        "name": "baton-credentials", "key": "ROUTE_NATS_PASSWORD"}}}
    # $(VAR) expands only a variable listed before; the chart lists the env map sorted
    assert sorted(env).index("ROUTE_NATS_PASSWORD") < sorted(env).index("ROUTE_URLS")
    assert env["ROUTE_URLS"] == "[" + ", ".join(
        f"tls://route:$(ROUTE_NATS_PASSWORD)@nats-{i}.nats-headless:6222"
        for i in range(cluster_values["replicas"])) + "]"
    secret = yaml.safe_load((DEPLOY / "k8s" / "secret.example.yaml").read_text())
    assert "ROUTE_NATS_PASSWORD" in secret["stringData"]


# The pods of the NATS chart's StatefulSet (release "nats") and of its nats-box.
NATS_PODS = {"app.kubernetes.io/name": "nats", "app.kubernetes.io/instance": "nats",
             "app.kubernetes.io/component": "nats"}
NATS_BOX = {**NATS_PODS, "app.kubernetes.io/component": "nats-box"}


def test_no_pod_gets_a_kubernetes_api_token() -> None:
    # Nothing of Baton calls the Kubernetes API; an isolated tool's child in a Hands pod
    # would otherwise find the service account's token under /var/run/secrets.
    pods = {}
    for path in (DEPLOY / "k8s").glob("*.yaml"):
        for doc in yaml.safe_load_all(path.read_text()):
            template = ((doc or {}).get("spec") or {}).get("template")
            if doc and path.name != "nats-values.yaml" and template:
                pods[doc["metadata"]["name"]] = template["spec"].get(
                    "automountServiceAccountToken")
    assert {"baton-brain", "baton-hands", "baton-relay"} <= set(pods), pods
    assert all(mounted is False for mounted in pods.values()), pods


def _pod_labels() -> dict[str, dict[str, str]]:
    """Every pod template of deploy/k8s by workload name, with the NATS chart's pods."""
    pods = {"nats": NATS_PODS, "nats-box": NATS_BOX}
    for path in (DEPLOY / "k8s").glob("*.yaml"):
        for doc in yaml.safe_load_all(path.read_text()):
            template = ((doc or {}).get("spec") or {}).get("template")
            if doc and path.name != "nats-values.yaml" and template:
                pods[doc["metadata"]["name"]] = template["metadata"]["labels"]
    return pods


def _selects(selector: dict[str, object], labels: dict[str, str]) -> bool:
    assert set(selector) <= {"matchLabels"}, selector  # all this file uses
    wanted = selector.get("matchLabels") or {}
    assert isinstance(wanted, dict)
    return all(labels.get(k) == v for k, v in wanted.items())


def test_network_policies_admit_only_who_needs_each_port() -> None:
    kustomization = yaml.safe_load((DEPLOY / "k8s" / "kustomization.yaml").read_text())
    assert "network-policy.yaml" in kustomization["resources"]
    policies = list(yaml.safe_load_all((DEPLOY / "k8s" / "network-policy.yaml").read_text()))
    assert all(p["kind"] == "NetworkPolicy" for p in policies)
    assert all(p["apiVersion"] == "networking.k8s.io/v1" for p in policies)
    assert {"podSelector": {}, "policyTypes": ["Ingress"]} in [p["spec"] for p in policies]
    pods = _pod_labels()
    baton = {n for n, labels in pods.items() if labels.get("app.kubernetes.io/name") == "baton"}
    assert {"baton-brain", "baton-hands", "baton-relay", "redis", "mailbox"} <= baton

    def admitted(target: str, port: int) -> set[str]:
        """The pods that may open ``port`` on the pods of ``target``."""
        found: set[str] = set()
        for policy in policies:
            spec = policy["spec"]
            if not _selects(spec["podSelector"], pods[target]):
                continue
            assert spec["policyTypes"] == ["Ingress"]
            for rule in spec.get("ingress") or []:
                if port not in [p["port"] for p in rule["ports"]]:
                    continue
                for peer in rule["from"]:
                    assert set(peer) == {"podSelector"}, peer  # this namespace's pods only
                    found |= {n for n, labels in pods.items()
                              if _selects(peer["podSelector"], labels)}
        return found

    assert admitted("nats", 6222) == {"nats"}  # routes: the NATS servers only
    assert admitted("nats", 4222) == baton | {"nats-box"}
    assert admitted("nats", 8222) == set()  # monitoring: the kubelet's probes only
    assert admitted("redis", 6379) == baton
    assert admitted("mailbox", 8025) == {"baton-hands"}
    for name in pods:  # everything else: nothing gets in
        assert admitted(name, 8080) == set(), name
    if shutil.which("kubectl"):  # the kustomization builds (offline)
        built = subprocess.run(["kubectl", "kustomize", str(DEPLOY / "k8s")],
                               capture_output=True, text=True, timeout=60, check=False)
        assert built.returncode == 0, built.stderr
        assert built.stdout.count("kind: NetworkPolicy") == len(policies)
