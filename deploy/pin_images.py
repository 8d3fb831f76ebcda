#!/usr/bin/env python3
"""Pin the deploy files' container images to the digests their registries serve now.

A tag (``redis:7.2.11``) can be moved to other contents by whoever controls the repository;
a digest (``redis:7.2.11@sha256:...``) cannot. This tool asks each image's registry (the
Docker Registry HTTP API v2, as ``docker buildx imagetools inspect`` does) for the digest of
its tag, the multi-platform index where there is one, and writes ``name:tag@digest`` into
the files, keeping the tag for people to read.

    python3 deploy/pin_images.py            # pin every unpinned image of compose and k8s
    python3 deploy/pin_images.py --check    # exit 1 naming any image still unpinned
    python3 deploy/pin_images.py --refresh  # resolve pinned ones again (after a new tag)

Images Baton builds itself are skipped (compose's ``${BATON_IMAGE:-baton:latest}``, the k8s
manifests' ``baton``, which kustomization.yaml's ``images:`` names): pin the one you push
in your own registry, there. Standard library only, so it runs
where Baton is not installed. Anonymous pulls only (Docker Hub's public images); behind a
mirror, ``--registry docker.io=mirror.example:5000`` sends that registry's requests there.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

DEPLOY = Path(__file__).resolve().parent
FILES = [DEPLOY / "compose.yaml", *sorted((DEPLOY / "k8s").glob("*.yaml"))]
#: Images built from deploy/Dockerfile: pinned by whoever builds and pushes them.
OWN = ("baton:", "${BATON_IMAGE")
_IMAGE_LINE = re.compile(r"^(?P<lead>\s*(?:-\s*)?image:\s*)(?P<q>[\"']?)(?P<ref>[^\"'\s#]+)"
                         r"(?P=q)(?P<rest>.*)$")
_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
_ACCEPT = ", ".join((
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
))
_TIMEOUT_S = 20.0


class PinError(Exception):
    """An image whose digest could not be found (the message says why)."""


def parse(ref: str) -> tuple[str, str, str, str]:
    """(registry, repository, tag, digest) of an image reference; docker.io's official
    images get their ``library/`` prefix."""
    name, _, digest = ref.partition("@")
    slash = name.find("/")
    first = name[:slash] if slash >= 0 else ""
    if first and ("." in first or ":" in first or first == "localhost"):
        registry, rest = first, name[slash + 1:]
    else:
        registry, rest = "docker.io", name
    colon = rest.rfind(":")
    repo, tag = (rest[:colon], rest[colon + 1:]) if colon > rest.rfind("/") else (rest, "")
    if registry == "docker.io" and "/" not in repo:
        repo = f"library/{repo}"
    return registry, repo, tag, digest


def _request(url: str, method: str, headers: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
    req = urllib.request.Request(url, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=_TIMEOUT_S) as resp:
            return resp.status, {k.lower(): v for k, v in resp.headers.items()}, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, {k.lower(): v for k, v in exc.headers.items()}, exc.read()


def _bearer(challenge: str) -> dict[str, str]:
    """The parameters of a ``WWW-Authenticate: Bearer realm=...,service=...`` challenge."""
    scheme, _, params = challenge.partition(" ")
    if scheme.lower() != "bearer":
        raise PinError(f"the registry asks for {scheme!r} authentication; only anonymous "
                       "bearer tokens are supported")
    return dict(re.findall(r'(\w+)="([^"]*)"', params))


def resolve(ref: str, endpoints: dict[str, str]) -> str:
    """The digest the registry serves for ``ref``'s tag now."""
    registry, repo, tag, _ = parse(ref)
    if not tag:
        raise PinError(f"{ref}: no tag to resolve")
    host = endpoints.get(registry, "registry-1.docker.io" if registry == "docker.io"
                         else registry)
    scheme = "http" if host.startswith(("127.0.0.1", "localhost", "[::1]")) else "https"
    url = f"{scheme}://{host}/v2/{repo}/manifests/{urllib.parse.quote(tag)}"
    headers = {"Accept": _ACCEPT}
    status, got, _ = _request(url, "HEAD", headers)
    if status == 401 and "www-authenticate" in got:
        auth = _bearer(got["www-authenticate"])
        realm = auth.pop("realm", "")
        if not realm.startswith(("https://", "http://127.0.0.1", "http://localhost")):
            raise PinError(f"{ref}: the registry's token realm {realm!r} is not https")
        auth.setdefault("scope", f"repository:{repo}:pull")
        code, _, body = _request(f"{realm}?{urllib.parse.urlencode(auth)}", "GET", {})
        if code != 200:
            raise PinError(f"{ref}: the token service answered {code}")
        token = json.loads(body).get("token") or json.loads(body).get("access_token")
        if not token:
            raise PinError(f"{ref}: the token service gave no token")
        status, got, _ = _request(url, "HEAD", {**headers, "Authorization": f"Bearer {token}"})
    if status != 200:
        raise PinError(f"{ref}: {url} answered {status}")
    digest = got.get("docker-content-digest", "")
    if not _DIGEST.match(digest):
        raise PinError(f"{ref}: the registry named no sha256 digest ({digest[:80]!r})")
    return digest


