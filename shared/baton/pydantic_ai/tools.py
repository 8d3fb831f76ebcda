"""A PydanticAI agent's function tools as Baton tools, executed by Hands.

Each function tool becomes a :class:`~baton.app.Tool` with the schema PydanticAI derived
from its signature (what the model sees is unchanged) and the replay policy, timeout,
approval and ``confirm`` the application sets per tool (:class:`ToolOptions`). In Hands the
call goes through the tool's own toolset (``call_tool``) with a fresh ``RunContext``: its
``deps`` from the application's factory, ``tool_name``, the run id as ``tool_call_id`` and
the attempt as ``retry``. Arguments are validated by PydanticAI's validator; a
``ModelRetry`` the tool raises becomes a result the model sees (code ``retry``), as in
PydanticAI.

A tool reads Baton's facts about its call (the operation id to send as an idempotency key,
the attempt, the shared HTTP client) from :func:`tool_context`.
"""

from __future__ import annotations

import contextvars
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict
from pydantic_ai import RunContext
from pydantic_ai.exceptions import ApprovalRequired, CallDeferred, ModelRetry
from pydantic_ai.models import Model
from pydantic_ai.tools import ToolDefinition
from pydantic_ai.toolsets import AbstractToolset
from pydantic_ai.usage import RunUsage
from pydantic_core import ValidationError as CoreValidationError

from baton.app import Tool, ToolContext
from baton.errors import ConfigError, ToolError
from baton.models import ReplayPolicy

__all__ = ["PydanticAITool", "ToolOptions", "tool_context"]

_current: contextvars.ContextVar[ToolContext] = contextvars.ContextVar("baton_tool_context")

#: ``confirm(operation_id, arguments, ctx)``: the result the outside system recorded for this
#: operation id, or None if it never saw it (see DESIGN 4.6, replay ``confirm``).
ConfirmArgs = Callable[[str, dict[str, Any], ToolContext], Awaitable[Any | None]]


def tool_context() -> ToolContext:
    """The Baton context of the tool call running now (in Hands): operation id, attempt,
    settings and the shared HTTP client."""
    try:
        return _current.get()
    except LookupError:
        raise ConfigError("tool_context() is only available inside a tool run by Hands"
                          ) from None


@dataclass(frozen=True)
class ToolOptions:
    """How Baton runs one of the agent's tools. ``approval=None`` keeps the tool's own
    ``requires_approval``; ``replay="confirm"`` needs ``confirm``."""

    replay: ReplayPolicy = "unsafe"
    timeout: float = 30.0
    approval: bool | None = None
    confirm: ConfirmArgs | None = None
    retry_on: tuple[type[BaseException], ...] = ()


class _Arguments(BaseModel):
    """The call's arguments as the model sent them; PydanticAI's validator checks them."""

    model_config = ConfigDict(extra="allow")


class PydanticAITool(Tool):
    """One function tool of a PydanticAI toolset, served by Hands."""

    def __init__(self, toolset: AbstractToolset[Any], definition: ToolDefinition,
                 options: ToolOptions, *, deps: Callable[[], Any] | None, model: Model) -> None:
        self.toolset = toolset
        self.definition = definition
        self._deps = deps
        self._model = model

        async def call(args: BaseModel, ctx: ToolContext) -> Any:
            return await self._call(dict(args.model_extra or {}), ctx)

        super().__init__(
            call, name=definition.name, description=definition.description or "",
            replay=options.replay, timeout=options.timeout, args_model=_Arguments,
            approval=definition.kind == "unapproved" if options.approval is None
            else options.approval,
            retry_on=options.retry_on)
        if options.confirm is not None:
            user_confirm = options.confirm

            async def confirm(operation_id: str, args: BaseModel, ctx: ToolContext) -> Any:
                token = _current.set(ctx)
                try:
                    return await user_confirm(operation_id, dict(args.model_extra or {}), ctx)
                finally:
                    _current.reset(token)

            self.confirm(confirm)
        self._parameters_json = orjson.dumps(definition.parameters_json_schema)

    def schema(self) -> dict[str, Any]:
        return {"name": self.name, "description": self.description,
                "parameters": orjson.loads(self._parameters_json)}

    async def _call(self, arguments: dict[str, Any], ctx: ToolContext) -> Any:
        run = RunContext(deps=self._deps() if self._deps is not None else None,
                         model=self._model, usage=RunUsage(), tool_name=self.name,
                         tool_call_id=ctx.run_id, retry=max(ctx.attempt - 1, 0))
        tools = await self.toolset.get_tools(run)
        found = tools.get(self.name)
        if found is None:
            raise ToolError(f"tool {self.name} is not offered by its toolset now",
                            code="unknown_tool")
        try:
            args = found.args_validator.validate_python(arguments)
        except CoreValidationError as exc:
            raise ToolError(f"invalid arguments for {self.name}: {exc}",
                            code="invalid_arguments") from None
        token = _current.set(ctx)
        try:
            return await self.toolset.call_tool(self.name, args, run, found)
        except ModelRetry as exc:
            raise ToolError(str(exc), code="retry") from None
        except (ApprovalRequired, CallDeferred):
            raise ToolError(f"{self.name} deferred its call; declare approval on the tool "
                            f"(baton approve) instead", code="deferred") from None
        finally:
            _current.reset(token)


def function_tools(toolsets: Any, options: Mapping[str, ToolOptions], *,
                   deps: Callable[[], Any] | None, model: Model) -> list[PydanticAITool]:
    """The Baton tools of every function tool in ``toolsets``."""
    from pydantic_ai.toolsets import FunctionToolset

    out: list[PydanticAITool] = []
    for toolset in toolsets:
        if not isinstance(toolset, FunctionToolset):
            raise ConfigError(
                f"toolset {type(toolset).__name__} is not supported: Baton runs function "
                f"tools; serve MCP servers from Hands with baton.mcp")
        for name, tool in toolset.tools.items():
            out.append(PydanticAITool(toolset, tool.tool_def, options.get(name, ToolOptions()),
                                      deps=deps, model=model))
    unknown = set(options) - {t.name for t in out}
    if unknown:
        raise ConfigError(f"options for tools the agent does not have: "
                          f"{', '.join(sorted(unknown))}")
    return out
