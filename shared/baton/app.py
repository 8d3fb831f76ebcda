"""The app API: how users declare agents and tools. Brain and Hands load the same app.

    from pydantic import BaseModel
    from baton.app import Agent, App, tool

    class Args(BaseModel):
        to: str

    @tool(replay="confirm", timeout=10)
    async def send_email(args: Args, ctx: ToolContext) -> dict: ...

    @send_email.confirm
    async def _(operation_id: str, args: Args, ctx: ToolContext) -> dict | None: ...

    app = App(agents=[Agent(name="notices", tools=["send_email"])], tools=[send_email])

The Brain uses the tools' names, descriptions and JSON schemas; Hands run their code.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import os
import sys
import traceback
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Generic, Literal, Protocol, TypeVar, cast, get_type_hints, overload

import httpx
import orjson
from pydantic import BaseModel

from baton.budgets import parse_budgets
from baton.errors import ConfigError, ValidationError
from baton.limits import ToolLimit, parse_rate
from baton.models import NAME, ReplayPolicy
from baton.observability.log import get_logger
from baton.settings import Settings
from baton.store.documents import DocumentType


@dataclass
class ToolContext:
    """What a running tool may use: its identity, settings, a shared HTTP client (shared by
    every session's calls, so it keeps no cookies: pass one with the request that needs it)."""

    session_id: str
    run_id: str
    operation_id: str
    attempt: int
    settings: Settings
    http: httpx.AsyncClient
    cancelled: asyncio.Event = field(default_factory=asyncio.Event)
    log: Any = field(default_factory=lambda: get_logger("baton.tool"))


ToolFn = Callable[[Any, ToolContext], Awaitable[Any]]
#: A tool's arguments model and what it returns: a decorated tool, called directly (in a
#: test, say), is typed as the function it wraps.
A = TypeVar("A", bound=BaseModel)
R = TypeVar("R")
ConfirmFn = Callable[[str, Any, ToolContext], Awaitable[Any | None]]
Isolation = Literal["none", "process"]


class Tool(Generic[A, R]):
    """A declared tool: argument model, description, replay policy, timeout, confirm.

    ``isolation="process"`` runs each call in a child process holding none of the worker's
    credentials or environment (see :mod:`baton.hands.isolation`): it sees only ``env``,
    may allocate ``memory_mb`` beyond the interpreter, and is killed after ``wall_time_s``
    (default: ``timeout``). It has no network (only a loopback of its own, where the machine
    allows: see :func:`baton.hands.isolation.confinement`) unless it declares
    ``network=True``.

    ``max_concurrency`` caps the runs of the tool at once across every Hands replica, and
    ``rate`` (``"20/s"``, ``"600/min"``; ``burst`` at once) their starts: both are held in
    Redis for the whole fleet (:mod:`baton.store.limits`); a run waiting for either keeps
    its place in line and says what it waits for.

    An isolated tool must be importable by its module path (declared at
    a module's top level, not in ``__main__`` or inside a function); in the child its
    ``ctx.settings`` are the defaults and ``ctx.cancelled`` is never set (a cancelled or
    taken-over call is killed instead).
    """

    def __init__(
        self,
        fn: Callable[[A, ToolContext], Awaitable[R]],
        *,
        name: str | None = None,
        description: str | None = None,
        replay: ReplayPolicy = "unsafe",
        timeout: float = 30.0,
        version: int = 1,
        args_model: type[BaseModel] | None = None,
        approval: bool = False,
        retry_on: tuple[type[BaseException], ...] = (),
        isolation: Isolation = "none",
        env: Mapping[str, str] | None = None,
        memory_mb: int | None = None,
        wall_time_s: float | None = None,
        network: bool = False,
        max_concurrency: int = 0,
        rate: str | None = None,
        burst: int = 1,
    ) -> None:
        self.fn = fn
        self.name = name or fn.__name__.replace("_", "_")
        if not NAME.match(self.name):
            raise ConfigError(f"invalid tool name {self.name!r}")
        self.description = (description or inspect.getdoc(fn) or "").strip()
        if replay not in ("safe", "confirm", "unsafe"):
            raise ConfigError(f"tool {self.name}: unknown replay policy {replay!r}")
        self.replay: ReplayPolicy = replay
        _check_callable(fn, self.name)
        if (isinstance(timeout, bool) or not isinstance(timeout, int | float)
                or not timeout > 0):
            raise ConfigError(f"tool {self.name}: timeout must be a number of seconds more "
                              f"than 0, not {timeout!r}")
        self.timeout = timeout
        self.version = version
        # Each run waits for a person's approval bound to its exact arguments
        # (``baton approve``) before it is dispatched.
        self.approval = approval
        # Errors that prove the call had no effect: the whole call is retried with backoff
        # within its timeout (baton.hands.retries), whatever the replay policy.
        if isinstance(retry_on, type):  # one exception class, not in a tuple
            retry_on = (retry_on,)
        if not all(isinstance(e, type) and issubclass(e, BaseException) for e in retry_on):
            raise ConfigError(f"tool {self.name}: retry_on is a tuple of exception classes, "
                              f"not {retry_on!r}")
        self.retry_on = tuple(retry_on)
        # Fleet-wide: at most max_concurrency runs at once across every Hands, and the rate
        # (baton.store.limits); each Hands' own hands_concurrency still bounds its share.
        if isinstance(max_concurrency, bool) or not isinstance(max_concurrency, int) \
                or max_concurrency < 0:
            raise ConfigError(f"tool {self.name}: max_concurrency is a whole number of runs "
                              f"(0: no cap), not {max_concurrency!r}")
        if isinstance(burst, bool) or not isinstance(burst, int) or burst < 1:
            raise ConfigError(f"tool {self.name}: burst is a whole number from 1, not "
                              f"{burst!r}")
        try:
            self.limit = ToolLimit(max_concurrency, parse_rate(rate) if rate else 0.0, burst)
        except ConfigError as exc:
            raise ConfigError(f"tool {self.name}: {exc}") from None
        self.args_model = args_model or _first_arg_model(fn, self.name)
        self.confirm_fn: ConfirmFn | None = None
        self._parameters: tuple[type[BaseModel], bytes] | None = None
        if isolation not in ("none", "process"):
            raise ConfigError(f"tool {self.name}: unknown isolation {isolation!r}")
        if isolation == "none" and (env is not None or memory_mb is not None
                                    or wall_time_s is not None or network):
            raise ConfigError(f"tool {self.name}: env, memory_mb, wall_time_s and network "
                              f"need isolation='process'")
        if not isinstance(network, bool):
            raise ConfigError(f"tool {self.name}: network is True or False, not {network!r}")
        self.isolation: Isolation = isolation
        # Whether its child may reach the network; an isolated tool is cut off by default.
        self.network = network
        self.env: dict[str, str] = {str(k): str(v) for k, v in (env or {}).items()}
        if memory_mb is not None and memory_mb < 16:
            raise ConfigError(f"tool {self.name}: memory_mb must be at least 16")
        self.memory_mb = memory_mb
        self.wall_time_s = float(wall_time_s if wall_time_s is not None else timeout)
        # Where the child finds this tool again: the decorator leaves the Tool at that name.
        self.target = f"{fn.__module__}:{fn.__qualname__}"
        if isolation == "process" and ("<locals>" in fn.__qualname__
                                       or fn.__module__ == "__main__"):
            raise ConfigError(f"tool {self.name}: an isolated tool must be importable by "
                              f"module path; {self.target} is not")

    def confirm(self, fn: ConfirmFn) -> ConfirmFn:
        """Register ``confirm(operation_id, args, ctx)``: the found result, or None."""
        self.confirm_fn = fn
        return fn

    def check(self) -> None:
        if self.replay == "confirm" and self.confirm_fn is None:
            raise ConfigError(f"tool {self.name} has replay='confirm' but no confirm function")

    def parse_args(self, arguments: dict[str, Any]) -> BaseModel:
        from pydantic import ValidationError as PydanticValidationError

        try:
            return self.args_model.model_validate(arguments)
        except PydanticValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or '(root)'}: {e['msg']}"
                for e in exc.errors()
            )
            raise ValidationError(f"invalid arguments for {self.name}: {problems}") from None

    def schema(self) -> dict[str, Any]:
        """The function-calling declaration a model sees (a fresh dict on every call)."""
        # model_json_schema() costs ~120 µs and the Brain asks on every model request: keep
        # its JSON per argument model and hand out a fresh copy (~1 µs).
        cached = self._parameters
        if cached is None or cached[0] is not self.args_model:
            cached = (self.args_model, orjson.dumps(self.args_model.model_json_schema()))
            self._parameters = cached
        return {
            "name": self.name,
            "description": self.description,
            "parameters": orjson.loads(cached[1]),
        }

    async def __call__(self, args: A, ctx: ToolContext) -> R:
        return await self.fn(args, ctx)


