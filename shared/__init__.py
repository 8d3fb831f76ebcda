"""Baton: durable Brain/Hands agents over NATS JetStream and Redis.

The public surface, importable as ``from baton import ...``::

    App, Agent, tool, Tool, ToolContext      declare agents and tools   (baton.app)
    TaskDef, Step, PhaseContext, ChildResult custom durable tasks       (baton.brain.tasks)
    Task                                     a task as a phase sees it  (baton.models)
    ModelClient, ModelRequest, ModelResponse bring your own model       (baton.brain.model)
    ToolCall, Usage                          what a ModelResponse holds (baton.models)
    DocumentType                             typed, versioned documents (baton.store.documents)
    Client                                   submit, wait, cancel, approve (baton.client)
    Settings, load_app                       configuration
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
    from baton.client import Client
    from baton.errors import (
        BatonError,
        ConfigError,
        ConflictError,
        CorruptStateError,
        CredentialsError,
        FenceError,
        ForbiddenError,
        LeaseBusyError,
        ModelError,
        ModelRetryableError,
        NatsUnavailable,
        NotFoundError,
        PayloadTooLarge,
        QuarantinedError,
        RedisUnavailable,
        ServerBinaryMissing,
        ServerError,
        StaleAttemptError,
        StaleFenceError,
        StoreEpochError,
        StoreLayoutError,
        ToolError,
        ToolMismatchError,
        UnauthenticatedError,
        UnavailableError,
        ValidationError,
        WaitTimeout,
        WriteInDoubtError,
    )
    from baton.models import Task, ToolCall, Usage
    from baton.settings import Settings
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
    "Client": "baton.client",
    "DocumentType": "baton.store.documents",
    "Settings": "baton.settings",
    **{
        name: "baton.errors"
        for name in (
            "BatonError",
            "ConfigError",
            "ConflictError",
            "CorruptStateError",
            "CredentialsError",
            "FenceError",
            "ForbiddenError",
            "LeaseBusyError",
            "ModelError",
            "ModelRetryableError",
            "NatsUnavailable",
            "NotFoundError",
            "PayloadTooLarge",
            "QuarantinedError",
            "RedisUnavailable",
            "ServerBinaryMissing",
            "ServerError",
            "StaleAttemptError",
            "StaleFenceError",
            "StoreEpochError",
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
    "BatonError",
    "ChildResult",
    "Client",
    "ConfigError",
    "ConflictError",
    "CorruptStateError",
    "CredentialsError",
    "DocumentType",
    "FenceError",
    "ForbiddenError",
    "LeaseBusyError",
    "ModelClient",
    "ModelError",
    "ModelRequest",
    "ModelResponse",
    "ModelRetryableError",
    "NatsUnavailable",
    "NotFoundError",
    "PayloadTooLarge",
    "PhaseContext",
    "QuarantinedError",
    "RedisUnavailable",
    "ServerBinaryMissing",
    "ServerError",
    "Settings",
    "StaleAttemptError",
    "StaleFenceError",
    "Step",
    "StoreEpochError",
    "StoreLayoutError",
    "Task",
    "TaskDef",
    "Tool",
    "ToolCall",
    "ToolContext",
    "ToolError",
    "ToolMismatchError",
    "UnauthenticatedError",
    "UnavailableError",
    "Usage",
    "ValidationError",
    "WaitTimeout",
    "WriteInDoubtError",
    "load_app",
    "tool",
]



def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'baton' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
