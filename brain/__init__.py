"""The Brain role: wake consumers, session passes under leases, task phases, models."""

from brain.model import ModelClient, ModelRequest, ModelResponse
from brain.worker import BrainWorker

__all__ = ["BrainWorker", "ModelClient", "ModelRequest", "ModelResponse"]
