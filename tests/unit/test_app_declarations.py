"""An App's declarations are checked when it is made: a tool that cannot run, a name declared
twice, something else than a declaration; and ``--app module:app`` finds a module in the
current directory, as ``python -m`` does."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from baton.app import Agent, App, load_app, tool
from baton.errors import ConfigError


class Args(BaseModel):
    to: str


def test_a_tool_that_cannot_run_is_refused_when_declared() -> None:
    sent: list[str] = []

    def sync_send(args: Args, ctx: Any) -> dict[str, str]:
        sent.append(args.to)  # would run, then fail when awaited
        return {}

    with pytest.raises(ConfigError, match="is not an async function"):
        tool(name="sync_send", replay="safe")(sync_send)

    async def no_ctx(args: Args) -> None: ...

    async def three(args: Args, ctx: Any, extra: int) -> None: ...

    for fn in (no_ctx, three):
        with pytest.raises(ConfigError, match="two positional parameters"):
            tool(name=fn.__name__, replay="safe")(fn)

    async def ok(args: Args, ctx: Any) -> None: ...

    for bad in (-1, 0, "5", True):
        with pytest.raises(ConfigError, match="timeout must be a number of seconds more"):
            tool(name="ok", replay="safe", timeout=bad)(ok)
    with pytest.raises(ConfigError, match="retry_on is a tuple of exception classes"):
        tool(name="ok", replay="safe", retry_on=("ValueError",))(ok)
    one = tool(name="ok", replay="safe", retry_on=ValueError)(ok)  # type: ignore[arg-type]
    assert one.retry_on == (ValueError,)

    class Local(BaseModel):
        to: str

    async def later(args: Local, ctx: Any) -> None: ...

    later.__annotations__ = {"args": "Local", "ctx": "Any"}  # as `from __future__` leaves them
    with pytest.raises(ConfigError, match="annotations cannot be resolved"):
        tool(name="later", replay="safe")(later)
    assert tool(name="ok", replay="safe")(ok).timeout == 30.0
    assert sent == []


def test_names_declared_twice_and_undecorated_tools_are_refused() -> None:
    async def send(args: Args, ctx: Any) -> None: ...

    safe, unsafe = tool(name="t", replay="safe")(send), tool(name="t", replay="unsafe")(send)
    with pytest.raises(ConfigError, match="tool t declared twice"):
        App(agents=[], tools=[safe, unsafe])
    with pytest.raises(ConfigError, match="agent a declared twice"):
        App(agents=[Agent(name="a", tools=("t",)), Agent(name="a")], tools=[safe])
    with pytest.raises(ConfigError, match="decorate the function with @tool"):
        App(agents=[], tools=[send])  # type: ignore[list-item]


def test_an_agents_tools_given_as_one_string_are_refused() -> None:
    """("lookup_order") is a string, not a one-name tuple: it read as the tools l, o, o, k."""
    with pytest.raises(ConfigError, match=r"tools=\('lookup_order',\)"):
        Agent(name="a", tools=("lookup_order"))  # type: ignore[arg-type]  # no comma
    with pytest.raises(ConfigError, match=r"mcp=\('files',\)"):
        Agent(name="a", mcp="files")  # type: ignore[arg-type]
    assert Agent(name="a", tools=("lookup_order",)).tools == ("lookup_order",)


def test_an_app_module_in_the_current_directory_is_found(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "baton_cwd_app.py").write_text(
        "from baton import App\napp = App(agents=[], tools=[])\n")
    monkeypatch.chdir(tmp_path)
    # As under the `baton` console script: neither "" nor the directory on the path.
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    monkeypatch.delitem(sys.modules, "baton_cwd_app", raising=False)
    assert isinstance(load_app("baton_cwd_app:app"), App)


def test_an_app_of_tasks_alone_is_declared_and_a_brain_needs_an_agent() -> None:
    """App(tasks=[...]) was a TypeError (reported as a bug in Baton); a Brain for an app with
    no agent started and consumed nothing, silently."""
    from baton import TaskDef
    from baton.brain.worker import BrainWorker
    from baton.settings import Settings

    job = TaskDef("job", start="start")
    app = App(tasks=[job])
    assert app.tasks == [job] and app.agents == {} and app.tools == {}
    with pytest.raises(ConfigError, match="needs at least one agent"):
        BrainWorker(Settings(), app)


def test_a_brain_refuses_to_start_with_a_model_it_cannot_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An unknown model name or a provider without its key stops the Brain's start with the
    reason; it started and failed every session with a model_error."""
    from baton import Agent
    from baton.brain.worker import BrainWorker
    from baton.settings import Settings

    for name in ("OPENAI_API_KEY", "BATON_OPENAI_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ConfigError, match="unknown model 'gpt-4o'"):
        BrainWorker(Settings(), App(agents=[Agent(name="oops", model="gpt-4o")]))
    with pytest.raises(ConfigError, match="needs OPENAI_API_KEY"):
        BrainWorker(Settings(), App(agents=[Agent(name="a", model="openai:gpt-4o-mini")]))
    own = App(agents=[Agent(name="b", model="mine")], models={"mine": object()})
    assert BrainWorker(Settings(), own)._models == {}  # the app's own client: nothing built
    assert "scripted" in BrainWorker(Settings(), App(agents=[Agent(name="c")]))._models


def test_an_app_module_that_fails_is_the_apps_error_not_a_bug_in_baton(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "baton_boom_app.py").write_text("x = 1\nraise RuntimeError('boom in my app')\n")
    (tmp_path / "baton_ok_app.py").write_text("from baton import App\napp = App()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("baton_boom_app", "baton_ok_app"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    with pytest.raises(ConfigError, match=r"importing app module 'baton_boom_app' failed: "
                                          r"RuntimeError: boom in my app \(at "
                                          r"baton_boom_app.py:2\)"):
        load_app("baton_boom_app:app")
    with pytest.raises(ConfigError, match="app module 'baton_ok_app' has no attribute 'nope'"):
        load_app("baton_ok_app:nope")
    (tmp_path / "baton_typo_app.py").write_text("x = 1\ndef f(:\n")
    monkeypatch.delitem(sys.modules, "baton_typo_app", raising=False)
    with pytest.raises(ConfigError, match=r"SyntaxError: .*\(at baton_typo_app.py:2\)"):
        load_app("baton_typo_app:app")


def test_a_missing_extra_names_the_extra_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    from baton.mcp import MCPServer

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "mcp" else real(name, *a))
    with pytest.raises(ConfigError, match=r"pip install '\.\[mcp\]'"):
        MCPServer("files", command=["mcp-files"])
    monkeypatch.setitem(sys.modules, "pydantic_ai", None)  # import pydantic_ai fails
    for name in [m for m in sys.modules if m.startswith("baton.pydantic_ai")]:
        monkeypatch.delitem(sys.modules, name)
    with pytest.raises(ModuleNotFoundError, match=r"pip install '\.\[pydantic-ai\]'"):
        importlib.import_module("baton.pydantic_ai")