def _check_callable(fn: Any, name: str) -> None:
    """A tool is ``async def tool(args, ctx)``: a sync function would run its body (and its
    effect) when called and fail when awaited; another signature fails at every call."""
    call = type(fn).__call__ if callable(fn) and not inspect.isroutine(fn) else fn
    if not (inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(call)):
        raise ConfigError(f"tool {name}: {getattr(fn, '__qualname__', fn)!r} is not an async "
                          f"function; declare it `async def {name}(args, ctx)`")
    try:
        inspect.signature(fn).bind(None, None)
    except TypeError:
        raise ConfigError(f"tool {name}: it must take two positional parameters, the "
                          f"arguments and the context: `async def {name}(args, ctx)`") from None
    except ValueError:  # no signature to read (a builtin): left to the first call
        pass


class _Declares(Protocol):
    """What ``@tool(...)`` with options returns: the decorator proper."""

    def __call__(self, fn: Callable[[A, ToolContext], Awaitable[R]], /) -> Tool[A, R]: ...


@overload
def tool(fn: Callable[[A, ToolContext], Awaitable[R]], /) -> Tool[A, R]: ...


@overload
def tool(
    fn: None = None,
    *,
    name: str | None = None,
    description: str | None = None,
    replay: ReplayPolicy = "unsafe",
    timeout: float = 30.0,
    version: int = 1,
    approval: bool = False,
    retry_on: tuple[type[BaseException], ...] = (),
    isolation: Isolation = "none",
    env: Mapping[str, str] | None = None,
    memory_mb: int | None = None,
    wall_time_s: float | None = None,
    network: bool = False,
    max_concurrency: int = 0,
    rate: str | None = None,
    burst: int = 1,
) -> _Declares: ...


