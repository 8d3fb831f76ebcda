"""The distribution: one import package ``baton`` built from the role folders, and locks that pin
what pyproject.toml declares.

The repository keeps ``shared/ brain/ hands/ relay/ examples/ bench/ api/`` at the top, each a
source root holding its part of ``baton`` at its import path (``shared/baton/`` is ``baton``,
``brain/baton/brain/`` is ``baton.brain``; ``[tool.setuptools] packages`` and ``package-dir``).
A subpackage missing from that list builds without complaint and is simply absent from the
wheel, so the list is pinned against the folders on disk, and the wheel itself is built and
read.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
SETUPTOOLS = PYPROJECT["tool"]["setuptools"]
# What the sdist/wheel build reads; everything else in the repository stays out.
BUILD_INPUTS = ("pyproject.toml", "README.md", "LICENSE")
NOT_TOP_LEVEL = {"shared", "brain", "hands", "relay", "examples", "bench", "api", "tests"}


def source_packages() -> dict[str, Path]:
    """Every folder with an ``__init__.py`` under a mounted folder, by its ``baton.*`` name."""
    found = {}
    for package, folder in SETUPTOOLS["package-dir"].items():
        base = ROOT / folder
        for init in base.rglob("__init__.py"):
            if "__pycache__" in init.parts:
                continue
            rel = init.parent.relative_to(base).parts
            found[".".join((package, *rel))] = init.parent
    return found


def test_the_package_list_covers_every_folder_with_an_init() -> None:
    # Every source root's part of baton is mapped: shared/baton/ is the package, and each
    # role root's baton/<role>/ its subpackage, under a baton/ folder with no __init__.py
    # of its own (it would hide the package's) ...
    mounted = set(SETUPTOOLS["package-dir"].values())
    parts = {init.parent for init in ROOT.glob("*/baton/__init__.py")}
    parts |= {init.parent for init in ROOT.glob("*/baton/*/__init__.py")
              if init.parent.name == init.parents[2].name}
    assert mounted == {str(p.relative_to(ROOT)) for p in parts}
    assert [str(p.relative_to(ROOT)) for p in ROOT.glob("*/baton/__init__.py")] == [
        "shared/baton/__init__.py"]
    assert [p.parent.name for p in ROOT.glob("*/__init__.py")] == ["tests"]
    # ... and every package inside them is listed.
    assert sorted(SETUPTOOLS["packages"]) == sorted(source_packages())


def _pins(lock: Path) -> dict[str, str]:
    pins = {}
    for line in lock.read_text().splitlines():
        match = re.match(r"^([A-Za-z0-9._-]+)==([^\s;\\]+)", line)
        if match:
            pins[canonicalize_name(match[1])] = match[2]
    return pins


def test_the_locks_pin_every_declared_dependency_within_its_range() -> None:
    """`make lock` was run after the last change to the dependencies in pyproject.toml."""
    runtime = _pins(ROOT / "requirements" / "runtime.lock")
    dev = _pins(ROOT / "requirements" / "dev.lock")
    declared = [(Requirement(r), (runtime, dev)) for r in PYPROJECT["project"]["dependencies"]]
    declared += [(Requirement(r), (dev,))
                 for r in PYPROJECT["project"]["optional-dependencies"]["dev"]]
    for req, locks in declared:
        for pins in locks:
            name = canonicalize_name(req.name)
            assert name in pins, f"{req} is not in a lock: run make lock"
            assert req.specifier.contains(pins[name], prereleases=True), (
                f"{name}=={pins[name]} is outside {req}: run make lock")
    # The dev lock is built on the runtime lock: one version of each shared package.
    assert {n: v for n, v in dev.items() if n in runtime} == runtime


@pytest.mark.slow
def test_the_wheel_holds_one_package_its_command_and_its_data(tmp_path: Path) -> None:
    # Built from a copy of what the build reads: a build/ left in the checkout could
    # otherwise bring back files that no longer exist.
    src = tmp_path / "src"
    src.mkdir()
    for name in BUILD_INPUTS:
        shutil.copy(ROOT / name, src / name)
    for folder in SETUPTOOLS["package-dir"].values():
        shutil.copytree(ROOT / folder, src / folder,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "results"))
    # No build isolation: the locked setuptools in this environment, no index needed.
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
         "--wheel-dir", str(tmp_path / "dist"), str(src)],
        capture_output=True, text=True, check=False,
    )
    assert built.returncode == 0, built.stderr
    [wheel] = (tmp_path / "dist").glob("baton-*.whl")
    names = zipfile.ZipFile(wheel).namelist()

    top = {n.split("/", 1)[0] for n in names}
    [dist_info] = [t for t in top if t.endswith(".dist-info")]
    assert top == {"baton", dist_info}
    assert not top & NOT_TOP_LEVEL

    metadata = zipfile.ZipFile(wheel).read(f"{dist_info}/METADATA").decode()
    assert re.search(r"^License-Expression: Apache-2.0$", metadata, re.M), metadata[:800]
    assert re.search(r"^License-File: LICENSE$", metadata, re.M)
    assert f"{dist_info}/licenses/LICENSE" in names

    entry_points = zipfile.ZipFile(wheel).read(f"{dist_info}/entry_points.txt").decode()
    assert re.search(r"^baton = baton\.cli:main$", entry_points, re.M)

    lua = sorted(p.name for p in (ROOT / "shared" / "baton" / "store" / "lua").glob("*.lua"))
    assert lua
    assert sorted(n.rsplit("/", 1)[1] for n in names if n.startswith("baton/store/lua/")) == lua
    assert "baton/py.typed" in names
    # The web console's static files ship with the API (no front-end build at install).
    console = sorted(p.name for p in (ROOT / "api" / "baton" / "api" / "console").iterdir()
                     if p.suffix in (".html", ".js", ".css"))
    assert console
    assert sorted(n.rsplit("/", 1)[1] for n in names
                  if n.startswith("baton/api/console/")) == console

    # Every module of every mounted folder is in the wheel, at its baton.* path.
    expected = {
        "/".join(package.split(".")) + "/" + module.name
        for package, folder in source_packages().items()
        for module in folder.glob("*.py")
    }
    assert expected <= set(names)


def _docker_inputs() -> tuple[list[str], set[str]]:
    """What deploy/Dockerfile copies from the build context, and what its .dockerignore
    lets into the context (``!name`` and ``!folder/**`` lines)."""
    copied: list[str] = []
    for line in (ROOT / "deploy" / "Dockerfile").read_text().splitlines():
        words = line.split()
        if words[:1] == ["COPY"] and not any(w.startswith("--from") for w in words):
            copied += words[1:-1]
    ignore = (ROOT / "deploy" / "Dockerfile.dockerignore").read_text().splitlines()
    admitted = {line[1:].removesuffix("/**") for line in ignore if line.startswith("!")}
    return copied, admitted


@pytest.mark.slow
def test_the_image_builds_its_wheel_from_what_the_dockerfile_copies(tmp_path: Path) -> None:
    """The image's wheel stage sees only the files the Dockerfile copies (and the
    .dockerignore admits): a mounted folder left out fails the image build."""
    copied, admitted = _docker_inputs()
    assert set(copied) <= admitted, f"copied but kept out of the context: {set(copied) - admitted}"
    needed = {*BUILD_INPUTS, *(f.split("/")[0] for f in SETUPTOOLS["package-dir"].values())}
    assert needed <= set(copied), f"the wheel stage lacks {sorted(needed - set(copied))}"
    src = tmp_path / "context"
    src.mkdir()
    for name in copied:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name,
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "results"))
        else:
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(ROOT / name, src / name)
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
         "--wheel-dir", str(tmp_path / "dist"), str(src)],
        capture_output=True, text=True, check=False,
    )
    assert built.returncode == 0, built.stderr
    [wheel] = (tmp_path / "dist").glob("baton-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {"/".join(package.split(".")) + "/__init__.py" for package in source_packages()} <= names


def test_every_benchmark_names_a_module_of_the_package() -> None:
    """`baton bench` runs the installed baton.bench, so each entry must resolve there."""
    from baton.bench import BENCHES

    for name, module in BENCHES.items():
        assert module.startswith("baton.bench."), name
        assert importlib.util.find_spec(module) is not None, name
