"""``baton auth``: write the permission files of a deploy directory for a namespace.

The NATS users (``nats/users.conf``), the Redis ACL users (``redis/users.acl``) and, when the
directory has one, the users block of ``k8s/nats-values.yaml``: all generated from
:mod:`baton.auth`, the one source of what each role may do.
"""

from __future__ import annotations

from pathlib import Path

import click

from baton.cli.common import emit, json_option
from baton.cli.failures import CliError

__all__ = ["auth_command"]


@click.command("auth")
@click.option("--namespace", default="baton", show_default=True,
              help="the namespace (BATON_NAMESPACE) the permissions are for")
@click.option("--deploy-dir", default=Path("deploy"), show_default=True,
              type=click.Path(file_okay=False, path_type=Path),
              help="where nats/users.conf and redis/users.acl are written (made if missing; "
                   "./deploy, as in a checkout)")
@click.option("--client-sessions", default="*", show_default=True,
              help="session ids the client user is granted, e.g. 'acme-*'")
@json_option("the files written")
def auth_command(namespace: str, deploy_dir: Path, client_sessions: str,
                 as_json: bool) -> None:
    """Write the NATS users and Redis ACL users of every role for a namespace.

    Run it after changing BATON_NAMESPACE or the permissions in baton.auth; a test checks
    that the files in deploy/ match what it writes.
    """
    from baton.auth import nats_users_file, redis_acl_file, with_helm_users
    from baton.errors import ValidationError

    try:
        acl = redis_acl_file(namespace, client_sessions)
    except ValidationError as exc:
        raise click.BadParameter(str(exc), param_hint="--namespace/--client-sessions") from None
    written = [deploy_dir / "nats" / "users.conf", deploy_dir / "redis" / "users.acl"]
    helm = deploy_dir / "k8s" / "nats-values.yaml"
    try:
        for path in written:
            path.parent.mkdir(parents=True, exist_ok=True)
        written[0].write_text(nats_users_file(namespace))
        written[1].write_text(acl)
        if helm.exists():
            helm.write_text(with_helm_users(helm.read_text(), namespace))
            written.append(helm)
    except OSError as exc:
        raise CliError(f"cannot write to {deploy_dir}: {exc.strerror or exc}") from None
    emit(as_json, {"namespace": namespace, "written": [str(p) for p in written]},
         "wrote " + ", ".join(str(p) for p in written))
