"""The message bus: NATS JetStream streams, subjects, consumers and per-role credentials."""
