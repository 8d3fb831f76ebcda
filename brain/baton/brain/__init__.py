"""The Brain role: wake consumers, session passes under leases, task phases, models."""

from baton.brain.model import ModelClient, ModelRequest, ModelResponse
from baton.brain.worker import BrainWorker

__all__ = ["BrainWorker", "ModelClient", "ModelRequest", "ModelResponse"]
