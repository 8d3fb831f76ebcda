"""Crash tests: real Brain/Hands/relay processes killed, paused or fed duplicates (DESIGN 10)."""
