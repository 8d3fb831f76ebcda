"""Baton's metric instruments, and the in-process aggregates that stand in for the SDK's.

:class:`Instruments` are what :mod:`baton.observability.tracing` records on. Under the
MeterProvider :func:`~baton.observability.telemetry.setup` installs, counters are
:class:`Tally` sums reported by observable counters and histograms are :class:`Histogram`
aggregates, which :func:`kept_histograms_exporter` adds to each export with the names,
units, buckets and attributes the SDK's would have: the SDK's own instruments clean, hash
and filter their attributes on every call, several times per handled message. A host's own
provider gets the SDK's instruments, its views and exemplars included.
"""

from __future__ import annotations

import bisect
import functools
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "DURATION_BUCKETS", "TOKEN_BUCKETS", "Attributes", "Histogram", "Instruments", "Tally",
    "kept_histograms_exporter",
]

# Seconds, per the semantic conventions' advice for duration histograms.
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                    7.5, 10.0, 30.0, 60.0)
TOKEN_BUCKETS = (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304)


class Attributes(dict[str, Any]):
    """A metric attribute set made once and shared by every measurement with it (see
    ``spans.metric_attrs``): a plain dict to the SDK's instruments, and to :class:`Tally`
    and :class:`Histogram` the key of its aggregate, computed once here instead of at each
    measurement. Never changed once made."""

    __slots__ = ("key",)

    def __init__(self, pairs: Iterable[tuple[str, Any]]) -> None:
        super().__init__(pairs)
        self.key: tuple[tuple[str, Any], ...] = tuple(self.items())


def _key(attributes: Mapping[str, Any] | None) -> tuple[tuple[str, Any], ...]:
    if type(attributes) is Attributes:
        return attributes.key
    return tuple(attributes.items()) if attributes else ()


class Tally:
    """A counter kept in this process and reported by an observable counter's callback.

    ``add`` has the signature of a Counter's, at the cost of one dict update: the SDK's
    ``Counter.add`` cleans and hashes the attributes on every call (microseconds, several
    times per handled message). The metric is the same cumulative monotonic sum.
    """

    __slots__ = ("totals",)

    def __init__(self) -> None:
        self.totals: dict[tuple[tuple[str, Any], ...], int] = {}

    def add(self, amount: int, attributes: Mapping[str, Any] | None = None) -> None:
        key = _key(attributes)
        self.totals[key] = self.totals.get(key, 0) + amount

    def observe(self, _options: Any) -> Iterable[Any]:
        from opentelemetry.metrics import Observation

        for key, total in list(self.totals.items()):
            yield Observation(total, dict(key))


class Histogram:
    """A histogram kept in this process and handed to Baton's own metric exporters.

    ``record`` has the signature of an SDK Histogram's, at the cost of one append: the SDK's
    ``Histogram.record`` builds a measurement, cleans and hashes the attributes and runs the
    exemplar filter on every call (tens of microseconds, about twenty times per session).
    Measurements wait in a queue (``collections.deque``: appends and pops are safe across
    threads) and are folded into the aggregates :data:`FOLD_EVERY` at a time, or at a
    :meth:`snapshot`, under a lock the recording thread takes only then. At each export the
    exporter :func:`~baton.observability.telemetry.setup` installed adds one cumulative point
    per attribute set (the same name, unit, description, explicit buckets and attributes as
    the SDK's would be) to what the SDK collected. Used only when ``setup`` installed the
    MeterProvider: a host's own provider gets SDK histograms, its views and exemplars
    included.
    """

    #: Measurements queued before the recording thread folds them in.
    FOLD_EVERY = 256

    __slots__ = ("_lock", "_queued", "bounds", "description", "name", "points", "start_ns",
                 "unit")

    def __init__(self, name: str, unit: str, description: str,
                 bounds: Sequence[float]) -> None:
        self.name, self.unit, self.description = name, unit, description
        self.bounds = tuple(float(b) for b in bounds)
        self.start_ns = time.time_ns()
        # attribute pairs -> [count, sum, min, max, bucket counts]
        self.points: dict[tuple[tuple[str, Any], ...], list[Any]] = {}
        self._queued: deque[tuple[tuple[tuple[str, Any], ...], float]] = deque()
        self._lock = threading.Lock()  # folds: on the loop's thread, or the reader's

    def record(self, amount: float, attributes: Mapping[str, Any] | None = None) -> None:
        queued = self._queued
        queued.append((_key(attributes), amount))
        if len(queued) >= self.FOLD_EVERY:
            self._fold()

    def _fold(self) -> None:
        """Fold the queued measurements into the aggregates (any thread)."""
        bounds, points, queued = self.bounds, self.points, self._queued
        with self._lock:
            while True:
                try:
                    key, amount = queued.popleft()
                except IndexError:
                    return
                point = points.get(key)
                if point is None:
                    point = points[key] = [0, 0, amount, amount, [0] * (len(bounds) + 1)]
                point[0] += 1
                point[1] += amount
                if amount < point[2]:
                    point[2] = amount
                elif amount > point[3]:
                    point[3] = amount
                point[4][bisect.bisect_left(bounds, amount)] += 1  # upper bounds inclusive

    def snapshot(self) -> list[tuple[dict[str, Any], int, float, float, float, list[int]]]:
        """(attributes, count, sum, min, max, bucket counts) per attribute set so far."""
        self._fold()
        with self._lock:
            return [(dict(key), n, total, low, high, list(counts))
                    for key, (n, total, low, high, counts) in self.points.items()]