def pin_file(path: Path, endpoints: dict[str, str], refresh: bool,
             found: dict[str, str]) -> list[str]:
    """Pin ``path``'s images in place (``found``: refs already resolved, shared between
    files); the problems met."""
    problems = []
    lines = path.read_text().splitlines(keepends=True)
    for i, line in enumerate(lines):
        match = _IMAGE_LINE.match(line.rstrip("\n"))
        if match is None or _own(match["ref"]):
            continue
        ref = match["ref"]
        name, _, pinned = ref.partition("@")
        if pinned and not refresh:
            continue
        try:
            digest = found.get(name) or resolve(name, endpoints)
        except (PinError, OSError, ValueError) as exc:
            problems.append(f"{path.name}:{i + 1}: {name}: {exc}")
            continue
        found[name] = digest
        end = "\n" if line.endswith("\n") else ""
        lines[i] = (f"{match['lead']}{match['q']}{name}@{digest}{match['q']}"
                    f"{match['rest']}{end}")
    path.write_text("".join(lines))
    return problems


def _own(ref: str) -> bool:
    """Whether ``ref`` is Baton's own image (the k8s manifests name it just ``baton``)."""
    return ref == "baton" or ref.startswith(OWN)


def unpinned(path: Path) -> list[str]:
    out = []
    for i, line in enumerate(path.read_text().splitlines()):
        match = _IMAGE_LINE.match(line)
        if match and not _own(match["ref"]) and "@sha256:" not in match["ref"]:
            out.append(f"{path.name}:{i + 1}: {match['ref']}")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="*", type=Path, help="default: compose and k8s files")
    parser.add_argument("--check", action="store_true",
                        help="change nothing; exit 1 naming every image without a digest")
    parser.add_argument("--refresh", action="store_true",
                        help="resolve images that are pinned already, too")
    parser.add_argument("--registry", action="append", default=[], metavar="NAME=HOST",
                        help="send a registry's requests to another host (a mirror)")
    args = parser.parse_args(argv)
    files = args.files or FILES
    if args.check:
        missing = [line for path in files for line in unpinned(path)]
        for line in missing:
            print(f"unpinned: {line}", file=sys.stderr)
        return 1 if missing else 0
    endpoints = dict(item.split("=", 1) for item in args.registry if "=" in item)
    found: dict[str, str] = {}
    problems = [p for path in files for p in pin_file(path, endpoints, args.refresh, found)]
    for name, digest in sorted(found.items()):
        print(f"{name}@{digest}")
    for problem in problems:
        print(f"error: {problem}", file=sys.stderr)
    if problems:
        print("nothing was written for those images; from a machine that cannot reach their "
              "registries, name a mirror with --registry NAME=HOST, or pin them where you can "
              "reach the registries and commit the files", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
