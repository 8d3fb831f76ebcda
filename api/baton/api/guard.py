"""What a web page may make a browser do to the API: nothing but what its own pages do.

A browser sends requests for any page it shows, to any address, the loopback included: a page
on another site may post a form to ``/cancel`` (no CORS preflight for a form), and a name of
its own that it re-points at 127.0.0.1 (DNS rebinding) makes the API its own origin. So every
request is checked, before any route, by :class:`Guard`:

* ``Host`` must name this API: a loopback name or address, the address it is bound to, or a
  name of ``Settings.api_hosts`` (``*``: any, for a proxy that checks Host itself). A
  rebinding page's requests carry its own name: refused (400).
* ``Origin``, when present, must be the API's own (same host and port): a page elsewhere
  is refused (403), and so is ``Origin: null`` (a sandboxed frame, a file). Requests with
  neither (curl, the CLI, a server) pass. A browser's ``Sec-Fetch-Site`` saying another site
  (or another port of this one) is refused too, except for a top-level navigation.
* A change (any method but GET, HEAD and OPTIONS) must be sent as JSON
  (``Content-Type: application/json``), which a cross-site page can only send after a CORS
  preflight that the API, with no CORS, never grants (415 otherwise).

Every response carries a Content-Security-Policy with ``frame-ancestors 'none'`` (no page
may frame the console to trick a click), ``X-Frame-Options``, ``nosniff`` and no referrer:
the console's policy lets it load its own scripts and styles only, the API docs' also the
pinned Swagger UI files (:data:`SWAGGER_UI`).
"""

from __future__ import annotations

from collections.abc import Iterable
from urllib.parse import urlsplit

from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from baton.api.auth import is_loopback
from baton.errors import ConfigError
from baton.observability.log import get_logger

__all__ = ["API_CSP", "CONSOLE_CSP", "DOCS_CSP", "SWAGGER_UI", "Guard", "allowed_hosts"]

log = get_logger("baton.api")

#: Swagger UI for /docs, pinned to one release with Subresource Integrity (the digests of
#: swagger-ui-dist's files as published to npm, which the CDN serves byte for byte): a
#: changed file is not run. FastAPI's get_swagger_ui_html takes other URLs but no integrity
#: and inlines its start script, which the policy below would refuse; the page is built here.
SWAGGER_UI = {
    "version": "5.36.0",
    "js": "https://cdn.jsdelivr.net/npm/swagger-ui-dist@5.36.0/swagger-ui-bundle.js",
    "js_integrity": "sha384-fUpRgC19yPykTqzdrUbdAg8NTiu16NEKf9U12J+IJWCg8/1mEI8f2+PEIz60Wyd+",
    "css": "https://cdn.jsdelivr.net/npm/swagger-ui-dist@5.36.0/swagger-ui.css",
    "css_integrity": "sha384-z/AtSaOHGn5MJ5auAHXUypohywlIWLBZo1jeGmhdpVIbCnFhxAH92cwdV41oyINc",
}
_CDN = "https://cdn.jsdelivr.net"
_NEVER_FRAMED = "frame-ancestors 'none'; base-uri 'none'; form-action 'none'; object-src 'none'"
#: The API's answers (JSON, event streams) load nothing.
API_CSP = f"default-src 'none'; {_NEVER_FRAMED}"
#: The console: its own script, styles and API, nothing inline.
CONSOLE_CSP = (f"default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
               f"connect-src 'self'; {_NEVER_FRAMED}")
#: The docs: the pinned Swagger UI files too (whose components set inline styles).
DOCS_CSP = (f"default-src 'none'; script-src 'self' {_CDN}; "
            f"style-src 'self' 'unsafe-inline' {_CDN}; img-src 'self' data:; "
            f"connect-src 'self'; {_NEVER_FRAMED}")
_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
_WILDCARD = frozenset({"", "0.0.0.0", "::"})


