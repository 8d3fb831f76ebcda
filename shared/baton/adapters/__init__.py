"""Where Baton meets a dependency below its public API, one module per library.

Baton uses its dependencies through their public APIs. Where a private API is still worth
it (a measured gain of at least 5% of a session's CPU, stated with its ``make bench`` figure
in the module's docstring), it lives in this package, in the module named after the library,
and nowhere else:

* the module checks the installed version against the versions its private path was
  written for, and takes the library's public path on any other version, saying so once
  in the log (never degrading silently);
* a contract test (``tests/unit/test_adapters_<library>.py``) fails loudly, naming the
  library and its version, when the internals the module reads have changed.

A module here is imported by the one place in Baton that needs it; nothing else may use a
dependency's private module or attribute (``tests/unit/test_private_apis.py`` checks the
sources). Measured and dropped: redis-py's connection and parser internals, nats-py's
subscription internals and header parser, httpx's private client modules and a hand-written
HTTP/1.1 client, OpenTelemetry's provider globals: none saved 5% of a session's CPU.
Kept: :mod:`baton.adapters.opentelemetry` (not a speed-up: the only way to honour an
exporter's preferred temporality).
"""
