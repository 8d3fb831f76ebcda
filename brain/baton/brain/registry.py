"""The Brain's registry: which code runs which task, by kind and version.

``generation`` is built in; applications add :class:`baton.brain.tasks.TaskDef` s through
``App(tasks=[...])``. A kind may be registered in several versions. A task runs with the
definition of its own version when the registry has it, otherwise with the newest definition
if that one can ``migrate`` it; a task newer than anything registered, or of an unknown kind,
has no handler: it stays as it is until a Brain that knows it picks it up.
"""

from __future__ import annotations

from baton.app import App
from baton.brain.custom import CustomTask
from baton.brain.generation import Generation
from baton.brain.tasks import TaskDef
from baton.errors import ConfigError
from baton.models import Task

__all__ = ["Registry"]


class Registry:
    """Task definitions and their handlers, by kind and version."""

    def __init__(self, tasks: list[TaskDef] | tuple[TaskDef, ...] = ()) -> None:
        self.generation = Generation()
        self._defs: dict[str, dict[int, TaskDef]] = {}
        self._handlers: dict[tuple[str, int], CustomTask] = {}
        for defn in tasks:
            self.register(defn)

    @classmethod
    def from_app(cls, app: App) -> Registry:
        return cls(app.tasks)

    def register(self, defn: TaskDef) -> None:
        if not isinstance(defn, TaskDef):
            raise ConfigError(f"App(tasks=...) takes TaskDef objects, not {type(defn).__name__}")
        defn.check()
        versions = self._defs.setdefault(defn.kind, {})
        if defn.version in versions:
            raise ConfigError(f"task {defn.kind} version {defn.version} registered twice")
        versions[defn.version] = defn
        self._handlers[(defn.kind, defn.version)] = CustomTask(defn, self)

    def kinds(self) -> dict[str, list[int]]:
        """Every registered kind with its versions (generation: 1)."""
        out = {"generation": [self.generation.version]}
        out.update({k: sorted(v) for k, v in self._defs.items()})
        return out

    def definition(self, kind: str, version: int | None = None) -> TaskDef | None:
        """The definition of ``kind`` at ``version`` (default: the newest)."""
        versions = self._defs.get(kind)
        if not versions:
            return None
        return versions.get(version if version is not None else max(versions))

    def get(self, task: Task) -> Generation | CustomTask | None:
        """The handler that can run this task now, or None (unknown kind or version)."""
        if task.kind == "generation":
            return self.generation
        versions = self._defs.get(task.kind)
        if not versions:
            return None
        if task.version in versions:
            return self._handlers[(task.kind, task.version)]
        newest = max(versions)
        if task.version < newest and versions[newest].migrate is not None:
            return self._handlers[(task.kind, newest)]
        return None
