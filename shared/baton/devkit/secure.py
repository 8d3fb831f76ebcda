"""Per-stack credentials for ``baton dev up --secure``: the production permission shape, locally.

A secure stack generates one password per role (and one for ``admin``) into
``<stack dir>/credentials.json`` (mode 0600, kept across restarts of a durable stack), starts
NATS with the users of :func:`baton.auth.nats_users_config` and starts Redis with the users
of the ACL file deploy/ ships (:func:`baton.auth.redis_acl_file`, its ``default`` user off),
loaded from a 0600 file (:func:`write_redis_config`) so that no password is ever on a
command line and a restarted Redis process has its users again. Both servers take TLS
connections only, with the stack's own CA (:mod:`baton.devkit.tls`). Every service then
connects as its own role; commands run against the stack (``baton submit``, ``cancel``) use
the ``client`` user, the read-only ones (``inspect``, ``trace``, ``watch``) the
``operator``. Passwords are never printed in full (:func:`redacted`).

On a Redis Cluster (``--secure --cluster``) every node has the same users, each role also
allowed the keyless topology reads a cluster client needs (:data:`CLUSTER_TOPOLOGY`), and
replicas log in to their primary as ``admin`` (``masteruser``/``masterauth``). The NATS
nodes of such a stack accept a route only from a server that presents a certificate of the
stack's CA and logs in with the stack's ``route`` password (:data:`ROUTE`), which no
service is given.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterable
from pathlib import Path

from baton.auth import ROLES, nats_users_config, redis_acl_file
from baton.devkit.files import write_private
from baton.devkit.servers import RedisServer

__all__ = ["CLUSTER_TOPOLOGY", "CREDENTIALS", "ROUTE", "load_credentials", "nats_config",
           "redacted", "redis_users", "role_env", "secure_redis", "stack_credentials",
           "with_user", "write_redis_config"]

CREDENTIALS = "credentials.json"
REDIS_ACL = "redis-users.acl"
REDIS_CONF = "redis-secure.conf"
#: The NATS cluster's route login (not a user of any service: the nodes' own links).
ROUTE = "route"
USERS = (*ROLES, "admin", ROUTE)
#: What a Redis Cluster client asks every node for (slot map, replicas, redirects, the key
#: positions of commands): keyless metadata reads, granted to every role on a cluster.
CLUSTER_TOPOLOGY = ("+cluster|slots", "+cluster|shards", "+cluster|nodes", "+cluster|info",
                    "+cluster|myid", "+readonly", "+asking", "+command")


def stack_credentials(base_dir: Path) -> dict[str, str]:
    """The stack's passwords by user: read, or generated and saved (0600) on first use."""
    path = base_dir / CREDENTIALS
    found = load_credentials(base_dir)
    if found is not None and set(found) >= set(USERS):
        return found
    passwords = {user: secrets.token_urlsafe(24) for user in USERS}
    write_private(path, json.dumps(passwords))
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


def redis_users(namespace: str, passwords: dict[str, str], *, cluster: bool = False) -> str:
    """The ACL file deploy/ ships, passwords filled in (as deploy/redis/start.sh renders it).

    ``cluster``: every role may also read the cluster's topology (:data:`CLUSTER_TOPOLOGY`).
    """
    lines = []
    for line in redis_acl_file(namespace).splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        for user, password in passwords.items():
            line = line.replace(f"${{{user.upper()}_REDIS_PASSWORD}}", password)
        if cluster and line.split()[1] in ROLES:
            line = " ".join([line, *CLUSTER_TOPOLOGY])
        lines.append(line)
    return "\n".join(lines) + "\n"


def write_redis_config(base_dir: Path, namespace: str, passwords: dict[str, str], *,
                       cluster: bool = False) -> Path:
    """The stack's Redis users in ``redis-users.acl`` and the file every Redis process of
    the stack starts with, ``redis-secure.conf`` (both 0600, rewritten at each start):
    ``aclfile`` (the users exist, ``default`` off, from the first moment; a restarted
    process has them again) and, on a cluster, how replicas log in to their primary."""
    acl = write_private(base_dir / REDIS_ACL, redis_users(namespace, passwords,
                                                               cluster=cluster))
    conf = f"aclfile {json.dumps(str(acl))}\n"
    if cluster:
        conf += f"masteruser admin\nmasterauth {passwords['admin']}\n"
    return write_private(base_dir / REDIS_CONF, conf)


def secure_redis(nodes: Iterable[RedisServer], config: Path, passwords: dict[str, str]) -> None:
    """Start ``nodes`` (not yet started) with the stack's config; the servers' own queries
    (readiness, topology, cluster creation) log in as ``admin``."""
    for node in nodes:
        node.config_file = config
        node.credentials = ("admin", passwords["admin"])


def role_env(role: str, redis_url: str, passwords: dict[str, str]) -> dict[str, str]:
    """The ``BATON_*`` credentials of one role."""
    env = {"BATON_REDIS_URL": with_user(redis_url, role, passwords[role])}
    if role != "client":  # clients use no NATS subject
        env |= {"BATON_NATS_USER": role, "BATON_NATS_PASSWORD": passwords[role]}
    return env