@dataclass
class Instruments:
    """The metric instruments Baton records (see :mod:`baton.observability.tracing` for where)."""

    commits: Any
    refused: Any
    handoff: Any
    redeliveries: Any
    takeovers: Any
    process: Any
    model_duration: Any
    model_tokens: Any
    wait_fallbacks: Any
    backlog: dict[str, tuple[int, float]] = field(default_factory=dict)  # shard -> (rows, age s)
    # (stream, consumer, tenant) -> work waiting: see the baton.backlog gauge below
    work: dict[tuple[str, str, str], int] = field(default_factory=dict)

    @classmethod
    def create(cls, meter: Any, kept: list[Histogram] | None = None) -> Instruments:
        """Baton's instruments on ``meter``; with ``kept`` (Baton's own MeterProvider, see
        :func:`~baton.observability.telemetry.setup`) the histograms are :class:`Histogram`
        aggregates added to that list for its exporters, else the meter's own."""
        from opentelemetry.metrics import CallbackOptions, Observation

        def histogram(name: str, unit: str, description: str,
                      bounds: Sequence[float]) -> Any:
            if kept is None:
                return meter.create_histogram(name, unit=unit, description=description,
                                              explicit_bucket_boundaries_advisory=bounds)
            made = Histogram(name, unit, description, bounds)
            kept.append(made)
            return made

        def tally(name: str, unit: str, description: str) -> Tally:
            counts = Tally()
            meter.create_observable_counter(name, callbacks=[counts.observe], unit=unit,
                                            description=description)
            return counts

        inst = cls(
            commits=tally(
                "baton.commits", unit="{commit}",
                description="State transitions committed (submit, commit, complete)"),
            refused=tally(
                "baton.commits.refused", unit="{write}",
                description="Writes refused by a fence: a stale lease or a stale attempt"),
            handoff=histogram(
                "baton.handoff.duration", unit="s",
                description="Time from the commit that hands work over to the process that "
                            "takes it (hop: submit, dispatch, wake)",
                bounds=DURATION_BUCKETS),
            redeliveries=tally(
                "baton.redeliveries", unit="{message}",
                description="Messages JetStream delivered more than once"),
            takeovers=tally(
                "baton.takeovers", unit="{takeover}",
                description="Leases (brain) and tool attempts (hands) taken from another "
                            "worker"),
            process=histogram(
                "messaging.process.duration", unit="s",
                description="Duration of handling one consumed message (wake or tool)",
                bounds=DURATION_BUCKETS),
            model_duration=histogram(
                "gen_ai.client.operation.duration", unit="s",
                description="Duration of one model call",
                bounds=DURATION_BUCKETS),
            model_tokens=histogram(
                "gen_ai.client.token.usage", unit="{token}",
                description="Tokens used by one model call (gen_ai.token.type input/output)",
                bounds=TOKEN_BUCKETS),
            wait_fallbacks=tally(
                "baton.client.wait.fallbacks", unit="{wait}",
                description="Client waits that found their submission settled by the "
                            "once-a-second re-read, without hearing its settled "
                            "notification (should stay 0)"),
        )

        def rows(_: CallbackOptions) -> Iterable[Observation]:
            for shard, (n, _age) in list(inst.backlog.items()):
                yield Observation(n, {"baton.shard": shard})

        def age(_: CallbackOptions) -> Iterable[Observation]:
            for shard, (_n, seconds) in list(inst.backlog.items()):
                yield Observation(seconds, {"baton.shard": shard})

        def work(_: CallbackOptions) -> Iterable[Observation]:
            for (stream, consumer, tenant), n in list(inst.work.items()):
                yield Observation(n, {"stream": stream, "consumer": consumer, "tenant": tenant})

        # What the autoscalers read (deploy/k8s/scaling/), sampled by the relay:
        # stream BATON_WAKE / BATON_TOOLS (by namespace), consumer the durable one that
        # takes the messages, tenant "": its messages not yet acked (KEDA's lag);
        # stream "admission", consumer "", tenant T: T's new sessions waiting to start.
        meter.create_observable_gauge(
            "baton.backlog", callbacks=[work], unit="{message}",
            description="Work waiting for Brains and Hands: a durable consumer's messages "
                        "not yet acked (stream, consumer), and new sessions waiting for "
                        "admission (stream admission, tenant)")
        meter.create_observable_gauge(
            "baton.outbox.backlog", callbacks=[rows], unit="{row}",
            description="Outbox rows not yet published, per shard (sampled by the relay)")
        meter.create_observable_gauge(
            "baton.outbox.oldest_age", callbacks=[age], unit="s",
            description="Age of the oldest unpublished outbox row, per shard")
        return inst

