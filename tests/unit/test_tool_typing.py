"""A decorated tool is typed as the function it wraps: calling one directly (in a test, say)
returns what the function returns, and mypy refuses arguments of another model.

mypy checks a snippet against the package from its source roots (the ``mypy_path`` of
pyproject.toml), as ``make lint`` does."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

SNIPPET = '''
from typing import assert_type

from pydantic import BaseModel

from baton import Tool, ToolContext, tool


class Args(BaseModel):
    to: str


@tool
async def plain(args: Args, ctx: ToolContext) -> dict[str, int]:
    return {"n": 1}


@tool(replay="safe", timeout=5)
async def with_options(args: Args, ctx: ToolContext) -> str:
    return "sent"


async def use(ctx: ToolContext) -> None:
    assert_type(plain, Tool[Args, dict[str, int]])
    assert_type(await plain(Args(to="a"), ctx), dict[str, int])
    assert_type(await with_options(Args(to="a"), ctx), str)
    await plain(1, ctx)  # the one error expected
'''


def test_a_decorated_tool_keeps_its_argument_and_return_types(tmp_path: Path) -> None:
    if shutil.which("mypy", path=str(Path(sys.executable).parent)) is None:
        pytest.skip("mypy is not installed (it comes with the dev set: make venv)")
    # The package from its source roots (the config's mypy_path), the snippet from here.
    (tmp_path / "snippet.py").write_text(SNIPPET)
    done = subprocess.run(
        [str(Path(sys.executable).parent / "mypy"), "--config-file", str(ROOT / "pyproject.toml"),
         "--cache-dir", str(tmp_path / "cache"), "snippet.py"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300)
    errors = [line for line in done.stdout.splitlines() if ": error:" in line]
    assert len(errors) == 1, done.stdout + done.stderr
    assert 'incompatible type "int"; expected "Args"' in errors[0]
