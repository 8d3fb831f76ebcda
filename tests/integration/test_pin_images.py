"""deploy/pin_images.py against a registry on the loopback that speaks the Docker Registry
HTTP API v2 as Docker Hub does (an anonymous bearer token per repository, then the tag's
digest in ``Docker-Content-Digest``), on copies of the deploy files."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import threading
import urllib.parse
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
TOOL = DEPLOY / "pin_images.py"
INDEX = "application/vnd.oci.image.index.v1+json"


def digest_of(repo: str, tag: str) -> str:
    return "sha256:" + hashlib.sha256(f"{repo}:{tag}".encode()).hexdigest()


class Registry(BaseHTTPRequestHandler):
    """Tokens at /token; manifests only with the repository's token and an Accept that
    takes a multi-platform index; ``broken`` repositories answer without a digest."""

    broken: set[str] = set()
    asked: list[str] = []

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        url = urllib.parse.urlparse(self.path)
        query = urllib.parse.parse_qs(url.query)
        scope = query.get("scope", [""])[0]
        if url.path != "/token" or not scope.endswith(":pull"):
            self.send_error(404)
            return
        body = json.dumps({"token": f"tok-{scope.split(':')[1]}"}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_HEAD(self) -> None:
        path = self.path.removeprefix("/v2/")
        repo, _, tag = path.partition("/manifests/")
        self.asked.append(f"{repo}:{tag}")
        if self.headers.get("Authorization") != f"Bearer tok-{repo}":
            host = self.headers["Host"]
            self.send_response(401)
            self.send_header("WWW-Authenticate", f'Bearer realm="http://{host}/token",'
                             f'service="registry.test",scope="repository:{repo}:pull"')
            self.end_headers()
            return
        if INDEX not in self.headers.get("Accept", ""):
            self.send_error(406)
            return
        self.send_response(200)
        self.send_header("Content-Type", INDEX)
        if repo not in self.broken:
            self.send_header("Docker-Content-Digest", digest_of(repo, tag))
        self.end_headers()


@pytest.fixture
def registry() -> Iterator[str]:
    Registry.broken, Registry.asked = set(), []
    server = ThreadingHTTPServer(("127.0.0.1", 0), Registry)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def copies(tmp_path: Path) -> list[Path]:
    out = []
    for name in ("compose.yaml", "k8s/redis.yaml", "k8s/brain.yaml"):
        target = tmp_path / name.replace("/", "-")
        shutil.copy(DEPLOY / name, target)
        out.append(target)
    return out


def tool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(TOOL), *args], capture_output=True, text=True,
                          timeout=60, check=False)


def test_every_third_party_image_is_pinned_to_its_registrys_digest(
    registry: str, tmp_path: Path
) -> None:
    files = copies(tmp_path)
    before = tool("--check", *map(str, files))
    assert before.returncode == 1 and "unpinned: compose.yaml" in before.stderr
    assert "redis:7.2.11" in before.stderr and "baton" not in before.stderr

    done = tool("--registry", f"docker.io={registry}", *map(str, files))
    assert done.returncode == 0, done.stderr
    compose = files[0].read_text()
    for ref, repo, tag in (("nats:2.15.1-alpine", "library/nats", "2.15.1-alpine"),
                           ("redis:7.2.11", "library/redis", "7.2.11"),
                           ("jaegertracing/all-in-one:1.62.0", "jaegertracing/all-in-one",
                            "1.62.0")):
        assert f"image: {ref}@{digest_of(repo, tag)}" in compose
    assert f"image: redis:7.2.11@{digest_of('library/redis', '7.2.11')}" in files[1].read_text()
    # Images Baton builds are left to whoever pushes them; everything else is as it was.
    assert "image: ${BATON_IMAGE:-baton:latest}\n" in compose
    assert files[2].read_text() == (DEPLOY / "k8s" / "brain.yaml").read_text()
    original = (DEPLOY / "compose.yaml").read_text().splitlines()
    changed = [(a, b) for a, b in zip(original, compose.splitlines(), strict=True) if a != b]
    assert len(changed) == 4  # nats (one anchor for three nodes), redis, the collector, jaeger
    assert all(a.strip().startswith("image:") and "@sha256:" in b for a, b in changed)
    assert tool("--check", *map(str, files)).returncode == 0

    # Pinned images are not asked for again, unless refreshed.
    Registry.asked.clear()
    assert tool("--registry", f"docker.io={registry}", *map(str, files)).returncode == 0
    assert Registry.asked == []


def test_a_registry_that_names_no_digest_leaves_the_image_as_it_was(
    registry: str, tmp_path: Path
) -> None:
    files = copies(tmp_path)
    Registry.broken = {"library/redis"}
    done = tool("--registry", f"docker.io={registry}", *map(str, files))
    assert done.returncode == 1 and "named no sha256 digest" in done.stderr
    assert "image: redis:7.2.11\n" in files[0].read_text()
    assert "image: nats:2.15.1-alpine@sha256:" in files[0].read_text()


def test_check_reads_the_shipped_files_and_names_each_unpinned_image() -> None:
    """--check on the real deploy files (no network) names exactly the third-party images
    without a digest (every one today: digests come from the registry at deploy time)."""
    expected = set()
    for path in [DEPLOY / "compose.yaml", *sorted((DEPLOY / "k8s").glob("*.yaml"))]:
        for line in path.read_text().splitlines():
            ref = line.strip().removeprefix("- ").removeprefix("image:").strip()
            # Baton's own (k8s: named in kustomization's images); a mapping (Helm values)
            own = "baton:" in ref or ref.split()[:1] in ([], ["baton"])
            if line.strip().startswith(("image:", "- image:")) and not own \
                    and "@sha256:" not in ref:
                expected.add(ref.split()[0])
    done = tool("--check")
    named = {line.split(": ")[-1] for line in done.stderr.splitlines()}
    assert named == expected and done.returncode == (1 if expected else 0), done.stderr
