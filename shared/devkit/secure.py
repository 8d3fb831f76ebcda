"""Per-stack credentials for ``baton dev --secure``: the production permission shape, locally.

A secure stack generates one password per role (and one for ``admin``) into
``<stack dir>/credentials.json`` (mode 0600, kept across restarts of a durable stack), starts
NATS with the users of :func:`baton.auth.nats_users_config` and gives Redis the users of the
ACL file deploy/ ships (:func:`baton.auth.redis_acl_file`, with its ``default`` user off).
Both servers take TLS connections only, with the stack's own CA (:mod:`baton.devkit.tls`).

On a Redis Cluster (``--secure --cluster``) every node gets the same users, each role also
allowed the keyless topology reads a cluster client needs (:data:`CLUSTER_TOPOLOGY`), and
replicas authenticate to their primary as ``admin`` (``masteruser``/``masterauth``, set
before the ``default`` user goes off, never on a command line).
Every service then connects as its own role; commands run against the stack (``baton
submit``, ``watch``) use the ``client`` user. Passwords are never printed in full
(:func:`redacted`).
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from redis.asyncio import Redis

from baton.auth import ROLES, nats_users_config, redis_acl_file
from baton.devkit.redis_cluster import RedisClusterNode
from baton.devkit.tls import TlsFiles

__all__ = ["CLUSTER_TOPOLOGY", "CREDENTIALS", "apply_cluster_users", "apply_redis_users",
           "load_credentials", "nats_config", "redacted", "role_env", "stack_credentials",
           "with_user"]

CREDENTIALS = "credentials.json"
USERS = (*ROLES, "admin")
#: What a Redis Cluster client asks every node for (slot map, replicas, redirects, the key
#: positions of commands): keyless
#: metadata reads, granted to every role on a cluster.
CLUSTER_TOPOLOGY = ("+cluster|slots", "+cluster|shards", "+cluster|nodes", "+cluster|info",
                    "+cluster|myid", "+readonly", "+asking", "+command")


def stack_credentials(base_dir: Path) -> dict[str, str]:
    """The stack's passwords by user: read, or generated and saved (0600) on first use."""
    path = base_dir / CREDENTIALS
    found = load_credentials(base_dir)
    if found is not None and set(found) >= set(USERS):
        return found
    passwords = {user: secrets.token_urlsafe(24) for user in USERS}
    base_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(path.with_suffix(".tmp"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        json.dump(passwords, out)
    path.with_suffix(".tmp").replace(path)
    return passwords


def load_credentials(base_dir: Path) -> dict[str, str] | None:
    try:
        data = json.loads((base_dir / CREDENTIALS).read_text())
    except (FileNotFoundError, ValueError):
        return None
    return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else None


def redacted(password: str) -> str:
    """Enough of a password to tell two apart, never the secret."""
    return password[:3] + "…" if password else ""


def with_user(url: str, user: str, password: str) -> str:
    """``redis://host...`` with ``user:password@`` (URL-safe passwords need no quoting)."""
    scheme, _, rest = url.partition("://")
    return f"{scheme}://{user}:{password}@{rest}"


def nats_config(namespace: str, passwords: dict[str, str]) -> str:
    """The NATS ``authorization`` block of the stack's users."""
    roles: dict[str, str] = {role: passwords[role] for role in ROLES}
    return nats_users_config(namespace, roles, admin_password=passwords["admin"])


async def apply_redis_users(url: str, namespace: str, passwords: dict[str, str],
                            *, tls: TlsFiles | None = None, cluster: bool = False) -> None:
    """Give a fresh Redis (``default`` user still open) the ACL users of deploy/'s file,
    passwords filled in; the ``default`` user goes off last. ``cluster``: a cluster node
    (topology reads for every role, replication as ``admin``)."""
    lines = []
    for line in redis_acl_file(namespace).splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        for user, password in passwords.items():
            line = line.replace(f"${{{user.upper()}_REDIS_PASSWORD}}", password)
        name, *rules = line.split()[1:]
        if cluster and name in ROLES:
            rules = [*rules, *CLUSTER_TOPOLOGY]
        lines.append([name, *rules])
    ca: dict[str, Any] = {"ssl_ca_certs": str(tls.ca)} if tls is not None else {}
    redis = Redis.from_url(url, **ca)
    try:
        if cluster:
            await redis.config_set("masteruser", "admin")
            await redis.config_set("masterauth", passwords["admin"])
        for name, *rules in sorted(lines, key=lambda u: u[0] == "default"):
            await redis.execute_command("ACL", "SETUSER", name, *rules)
    finally:
        await redis.aclose()


async def apply_cluster_users(nodes: Iterable[RedisClusterNode], namespace: str,
                              passwords: dict[str, str]) -> None:
    """:func:`apply_redis_users` on every node of a cluster; the nodes' own topology queries
    then log in as ``admin``."""
    for node in nodes:
        await apply_redis_users(node.url, namespace, passwords, tls=node.tls, cluster=True)
        node.credentials = ("admin", passwords["admin"])


def role_env(role: str, redis_url: str, passwords: dict[str, str]) -> dict[str, str]:
    """The ``BATON_*`` credentials of one role."""
    env = {"BATON_REDIS_URL": with_user(redis_url, role, passwords[role])}
    if role != "client":  # clients use no NATS subject
        env |= {"BATON_NATS_USER": role, "BATON_NATS_PASSWORD": passwords[role]}
    return env