def allowed_hosts(bound: str, configured: str) -> frozenset[str] | None:
    """The host names a request's Host may carry besides loopback ones (lower case, no
    port); None: any (``*``). ConfigError for an API bound to every address without
    ``BATON_API_HOSTS``: it would refuse every client that is not on this machine."""
    names = {n.strip().lower() for n in configured.split(",") if n.strip()}
    if "*" in names:
        return None
    address = bound.strip("[]").lower()
    if address not in _WILDCARD:
        names.add(address)
    elif not names:
        raise ConfigError(f"the API is bound to {bound or 'every address'}: name the host "
                          "names its clients use in BATON_API_HOSTS (comma-separated; '*' "
                          "for any, behind a proxy that checks Host)")
    return frozenset(names)


def _host_name(netloc: str) -> str:
    """``netloc``'s host, lower case, without port or IPv6 brackets."""
    try:
        host = urlsplit(f"//{netloc}").hostname
    except ValueError:
        return ""
    return (host or "").lower()


def _same_netloc(a: str, b: str, scheme: str) -> bool:
    """Whether two ``host[:port]`` name the same host and port (default ports filled in)."""
    default = 443 if scheme == "https" else 80
    try:
        x, y = urlsplit(f"//{a}"), urlsplit(f"//{b}")
        return (x.hostname, x.port or default) == (y.hostname, y.port or default)
    except ValueError:
        return False


class Guard:
    """ASGI middleware: the checks and headers of this module's docstring."""

    def __init__(self, app: ASGIApp, hosts: frozenset[str] | None) -> None:
        self.app, self.hosts = app, hosts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        refusal = self.refusal(scope)
        if refusal is not None:
            from baton.api.problems import problem_response

            status, code, detail = refusal
            log.warning("api_request_refused", path=scope.get("path"), code=code,
                        detail=detail[:200])
            response = problem_response(status, code, detail, Request(scope))
            await response(scope, receive, self._headed(scope, send))
            return
        await self.app(scope, receive, self._headed(scope, send))

    def refusal(self, scope: Scope) -> tuple[int, str, str] | None:
        """(status, code, detail) when the request must be refused, else None."""
        headers = Headers(scope=scope)
        host = headers.get("host", "")
        name = _host_name(host)
        if not name or not (is_loopback(name) or self.hosts is None or name in self.hosts):
            return (400, "host_not_allowed", f"Host {host[:100]!r} does not name this API "
                    "(a loopback name, its address or one of BATON_API_HOSTS)")
        origin = headers.get("origin")
        if origin is not None:
            parts = urlsplit(origin) if origin != "null" else None
            if parts is None or parts.scheme not in ("http", "https") or \
                    not _same_netloc(parts.netloc, host, parts.scheme):
                return (403, "cross_origin", f"requests from pages of {origin[:100]!r} are "
                        "refused: the API answers its own pages only (no CORS)")
        fetch_site = headers.get("sec-fetch-site")
        if fetch_site in ("cross-site", "same-site") and \
                headers.get("sec-fetch-mode") != "navigate":
            return (403, "cross_origin", "requests from another site's pages are refused")
        if scope["method"] not in _SAFE_METHODS:
            kind = headers.get("content-type", "").partition(";")[0].strip().lower()
            if kind != "application/json":
                return (415, "json_required", f"a {scope['method']} must send its body as JSON "
                        f"(Content-Type: application/json), not {kind or 'no content type'!r}")
        return None

    @staticmethod
    def _headed(scope: Scope, send: Send) -> Send:
        path = str(scope.get("path", ""))
        csp = CONSOLE_CSP if path.startswith("/console") else \
            DOCS_CSP if path == "/docs" else API_CSP

        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start":
                raw = list(message.get("headers") or [])
                have = {k.lower() for k, _ in raw}
                extra: Iterable[tuple[bytes, bytes]] = (
                    (b"content-security-policy", csp.encode()),
                    (b"x-frame-options", b"DENY"),
                    (b"x-content-type-options", b"nosniff"),
                    (b"referrer-policy", b"no-referrer"))
                raw += [(k, v) for k, v in extra if k not in have]
                message = {**message, "headers": raw}
            await send(message)

        return sending