# ---------------------------------------------------------------------------- kept histograms


def kept_histograms_exporter(inner: Any, resource: Any, kept: Callable[[], list[Histogram]],
                             scope: str, version: str) -> Any:
    """``inner`` (an SDK metric exporter), adding the points of the histograms ``kept()``
    returns at each export to the instrumentation scope ``scope``."""
    return _kept_exporter_class()(inner, resource, kept, scope, version)


@functools.cache
def _kept_exporter_class() -> type:
    from opentelemetry.sdk.metrics import Histogram as SdkHistogram
    from opentelemetry.sdk.metrics.export import (
        AggregationTemporality,
        HistogramDataPoint,
        Metric,
        MetricExporter,
        MetricsData,
        ResourceMetrics,
        ScopeMetrics,
    )
    from opentelemetry.sdk.metrics.export import Histogram as HistogramData
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope

    from baton.adapters.opentelemetry import exporter_preferences

    class KeptHistogramsExporter(MetricExporter):
        """Delegates to the exporter it wraps, with the kept histograms' points added to
        its scope (``baton``). Cumulative by default; an exporter that prefers delta
        histograms gets the counts and sums since its previous export (min and max stay
        those since the start: the aggregate keeps no per-export extremes)."""

        def __init__(self, inner: Any, resource: Any, kept: Callable[[], list[Histogram]],
                     scope: str, version: str) -> None:
            # None when the exporter has no preference (the console exporter's default):
            # the reader's own defaults, cumulative histograms among them.
            preferred, aggregation = exporter_preferences(inner)
            super().__init__(preferred_temporality=preferred,
                             preferred_aggregation=aggregation)
            self.inner, self.resource, self.kept = inner, resource, kept
            self.scope, self.version = scope, version
            self.delta = (preferred or {}).get(SdkHistogram) == AggregationTemporality.DELTA
            self.previous: dict[tuple[str, tuple[tuple[str, Any], ...]], tuple[Any, ...]] = {}
            self.previous_ns = time.time_ns()

        def export(self, metrics_data: Any, timeout_millis: float = 10_000,
                   **kwargs: Any) -> Any:
            try:
                metrics_data = self.merged(metrics_data)
            except Exception as exc:  # never lose the SDK's own points to ours
                print(f"telemetry: histograms not exported: {exc!r}", file=sys.stderr)
            return self.inner.export(metrics_data, timeout_millis=timeout_millis, **kwargs)

        def merged(self, data: Any) -> Any:
            now = time.time_ns()
            ours = [m for m in (self.metric(h, now) for h in list(self.kept())) if m is not None]
            self.previous_ns = now
            if not ours:
                return data
            resource_metrics = list(data.resource_metrics) if data is not None else []
            if not resource_metrics:
                resource_metrics = [ResourceMetrics(resource=self.resource, scope_metrics=[],
                                                    schema_url="")]
            first = resource_metrics[0]
            scopes = list(first.scope_metrics)
            for i, scope in enumerate(scopes):
                if scope.scope.name == self.scope:
                    scopes[i] = ScopeMetrics(scope=scope.scope, schema_url=scope.schema_url,
                                             metrics=[*scope.metrics, *ours])
                    break
            else:
                scopes.append(ScopeMetrics(scope=InstrumentationScope(self.scope, self.version),
                                           metrics=ours, schema_url=""))
            resource_metrics[0] = ResourceMetrics(resource=first.resource, scope_metrics=scopes,
                                                  schema_url=first.schema_url)
            return MetricsData(resource_metrics=resource_metrics)

        def metric(self, histogram: Histogram, now: int) -> Any:
            points = []
            for attrs, n, total, low, high, counts in histogram.snapshot():
                start = histogram.start_ns
                if self.delta:
                    key = (histogram.name, tuple(attrs.items()))
                    last = self.previous.get(key)
                    self.previous[key] = (n, total, counts)
                    start = max(start, self.previous_ns)
                    if last is not None:
                        n, total = n - last[0], total - last[1]
                        counts = [a - b for a, b in zip(counts, last[2], strict=True)]
                    if not n:
                        continue
                points.append(HistogramDataPoint(
                    attributes=attrs, start_time_unix_nano=start, time_unix_nano=now,
                    count=n, sum=total, bucket_counts=counts,
                    explicit_bounds=list(histogram.bounds), min=low, max=high))
            if not points:
                return None
            temporality = (AggregationTemporality.DELTA if self.delta
                           else AggregationTemporality.CUMULATIVE)
            return Metric(name=histogram.name, description=histogram.description,
                          unit=histogram.unit, data=HistogramData(
                              data_points=points, aggregation_temporality=temporality))

        def force_flush(self, timeout_millis: float = 10_000) -> bool:
            return bool(self.inner.force_flush(timeout_millis=timeout_millis))

        def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
            self.inner.shutdown(timeout_millis=timeout_millis, **kwargs)

    return KeptHistogramsExporter
