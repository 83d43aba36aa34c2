"""Prometheus metrics for a queue: the optional ``metrics`` extra
(``pip install 'pawn-queue-sync[metrics]'``, which installs ``prometheus-client``).

    from pawn_queue_sync.metrics import PrometheusMetrics, serve

    metrics = PrometheusMetrics()
    with PawnQueue.from_config("config.yaml", on_event=metrics) as pq:
        metrics.watch(pq)           # queue depth gauges, from pq.stats() at scrape time
        server = serve(9108)        # http://host:9108/metrics
        ...

:class:`PrometheusMetrics` is an ``on_event`` callback (it runs on the queue's event
dispatcher thread, never in a publish, claim or ack): a counter of events by kind and
topic, and histograms of publish and handler durations. :class:`QueueDepthCollector`
asks ``pq.stats()`` when Prometheus scrapes, at most once per ``min_interval`` seconds
(a scrape in between gets the last answer), so a scrape costs the store nothing most of
the time. Under :class:`~pawn_queue_sync.workers.WorkerPool` (``metrics_port=`` or
``pawnq worker --metrics-port``) prometheus-client's multiprocess mode is used: see
:class:`PoolMetrics`. Importing this module needs no prometheus-client; using it
without raises :class:`~pawn_queue_sync.errors.MissingExtra`.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from .errors import ConfigError, MissingExtra, PawnQueueError
from .events import Event

log = logging.getLogger(__name__)

__all__ = ["DEFAULT_ADDR", "DEPTH_MIN_INTERVAL_S", "DURATION_BUCKETS", "MULTIPROC_ENV",
           "MetricsServer", "PoolMetrics", "PrometheusMetrics", "QueueDepthCollector",
           "check_multiproc_dir", "require", "serve"]

#: The environment variable prometheus-client's multiprocess mode reads.
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
#: Seconds a depth collector reuses its last ``stats()`` answer by default.
DEPTH_MIN_INTERVAL_S = 15.0
#: Histogram buckets (seconds) of publish and handler durations.
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
                    60.0, 300.0, float("inf"))
#: A depth collector whose ``stats()`` fails logs it at most once per this many seconds.
_ERROR_LOG_INTERVAL_S = 60.0


def require() -> Any:
    """The ``prometheus_client`` module, or MissingExtra naming the extra to install."""
    try:
        import prometheus_client
    except ImportError:
        raise MissingExtra(
            "Prometheus metrics need prometheus-client: pip install "
            "'pawn-queue-sync[metrics]'"
        ) from None
    return prometheus_client


# -- counters and histograms from events -------------------------------------------------


class _Instruments:
    """The counter and histograms of one registry and namespace (created once: a
    registry refuses a second metric of the same name)."""

    def __init__(self, pc: Any, registry: Any, namespace: str) -> None:
        self.events = pc.Counter(
            "events", "Queue events by kind (published, claimed, acked, nacked, retried, "
            "lease_lost, dead_lettered, redriven, reaped, poll_error) and topic",
            ["kind", "topic"], namespace=namespace, registry=registry)
        self.publish = pc.Histogram(
            "publish_duration_seconds", "Time a publish() call took (packed topics: "
            "with the group commit)", ["topic"], namespace=namespace, registry=registry,
            buckets=DURATION_BUCKETS)
        self.handler = pc.Histogram(
            "handler_duration_seconds", "Handler run time under a listener (else the "
            "time from the claim to the settlement), by outcome",
            ["topic", "outcome"], namespace=namespace, registry=registry,
            buckets=DURATION_BUCKETS)


_INSTRUMENTS: dict[tuple[int, str], tuple[Any, _Instruments]] = {}
_INSTRUMENTS_LOCK = threading.Lock()


def _instruments(pc: Any, registry: Any, namespace: str) -> _Instruments:
    with _INSTRUMENTS_LOCK:
        found = _INSTRUMENTS.get((id(registry), namespace))
        if found is None or found[0] is not registry:
            found = (registry, _Instruments(pc, registry, namespace))
            _INSTRUMENTS[(id(registry), namespace)] = found
        return found[1]


class PrometheusMetrics:
    """An ``on_event`` callback counting events into Prometheus metrics:

    - ``pawnq_events_total{kind, topic}``: every event;
    - ``pawnq_publish_duration_seconds{topic}``: a ``publish()`` call's time;
    - ``pawnq_handler_duration_seconds{topic, outcome}``: the handler's time per
      ``acked``, ``nacked`` or ``retried`` message.

    ``registry``: prometheus-client's (default: its global ``REGISTRY``). Several
    instances on one registry share the same metrics."""

    def __init__(self, registry: Any = None, *, namespace: str = "pawnq") -> None:
        pc = require()
        self._pc = pc
        self.registry = pc.REGISTRY if registry is None else registry
        self.namespace = namespace
        self._m = _instruments(pc, self.registry, namespace)

    def __repr__(self) -> str:
        return f"PrometheusMetrics(namespace={self.namespace!r})"

    def __call__(self, event: Event) -> None:
        self._m.events.labels(event.kind, event.topic).inc()
        if event.duration is None:
            return
        if event.kind == "published":
            self._m.publish.labels(event.topic).observe(event.duration)
        elif event.kind in ("acked", "nacked", "retried"):
            self._m.handler.labels(event.topic, event.kind).observe(event.duration)

    def watch(self, pq: Any, topics: Sequence[str] | None = None, *,
              min_interval: float = DEPTH_MIN_INTERVAL_S) -> QueueDepthCollector:
        """Add queue depth gauges of ``pq`` (its ``topics``, default every topic) to
        this registry: see :class:`QueueDepthCollector`."""
        collector = QueueDepthCollector(pq, topics, min_interval=min_interval,
                                        namespace=self.namespace)
        self.registry.register(collector)
        return collector


# -- depth gauges from stats --------------------------------------------------------------


#: gauge name -> (help, how to read it from a TopicStats)
_GAUGES: dict[str, tuple[str, Callable[[Any], float | None]]] = {
    "topic_pending_messages": ("Messages waiting for a consumer",
                               lambda s: s.pending),
    "topic_in_flight_messages": ("Messages leased by a consumer", lambda s: s.in_flight),
    "topic_dead_letters": ("Dead letters of the topic", lambda s: s.dead_lettered),
    "topic_delayed_messages": ("Delayed messages not yet due", lambda s: s.delayed),
    "topic_oldest_pending_age_seconds": (
        "Age of the oldest pending message (by the server's clock)",
        lambda s: s.oldest_pending_age_seconds),
    "topic_stats_exact": ("1 when the counts are exact, 0 when a listing stopped at "
                          "its bound (the counts are then lower bounds)",
                          lambda s: 1.0 if s.exact else 0.0),
}


#: The gauge of live consumers: the queue's, not a topic's (the registry does not
#: record which topics a consumer reads), so it has no ``topic`` label.
_CONSUMERS_ALIVE = ("consumers_alive", "Registered consumers of the queue (every topic: "
                    "the registry does not record which topics each reads) alive by "
                    "their heartbeat")
_CONSUMERS_EXACT = ("consumers_exact", "1 when the consumer registry was listed whole, 0 "
                    "when the listing stopped at its bound (consumers_alive is then a "
                    "lower bound)")


class QueueDepthCollector:
    """A Prometheus collector of queue depth gauges (``pawnq_topic_pending_messages``,
    ``..._in_flight_messages``, ``..._dead_letters``, ``..._delayed_messages``,
    ``..._oldest_pending_age_seconds``, ``..._stats_exact``, each by topic, and
    ``pawnq_consumers_alive`` and ``pawnq_consumers_exact``, the queue's, without a
    label, from ``pq.consumers()``: present with no topic as well) from
    ``pq.stats(topic)`` (or ``pq.stats_all()`` without ``topics``), asked at scrape
    time at most once per ``min_interval`` seconds. A failing ``stats()`` is logged
    (at most once a minute) and the last answer kept.

    ``pq`` may be a callable returning the queue (built on first use: the worker pool's
    supervisor builds one only when scraped)."""

    def __init__(self, pq: Any, topics: Sequence[str] | None = None, *,
                 min_interval: float = DEPTH_MIN_INTERVAL_S, namespace: str = "pawnq",
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not min_interval >= 0:
            raise ValueError(f"min_interval must be >= 0, not {min_interval!r}")
        self._pc = require()
        self._pq = pq
        self._topics = None if topics is None else list(topics)
        self._min_interval = float(min_interval)
        self._namespace = namespace
        self._clock = clock
        self._lock = threading.Lock()
        self._stats: list[Any] = []
        self._consumers: tuple[list[Any], bool] | None = None
        self._at: float | None = None
        self._logged_at = float("-inf")
        #: how many times ``stats()`` was asked (each costs the store requests)
        self.refreshes = 0

    def describe(self) -> list[Any]:
        return []  # no store request when registered

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily as gauge

        stats = self._current()
        for name, (doc, read) in _GAUGES.items():
            family = gauge(f"{self._namespace}_{name}", doc, labels=["topic"])
            for topic_stats in stats:
                value = read(topic_stats)
                if value is not None:
                    family.add_metric([topic_stats.topic], float(value))
            yield family
        consumers = self._consumers
        if consumers is not None:  # the queue's, with or without a topic
            listed, exact = consumers
            name, doc = _CONSUMERS_ALIVE
            yield gauge(f"{self._namespace}_{name}", doc,
                        value=sum(1 for c in listed if c.alive))
            name, doc = _CONSUMERS_EXACT
            yield gauge(f"{self._namespace}_{name}", doc, value=1.0 if exact else 0.0)

    def _current(self) -> list[Any]:
        with self._lock:  # one refresh at a time; concurrent scrapes share it
            now = self._clock()
            if self._at is not None and now - self._at < self._min_interval:
                return self._stats
            self._at = now
            try:
                pq = self._pq() if callable(self._pq) and not hasattr(self._pq, "stats") \
                    else self._pq
                if self._topics is None:
                    self._stats = list(pq.stats_all())
                else:
                    self._stats = [pq.stats(t) for t in self._topics]
                self._consumers = pq.consumers()
                self.refreshes += 1
            except (PawnQueueError, OSError) as exc:
                if now - self._logged_at >= _ERROR_LOG_INTERVAL_S:
                    self._logged_at = now
                    log.warning("queue depth metrics: stats() failed (keeping the last "
                                "answer): %s", exc)
            return self._stats


# -- serving ---------------------------------------------------------------------------------


class MetricsServer:
    """prometheus-client's HTTP server on a thread: ``port`` (the one bound, when 0 was
    asked), ``close()``."""

    def __init__(self, server: Any, thread: threading.Thread) -> None:
        self._server = server
        self._thread = thread
        self.port: int = server.server_address[1]

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5.0)


#: The address metrics are served on by default: this host only, as the dashboard's.
#: Give ``0.0.0.0`` (or an interface's address) for a Prometheus on another host.
DEFAULT_ADDR = "127.0.0.1"


def serve(port: int, addr: str = DEFAULT_ADDR, registry: Any = None) -> MetricsServer:
    """Serve ``registry`` (default: prometheus-client's global one; in multiprocess mode
    a registry over :data:`MULTIPROC_ENV`'s files) at ``http://addr:port/metrics`` on a
    daemon thread (``addr``: loopback by default). OSError when the port cannot be
    bound; ConfigError when :data:`MULTIPROC_ENV` names no directory."""
    pc = require()
    if registry is None:
        path = os.environ.get(MULTIPROC_ENV)
        registry = _multiprocess_registry(pc, path) if path else pc.REGISTRY
    server, thread = pc.start_http_server(port, addr=addr, registry=registry)
    return MetricsServer(server, thread)


def _multiprocess_registry(pc: Any, path: str) -> Any:
    from prometheus_client import multiprocess

    check_multiproc_dir(path)
    registry = pc.CollectorRegistry()
    multiprocess.MultiProcessCollector(registry, path=path)
    return registry


def check_multiproc_dir(path: str) -> None:
    """ConfigError unless ``path`` (:data:`MULTIPROC_ENV`'s value) is a directory: a
    stale one (a cleaned temporary directory, a typo) is the user's to fix; it is not
    made here (the workers' files would be left in a place nobody removes)."""
    if not os.path.isdir(path):
        raise ConfigError(MULTIPROC_ENV, f"{path!r} is not a directory: create it (and "
                          "empty it between runs) or unset it (a temporary one is made "
                          "then)")


class PoolMetrics:
    """Metrics of a :class:`~pawn_queue_sync.workers.WorkerPool`, in prometheus-client's
    multiprocess mode.

    :meth:`start` (in the supervisor, before any worker starts): points
    :data:`MULTIPROC_ENV` at a fresh temporary directory (or keeps the one set: then
    empty it between runs yourself), which the workers inherit; each worker counts its
    events into its own files there (:meth:`child_callback`); the supervisor serves
    their sum (``MultiProcessCollector``) plus the depth gauges of the pool's topics,
    from a queue of its own built at the first scrape. :meth:`close` stops serving,
    tears that queue down, removes the directory it made and restores the
    environment. Counts of a worker that died stay in the sum (totals survive
    restarts)."""

    def __init__(self, port: int, addr: str, config: Mapping[str, Any],
                 topics: Sequence[str], *,
                 min_interval: float = DEPTH_MIN_INTERVAL_S) -> None:
        require()
        self._port, self._addr = port, addr
        self._config = dict(config)
        self._topics = list(topics)
        self._min_interval = min_interval
        self._made: str | None = None
        #: the multiprocess directory, once started
        self.path: str | None = None
        self._old_env: str | None = None
        self._server: MetricsServer | None = None
        self._pq: Any = None
        self._pq_lock = threading.Lock()

    @property
    def port(self) -> int | None:
        return self._server.port if self._server is not None else None

    def start(self) -> bool:
        """Set up the directory, then serve; False (logged, nothing left set up) when
        the port cannot be bound or :data:`MULTIPROC_ENV` names no directory."""
        pc = require()
        self._old_env = os.environ.get(MULTIPROC_ENV)
        path = self._old_env
        if path:
            try:
                check_multiproc_dir(path)
            except ConfigError as exc:
                log.error("cannot serve metrics: %s", exc)
                return False
        else:
            path = self._made = tempfile.mkdtemp(prefix="pawnq-metrics-")
            os.environ[MULTIPROC_ENV] = path
        self.path = path
        registry = _multiprocess_registry(pc, path)
        registry.register(QueueDepthCollector(self._queue, self._topics,
                                              min_interval=self._min_interval))
        try:
            self._server = serve(self._port, self._addr, registry)
        except OSError as exc:
            log.error("cannot serve metrics on %s:%d: %s", self._addr, self._port, exc)
            self._restore()
            return False
        except BaseException:
            self._restore()
            raise
        log.info("serving metrics on http://%s:%d/metrics", self._addr, self._server.port)
        return True

    def _queue(self) -> Any:
        with self._pq_lock:
            if self._pq is None:
                from .config import load_config
                from .queue.core import PawnQueue

                self._pq = PawnQueue(load_config(self._config)).setup()
            return self._pq

    def close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        with self._pq_lock:
            pq, self._pq = self._pq, None
        if pq is not None:
            pq.teardown()
        self._restore()

    def _restore(self) -> None:
        if self._made is not None:
            shutil.rmtree(self._made, ignore_errors=True)
            self._made = None
            if self._old_env is None:
                os.environ.pop(MULTIPROC_ENV, None)
            else:
                os.environ[MULTIPROC_ENV] = self._old_env

    @staticmethod
    def child_callback(path: str) -> PrometheusMetrics:
        """A worker's ``on_event``: counts into ``path``, the multiprocess directory its
        supervisor set up. Set here too, not only inherited: a forkserver child inherits
        the environment of the fork server, started maybe before the supervisor set it
        (and prometheus-client may have been imported there before, in the
        single-process mode it then chose for good: switched here)."""
        if not os.path.isdir(path):
            raise PawnQueueError(f"the metrics directory {path!r} is gone: the worker's "
                                 "supervisor did not set up multiprocess metrics")
        os.environ[MULTIPROC_ENV] = path
        require()
        from prometheus_client import values

        if values.ValueClass is values.MutexValue:  # imported before it was set
            values.ValueClass = values.get_value_class()
        return PrometheusMetrics()
