"""What this process knows about telemetry: one :data:`state`.

:mod:`baton.observability.telemetry` keeps it (the global providers last seen, Baton's tracer
and instruments for them, what ``setup`` installed); :mod:`baton.observability.propagation`
reads what the sampler is known to do (follows parents, the roots it drops), and
:mod:`~baton.observability.spans` and :mod:`~baton.observability.tracing` read the role and
the sampler's traits. It is a module of its own, not part of telemetry, because telemetry
imports propagation: a leaf both import breaks the cycle.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from baton.observability.metrics import Histogram, Instruments

__all__ = ["state"]


class _State:
    """What this process knows about telemetry.

    ``role`` and the exporters to flush exist only when an entry point called
    :func:`~baton.observability.telemetry.setup` (``setup()`` below).
    The rest is a cache of Baton's tracer and instruments for the global providers last
    seen, re-made when a provider changes (a host may configure its own after import).
    """

    def __init__(self) -> None:
        self.role = ""
        self.installed = False
        self._shutdown: list[Callable[[], Any]] = []
        self.tracer_provider: object = None
        self.tracer: Any = None
        # What the provider's sampler is known to do (telemetry._sampler_traits): a child of a
        # span that is not sampled is not sampled either; the root decision ignores
        # attributes. Both False for a sampler telemetry does not know.
        self.follows_parent = False
        self.attribute_free = False
        # The TracerProvider setup() installed, and the maker of the roots its sampler
        # drops (baton.observability.roots); ``roots`` is that maker while the provider is
        # the global one and its sampler decides on trace ids alone, else None.
        self.own_tracer_provider: object = None
        self.own_roots: Callable[[str, Any], str | None] | None = None
        self.roots: Callable[[str, Any], str | None] | None = None
        self.meter_provider: object = None
        self.instruments: Instruments | None = None
        # The MeterProvider setup() installed, and the histograms its exporters add.
        self.own_meter_provider: object = None
        self.kept: list[Histogram] = []
        # How long shutdown() waits for the exporters (Settings.telemetry_flush_timeout_s).
        self.flush_timeout_s = 3.0


state = _State()
