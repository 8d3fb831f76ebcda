"""The public surface: what ``from baton import ...`` offers is pinned, and cheap to import."""

from __future__ import annotations

import re
import subprocess
import sys

import baton
import baton.brain
import baton.brain.tasks
import baton.hands
import baton.relay
from baton import errors

PUBLIC = [
    "Agent",
    "App",
    "Approval",
    "CancelAnswer",
    "Document",
    "Entry",
    "Submission",
    "ToolResult",
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
    "HttpError",
    "LeaseBusyError",
    "ModelBudget",
    "ModelClient",
    "ModelError",
    "ModelRequest",
    "ModelResponse",
    "ModelRetryableError",
    "NatsUnavailable",
    "NotFoundError",
    "NotArchivable",
    "StoreFullError",
    "ArchiveError",
    "ArchiveUnavailable",
    "ArchivedError",
    "BacklogFullError",
    "PayloadTooLarge",
    "QuarantinedError",
    "PhaseContext",
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
    "StoreLayoutError",
    "Task",
    "TaskDef",
    "Tool",
    "ToolCall",
    "ToolContext",
    "ToolError",
    "ToolMismatchError",
    "UnauthenticatedError",
    "Usage",
    "UnavailableError",
    "ValidationError",
    "WaitTimeout",
    "WriteInDoubtError",
    "load_app",
    "tool",
    # Beyond the library: a running `baton dev`'s settings, Baton's log set-up, the dev stack.
    "settings_from_env_or_stack",
    "configure_logging",
    "DevStack",
]


def test_top_level_exports_are_pinned() -> None:
    assert sorted(baton.__all__) == sorted([*PUBLIC, "__version__"])
    assert set(baton._EXPORTS) == set(PUBLIC)  # what __getattr__ can load
    for name in baton.__all__:
        assert getattr(baton, name) is not None, name
    assert dir(baton) == sorted(baton.__all__)  # no Any, importlib, annotations...
    assert re.match(r"\d+\.\d+", baton.__version__)


def test_the_model_budget_the_scale_out_guide_names_is_public() -> None:
    from baton.budgets import ModelBudget

    assert baton.ModelBudget is ModelBudget


def test_a_renamed_export_is_the_function_it_names() -> None:
    from baton.observability.log import configure

    assert baton.configure_logging is configure


def test_the_docs_examples_import_only_the_public_surface() -> None:
    """Every `from baton... import` in the README's and the docs' Python blocks names public
    names only: `baton`'s own, or a documented public submodule's `__all__`."""
    import importlib
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    public_modules = {"baton", "baton.pydantic_ai", "baton.mcp"}
    pages = [root / "README.md", *sorted((root / "docs").rglob("*.md"))]
    found = 0
    for page in pages:
        for block in re.findall(r"```python\n(.*?)```", page.read_text(), flags=re.S):
            imports = re.findall(r"^\s*from (baton[\w.]*) import (?:\(([^)]*)\)|([^\n]+))",
                                 block, flags=re.M)
            for module, grouped, names in imports:
                assert module in public_modules, f"{page.name}: from {module} import"
                exported = importlib.import_module(module).__all__
                for name in (n.strip() for n in (grouped or names).split(",") if n.strip()):
                    assert name in exported, f"{page.name}: {name} is not in {module}.__all__"
                    found += 1
    assert found > 20


def test_the_whole_error_tree_is_public() -> None:
    tree = {name for name, obj in vars(errors).items()
            if isinstance(obj, type) and issubclass(obj, errors.BatonError)}
    assert tree <= set(baton.__all__)


def test_role_packages_are_pinned() -> None:
    assert sorted(baton.brain.__all__) == ["BrainWorker", "ModelClient", "ModelRequest",
                                           "ModelResponse"]
    assert sorted(baton.hands.__all__) == ["HandsWorker", "ReplayDecision", "decide", "main"]
    assert sorted(baton.relay.__all__) == ["Relay", "main"]
    assert sorted(baton.brain.tasks.__all__) == ["ChildResult", "DocumentType", "PhaseContext",
                                                 "Step", "TaskDef"]
    for module in (baton.brain, baton.hands, baton.relay, baton.brain.tasks):
        for name in module.__all__:
            assert getattr(module, name) is not None, name


def test_unknown_names_raise_attribute_error() -> None:
    try:
        baton.NoSuchThing  # type: ignore[attr-defined]  # noqa: B018
    except AttributeError as exc:
        assert "NoSuchThing" in str(exc)
    else:
        raise AssertionError("baton.NoSuchThing resolved")


def test_import_baton_loads_nothing_heavy() -> None:
    # A health probe or `baton --help` imports the package: it must not pull the runtime in.
    code = ("import sys, baton; heavy = [m for m in ('redis', 'nats', 'pydantic', 'rich', "
            "'opentelemetry.sdk', 'baton.store.store', 'baton.brain') if m in sys.modules]; "
            "print(','.join(heavy))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == ""


def test_a_client_is_made_by_connect_and_says_so_when_misused() -> None:
    import pytest

    from baton import Client, ConfigError, Settings

    with pytest.raises(ConfigError, match=r"await Client.connect\(settings\)"):
        Client(Settings(), Settings())  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"takes a baton\.Settings, not str"):
        Client.connect("redis://localhost")  # type: ignore[arg-type]
    connecting = Client.connect(Settings())  # awaitable, and an async context manager
    assert hasattr(connecting, "__await__") and hasattr(connecting, "__aenter__")
