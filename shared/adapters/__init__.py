"""Where Baton meets a dependency below its public API, one module per library.

Baton uses its dependencies through their public APIs. Where a private API is still worth
it (a measured gain of at least 5% of a session's CPU, stated with its ``make bench`` figure
in the module's docstring), it lives in this package, in the module named after the library,
and nowhere else:

* the module checks the installed version against the versions its private path was
  written for, and takes the library's public path on any other version, saying so once
  in the log (never degrading silently);
* a contract test (``tests/unit/test_adapters.py``) fails loudly, naming the library and
  its version, when the internals the module reads have changed.

A module here is imported by the one place in Baton that needs it; nothing else may import
a dependency's private module (``tests/unit/test_adapters.py`` checks the sources).
"""