def tool(
    fn: Callable[[A, ToolContext], Awaitable[R]] | None = None,
    *,
    name: str | None = None,
    description: str | None = None,
    replay: ReplayPolicy = "unsafe",
    timeout: float = 30.0,
    version: int = 1,
    approval: bool = False,
    retry_on: tuple[type[BaseException], ...] = (),
    isolation: Isolation = "none",
    env: Mapping[str, str] | None = None,
    memory_mb: int | None = None,
    wall_time_s: float | None = None,
    network: bool = False,
    max_concurrency: int = 0,
    rate: str | None = None,
    burst: int = 1,
) -> Tool[A, R] | _Declares:
    """Decorator declaring a tool; see the module docstring and :class:`Tool`."""

    def wrap(f: Callable[[A, ToolContext], Awaitable[R]]) -> Tool[A, R]:
        return Tool(f, name=name, description=description, replay=replay, timeout=timeout,
                    version=version, approval=approval, retry_on=retry_on,
                    isolation=isolation, env=env, memory_mb=memory_mb,
                    wall_time_s=wall_time_s, network=network,
                    max_concurrency=max_concurrency, rate=rate, burst=burst)

    # wrap is generic in the decorated function, as _Declares says; mypy binds its types
    # to this call instead, hence the cast
    return wrap(fn) if fn is not None else cast(_Declares, wrap)


