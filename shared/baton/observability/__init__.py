"""Logs, OpenTelemetry spans and metrics, and the health endpoint every service serves."""
