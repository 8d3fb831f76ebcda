"""The relay role: moves committed outbox rows to JetStream and fires due timers."""

from baton.relay.worker import Relay, main

__all__ = ["Relay", "main"]
