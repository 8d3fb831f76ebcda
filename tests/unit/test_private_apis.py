"""Baton uses its dependencies through their public APIs: no private module of a dependency is
imported, and no private attribute Baton does not define itself is read or written, anywhere
but the one adapter module per library in ``baton.adapters`` (see its docstring).

A private name is one with a leading underscore (dunders aside). An attribute access
``x._name`` (or ``getattr(x, "_name")``) is Baton's own when some Baton module defines
``_name``: a function or method, a class attribute, an assignment to ``self._name`` or a
module-level name. Any other is a dependency's internals, and a minor release of that
dependency may change it without notice: redis-py 8.2 did, and every ``Client.wait`` took a
second.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: The source roots of ``baton`` (pyproject's [tool.setuptools.package-dir]).
SOURCES = ("shared", "brain", "hands", "relay", "api", "examples", "bench")
ADAPTERS = ROOT / "shared" / "baton" / "adapters"
#: Underscored names that are documented public API: ``os._exit``, named tuples' methods.
DOCUMENTED = frozenset({"_exit", "_replace", "_asdict", "_fields", "_make"})


def _modules() -> Iterator[Path]:
    for folder in SOURCES:
        for path in sorted((ROOT / folder).rglob("*.py")):
            if ADAPTERS not in path.parents:
                yield path


def _private(name: str) -> bool:
    return (name.startswith("_") and not (name.startswith("__") and name.endswith("__"))
            and name not in DOCUMENTED)


def _defined(trees: dict[Path, ast.Module]) -> set[str]:
    """Every private name some Baton module defines."""
    names: set[str] = set()
    for tree in trees.values():
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names.add(node.name)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                names.add(node.target.id)
            elif isinstance(node, ast.alias):
                names.add(node.asname or node.name.rpartition(".")[2])
            elif isinstance(node, ast.arg):
                names.add(node.arg)
            elif isinstance(node, ast.Assign) and any(
                    isinstance(t, ast.Name) and t.id == "__slots__" for t in node.targets):
                names.update(c.value for c in ast.walk(node.value)
                             if isinstance(c, ast.Constant) and isinstance(c.value, str))
    return {n for n in names if _private(n)}


def _third_party(module: str) -> bool:
    return module.split(".")[0] not in ("baton", "tests", "__future__")


def _findings(path: Path, tree: ast.Module, ours: set[str]) -> Iterator[str]:
    where = path.relative_to(ROOT)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and _third_party(node.module):
            private_module = any(_private(p) for p in node.module.split("."))
            private_names = [a.name for a in node.names if _private(a.name)]
            if private_module or private_names:
                yield f"{where}:{node.lineno}: from {node.module} import {private_names or '...'}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if _third_party(alias.name) and any(_private(p) for p in alias.name.split(".")):
                    yield f"{where}:{node.lineno}: import {alias.name}"
        elif isinstance(node, ast.Attribute) and _private(node.attr) and node.attr not in ours:
            yield f"{where}:{node.lineno}: .{node.attr}"
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
              and node.func.id in ("getattr", "setattr", "hasattr", "delattr")
              and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant)
              and isinstance(node.args[1].value, str) and _private(node.args[1].value)
              and node.args[1].value not in ours):
            yield f"{where}:{node.lineno}: {node.func.id}(..., {node.args[1].value!r})"


def test_no_private_api_of_a_dependency_outside_the_adapters() -> None:
    trees = {path: ast.parse(path.read_text(), str(path)) for path in _modules()}
    ours = _defined(trees)
    found = [f for path, tree in trees.items() for f in _findings(path, tree, ours)]
    assert not found, (
        "private APIs of dependencies used outside baton.adapters (use the public API, or "
        "move the use into baton/adapters/<library>.py with a version check, a public "
        "fallback and a contract test):\n" + "\n".join(found))


def test_the_check_finds_what_it_looks_for() -> None:
    """The check itself: each kind of private use is found, Baton's own names are not."""
    source = (
        "from redis._parsers.hiredis import NOT_ENOUGH_DATA\n"
        "from httpx import _client\n"
        "import nats.aio._x\n"
        "class A:\n"
        "    def __init__(self, sub):\n"
        "        self._mine = 1\n"
        "        sub._pending_queue.get_nowait()\n"
        "        getattr(sub, '_conn')\n"
        "        other._mine\n"
    )
    tree = ast.parse(source)
    found = list(_findings(ROOT / "shared" / "baton" / "x.py", tree, _defined({ROOT: tree})))
    assert len(found) == 5, found
    assert not any("_mine" in f for f in found)