def _first_arg_model(fn: Callable[..., Any], name: str) -> type[BaseModel]:
    try:
        hints = get_type_hints(fn)
    except NameError as exc:  # a string annotation of a class its module does not define
        raise ConfigError(
            f"tool {name}: its annotations cannot be resolved ({exc}); with `from __future__ "
            f"import annotations` the arguments' model must be defined at module level "
            f"(or declare Tool(fn, args_model=...))") from None
    params = list(inspect.signature(fn).parameters)
    model = hints.get(params[0]) if params else None
    if not (isinstance(model, type) and issubclass(model, BaseModel)):
        raise ConfigError(f"tool {name}: first parameter must be annotated with a pydantic model")
    return model


@dataclass(frozen=True)
class Agent:
    """A declared agent: its name, compat level, instructions, model and tools.

    ``compat`` is the level of the sessions this code creates and runs; ``migrates_from``
    lists older levels whose sessions it can take over (each is migrated to ``compat`` when
    a Brain of this app first runs it: see brain.versions).
    """

    name: str
    compat: int = 1
    instructions: str = ""
    model: str = "scripted"
    tools: Sequence[str] = ()  # kept as a tuple
    max_turns: int = 16
    migrates_from: Sequence[int] = ()  # kept as a tuple
    # MCP servers (``App(mcp=[...])``) whose tools this agent uses, all of them.
    mcp: Sequence[str] = ()  # kept as a tuple
    # Seconds a settled session of this agent stays in Redis before it is archived (then
    # removed from Redis; reads fall through to the archive, a new submission restores
    # it). None: the process's BATON_SESSION_RETENTION_S.
    retention: float | None = None

    def __post_init__(self) -> None:
        if not NAME.match(self.name):
            raise ConfigError(f"invalid agent name {self.name!r}: 1-64 of a-z 0-9 _ - "
                              f"starting with a letter")
        for what in ("tools", "mcp"):  # ("lookup") is a string: its letters are not names
            if isinstance(getattr(self, what), str):
                raise ConfigError(f"agent {self.name}: {what} is a tuple of names, not the "
                                  f"string {getattr(self, what)!r} (one name: "
                                  f"{what}=({getattr(self, what)!r},))")
        object.__setattr__(self, "tools", tuple(self.tools))
        object.__setattr__(self, "mcp", tuple(self.mcp))
        object.__setattr__(self, "migrates_from", tuple(self.migrates_from))
        if self.retention is not None and not self.retention > 0:
            raise ConfigError(f"agent {self.name}: retention must be a number of seconds "
                              f"> 0 (got {self.retention!r})")
        if self.compat < 1 or any(not 1 <= c < self.compat for c in self.migrates_from):
            raise ConfigError(f"agent {self.name}: compat must be >= 1 and migrates_from "
                              f"only older levels (got {self.compat}, {self.migrates_from})")

    @property
    def levels(self) -> tuple[int, ...]:
        """The compat levels whose wakes a Brain of this agent consumes."""
        return (self.compat, *sorted(set(self.migrates_from), reverse=True))


