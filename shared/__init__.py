"""Baton's shared library: the app API, settings, the client, and the error tree.

What users import: declare agents and tools with :class:`Agent`, :class:`App` and
:func:`tool`; submit with :class:`Client`; configure with :class:`Settings`.
"""

from shared.app import Agent, App, Tool, ToolContext, load_app, tool
from shared.client import Client
from shared.errors import (
    BatonError,
    LeaseBusyError,
    StaleAttemptError,
    StaleFenceError,
    ToolError,
    ValidationError,
)
from shared.settings import Settings

__all__ = [
    "Agent",
    "App",
    "BatonError",
    "Client",
    "LeaseBusyError",
    "Settings",
    "StaleAttemptError",
    "StaleFenceError",
    "Tool",
    "ToolContext",
    "ToolError",
    "ValidationError",
    "load_app",
    "tool",
]
