"""``baton api``: the HTTP API and the web console, one process over the committed state.

Clients that are not Python (and operators in a browser) submit input, start tasks, follow a
session's changes as Server-Sent Events, cancel, approve and reject, and list sessions, dead
letters and workers. The API is a client like ``baton submit`` and ``baton inspect``: it
writes only through the client's idempotent scripts and reads committed state with the same
views the command line prints (:mod:`baton.cli.inspect`, :mod:`baton.cli.trace`,
:mod:`baton.cli.watch`). It never takes a lease.

* :mod:`baton.api.app`: the FastAPI application (routes, the OpenAPI document, the console).
* :mod:`baton.api.auth`: bearer tokens with a ``read`` or ``operate`` role.
* :mod:`baton.api.problems`: every error as RFC 9457 problem details.
* :mod:`baton.api.events`: a session's watch as a Server-Sent Events stream.
* :mod:`baton.api.views`: the read models the routes and the console share.
* :mod:`baton.api.server`: the ``baton api`` command (uvicorn).
"""

from __future__ import annotations

__all__ = ["create_app"]


def __getattr__(name: str) -> object:
    if name == "create_app":
        from baton.api.app import create_app

        return create_app
    raise AttributeError(name)
