"""Baton: durable Brain/Hands agents over NATS JetStream and Redis.

The public surface, importable as ``from baton import ...``::

    App, Agent, tool, Tool, ToolContext      declare agents and tools   (baton.app)
    TaskDef, Step, PhaseContext, ChildResult custom durable tasks       (baton.brain.tasks)
    Task                                     a task as a phase sees it  (baton.models)
    ModelClient, ModelRequest, ModelResponse bring your own model       (baton.brain.model)
    ToolCall, Usage                          what a ModelResponse holds (baton.models)
    DocumentType                             typed, versioned documents (baton.store.documents)
    ModelBudget                              a model's fleet-wide budget (baton.budgets)
    Client                                   submit, wait, cancel, approve (baton.client)
    Submission, Document, Entry, ToolResult  what the client reads      (baton.models)
    CancelAnswer, Approval                   a cancel's answer, a run awaiting a decision
    Settings, load_app                       configuration
    settings_from_env_or_stack               Settings from BATON_*, else a running `baton dev`
    configure_logging                        Baton's structlog set-up, for an entry point
    DevStack                                 the local stack of `baton dev`, from Python (tests)
    BatonError and its subclasses            the one error tree         (baton.errors)

Names are loaded on first use (PEP 562), so ``import baton`` stays cheap for a CLI or a health
probe; everything not listed in ``__all__`` is internal and may change without notice.

The package is laid out by role: :mod:`baton.brain`, :mod:`baton.hands` and :mod:`baton.relay`
are the three services; :mod:`baton.store` (Redis) and :mod:`baton.bus` (NATS) are what they
share; :mod:`baton.observability` holds logs, traces and health; :mod:`baton.cli` the operator
command line and :mod:`baton.devkit` the local stack, demo and chaos runs.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from baton.app import Agent, App, Tool, ToolContext, load_app, tool
    from baton.brain.model import ModelClient, ModelRequest, ModelResponse
    from baton.brain.tasks import ChildResult, PhaseContext, Step, TaskDef
    from baton.budgets import ModelBudget
    from baton.client import Approval, Client
    from baton.devkit.devstack import DevStack
    from baton.devkit.stack import settings_from_env_or_stack
    from baton.errors import (
        ArchivedError,
        ArchiveError,
        ArchiveUnavailable,
        BacklogFullError,
        BatonError,
        ConfigError,
        ConflictError,
        CorruptStateError,
        CredentialsError,
        FenceError,
        ForbiddenError,
        HttpError,
        LeaseBusyError,
        ModelError,
        ModelRetryableError,
        NatsUnavailable,
        NotArchivable,
        NotFoundError,
        PayloadTooLarge,
        QuarantinedError,
        RedisUnavailable,
        RequestDeadlineExceeded,
        ResponseTooLarge,
        ServerBinaryMissing,
        ServerError,
        StaleAttemptError,
        StaleFenceError,
        StoreEpochError,
        StoreFullError,
        StoreLayoutError,
        ToolError,
        ToolMismatchError,
        UnauthenticatedError,
        UnavailableError,
        ValidationError,
        WaitTimeout,
        WriteInDoubtError,
    )
    from baton.models import Document, Entry, Submission, Task, ToolCall, ToolResult, Usage
    from baton.observability.log import configure as configure_logging
    from baton.settings import Settings
    from baton.store.control import CancelAnswer
    from baton.store.documents import DocumentType

#: public name -> the module that defines it.
_EXPORTS: dict[str, str] = {
    "Agent": "baton.app",
    "App": "baton.app",
    "Tool": "baton.app",
    "ToolContext": "baton.app",
    "load_app": "baton.app",
    "tool": "baton.app",
    "ChildResult": "baton.brain.tasks",
    "PhaseContext": "baton.brain.tasks",
    "Step": "baton.brain.tasks",
    "TaskDef": "baton.brain.tasks",
    "Task": "baton.models",
    "ToolCall": "baton.models",
    "Usage": "baton.models",
    "ModelClient": "baton.brain.model",
    "ModelRequest": "baton.brain.model",
    "ModelResponse": "baton.brain.model",
    "ModelBudget": "baton.budgets",
    "Client": "baton.client",
    "Approval": "baton.client",
    "CancelAnswer": "baton.store.control",
    "Document": "baton.models",
    "Entry": "baton.models",
    "Submission": "baton.models",
    "ToolResult": "baton.models",
    "DocumentType": "baton.store.documents",
    "Settings": "baton.settings",
    "settings_from_env_or_stack": "baton.devkit.stack",
    "DevStack": "baton.devkit.devstack",
    "configure_logging": "baton.observability.log",
    **{
        name: "baton.errors"
        for name in (
            "ArchiveError",
            "ArchiveUnavailable",
            "ArchivedError",
            "BacklogFullError",
            "BatonError",
            "ConfigError",
            "ConflictError",
            "CorruptStateError",
            "CredentialsError",
            "FenceError",
            "ForbiddenError",
            "HttpError",
            "LeaseBusyError",
            "ModelError",
            "NotArchivable",
            "ModelRetryableError",
            "NatsUnavailable",
            "NotFoundError",
            "PayloadTooLarge",
            "QuarantinedError",
            "RedisUnavailable",
            "RequestDeadlineExceeded",
            "ResponseTooLarge",
            "ServerBinaryMissing",
            "ServerError",
            "StaleAttemptError",
            "StaleFenceError",
            "StoreEpochError",
            "StoreFullError",
            "StoreLayoutError",
            "ToolError",
            "ToolMismatchError",
            "UnauthenticatedError",
            "UnavailableError",
            "ValidationError",
            "WaitTimeout",
            "WriteInDoubtError",
        )
    },
}

__all__ = [
    "Agent",
    "App",
    "Approval",
    "ArchiveError",
    "ArchiveUnavailable",
    "ArchivedError",
    "BacklogFullError",
    "BatonError",
    "CancelAnswer",
    "ChildResult",
    "Client",
    "ConfigError",
    "ConflictError",
    "CorruptStateError",
    "CredentialsError",
    "DevStack",
    "Document",
    "DocumentType",
    "Entry",
    "FenceError",
    "ForbiddenError",
    "HttpError",
    "LeaseBusyError",
    "ModelBudget",
    "ModelClient",
    "ModelError",
    "ModelRequest",
    "ModelResponse",
    "ModelRetryableError",
    "NatsUnavailable",
    "NotArchivable",
    "NotFoundError",
    "PayloadTooLarge",
    "PhaseContext",
    "QuarantinedError",
    "RedisUnavailable",
    "RequestDeadlineExceeded",
    "ResponseTooLarge",
    "ServerBinaryMissing",
    "ServerError",
    "Settings",
    "StaleAttemptError",
    "StaleFenceError",
    "Step",
    "StoreEpochError",
    "StoreFullError",
    "StoreLayoutError",
    "Submission",
    "Task",
    "TaskDef",
    "Tool",
    "ToolCall",
    "ToolContext",
    "ToolError",
    "ToolMismatchError",
    "ToolResult",
    "UnauthenticatedError",
    "UnavailableError",
    "Usage",
    "ValidationError",
    "WaitTimeout",
    "WriteInDoubtError",
    "__version__",
    "configure_logging",
    "load_app",
    "settings_from_env_or_stack",
    "tool",
]

#: a public name -> its name in the module that defines it, where the two differ.
_RENAMED = {"configure_logging": "configure"}



def __getattr__(name: str) -> Any:
    if name == "__version__":
        from importlib.metadata import PackageNotFoundError, version

        try:
            value = version("baton")
        except PackageNotFoundError:  # a source tree that was never installed
            value = "0+unknown"
        globals()[name] = value
        return value
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'baton' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), _RENAMED.get(name, name))
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