class App:
    """A set of agents, the tools they use, and optionally model clients of its own, custom
    task definitions (``baton.brain.tasks.TaskDef``), typed documents (``DocumentType``) and
    MCP servers whose tools Hands serve (``baton.mcp.MCPServer``)."""

    def __init__(
        self,
        agents: list[Agent] | None = None,
        tools: list[Tool] | None = None,
        models: dict[str, Any] | None = None,
        tasks: list[Any] | None = None,
        documents: list[DocumentType] | None = None,
        mcp: list[Any] | None = None,
        model_budgets: Mapping[str, Any] | None = None,
    ) -> None:
        agents, tools = list(agents or []), list(tools or [])
        declared: tuple[tuple[str, list[Any], type], ...] = (
            ("agent", agents, Agent), ("tool", tools, Tool),
            ("document type", documents or [], DocumentType))
        for kind, items, cls in declared:
            for item in items:
                if not isinstance(item, cls):
                    raise ConfigError(f"App {kind}s must be {cls.__name__} objects, not {item!r}"
                                      + (" (decorate the function with @tool)"
                                         if kind == "tool" and callable(item) else ""))
            names = [item.name for item in items]
            if twice := sorted({n for n in names if names.count(n) > 1}):
                raise ConfigError(f"{kind} {', '.join(twice)} declared twice in the App: "
                                  "each name must be unique")
        self.agents = {a.name: a for a in agents}
        self.tools = {t.name: t for t in tools}
        # Model clients the app brings itself, by the name agents use in ``model=``.
        self.models: dict[str, Any] = dict(models or {})
        # Task definitions for the Brain's registry (brain.registry), checked there.
        self.tasks: list[Any] = list(tasks or [])
        self.documents: dict[str, DocumentType] = {d.name: d for d in documents or []}
        # MCP servers: their tools join ``tools`` when discovered (Hands) or announced
        # (Brain, baton.mcp.catalog, which notes when it last looked).
        self.mcp: list[Any] = list(mcp or [])
        self.mcp_learned_ms = 0
        # Fleet-wide budgets of models by provider/model (baton.budgets: ModelBudget or its
        # JSON object); BATON_MODEL_BUDGETS' entries win over these.
        self.model_budgets = parse_budgets(model_budgets or {})
        for t in tools:
            t.check()
        servers = {s.name for s in self.mcp}
        for a in agents:
            missing = [t for t in a.tools if t not in self.tools]
            if missing:
                raise ConfigError(f"agent {a.name} uses undeclared tools: {', '.join(missing)}")
            if unknown := [s for s in a.mcp if s not in servers]:
                raise ConfigError(f"agent {a.name} uses undeclared MCP servers: "
                                  f"{', '.join(unknown)}")

    def agent_tools(self, agent: Agent) -> tuple[str, ...]:
        """The tools ``agent`` may call: its own, and those known now of its MCP servers."""
        if not agent.mcp:
            return tuple(agent.tools)
        served = tuple(name for name, t in self.tools.items()
                       if getattr(getattr(t, "server", None), "name", None) in agent.mcp
                       and name not in agent.tools)
        return (*agent.tools, *served)

    def with_model(self, model: str) -> App:
        """The same app with every agent on ``model`` (``BATON_AGENT_MODEL``)."""
        return App(agents=[replace(a, model=model) for a in self.agents.values()],
                   tools=list(self.tools.values()), models=self.models, tasks=self.tasks,
                   documents=list(self.documents.values()), model_budgets=self.model_budgets)

    def agent(self, name: str) -> Agent:
        try:
            return self.agents[name]
        except KeyError:
            raise ConfigError(
                f"unknown agent {name!r}; this app declares: {', '.join(self.agents)}"
            ) from None


def load_app(spec: str) -> App:
    """Import ``module:attribute`` and return the App it names."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ConfigError(f"--app must look like module:attribute, got {spec!r}")
    # The current directory is where a module named on the command line is looked for
    # first, as `python -m` does; the `baton` console script does not put it on the path.
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"cannot import app module {module_name!r}: {exc}") from None
    except ConfigError:  # a declaration the app's module made is refused: says which
        raise
    except Exception as exc:  # the app's own code failed while its module was imported
        if isinstance(exc, SyntaxError):  # where the parser stopped, not the importer
            at = f"{os.path.basename(exc.filename or '?')}:{exc.lineno}"
        else:
            where = traceback.extract_tb(exc.__traceback__)[-1]
            at = f"{os.path.basename(where.filename)}:{where.lineno}"
        raise ConfigError(f"importing app module {module_name!r} failed: "
                          f"{type(exc).__name__}: {exc} (at {at})") from exc
    if not hasattr(module, attr):
        raise ConfigError(f"app module {module_name!r} has no attribute {attr!r} (--app "
                          f"{spec})")
    app = getattr(module, attr)
    if not isinstance(app, App):
        raise ConfigError(f"{spec} is not a baton.App (got {type(app).__name__})")
    return app
