"""The operator command line (``baton``) and its read-only views: trace, watch, inspect."""

from baton.cli.main import main

__all__ = ["main"]
