"""``ChaosRun``: one SeaweedFS, one fault proxy, one bucket and topic, a worker pool in a
subprocess, publishing, the final sweep, and the count of every message.

A scenario (``benchmarks.chaos.scenarios``) is a function of :class:`ChaosSettings`
that opens a ``ChaosRun``, publishes, starts the pool, does its damage, and returns
``run.finish(...)``: the pool stopped, the proxy disarmed, the topic swept with
``drain()`` in this process (waiting out stale leases until the topic is empty), the
dead letters read, and everything counted (:mod:`benchmarks.chaos.accounting`) and
judged against the goals (:mod:`benchmarks.chaos.goals`).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import attrs

from benchmarks.chaos.accounting import (
    SLACK_SECONDS,
    Counts,
    count,
    deliveries,
    explain_overlaps,
    overlaps,
)
from benchmarks.chaos.goals import judge
from benchmarks.chaos.handler import record_delivery
from benchmarks.chaos.ledger import Ledger, LedgerWriter, record_publish
from benchmarks.chaos.pool import LISTENER_OPTIONS, PoolHandle
from benchmarks.chaos.waits import Waits
from pawn_queue_sync import PawnQueue, drain
from pawn_queue_sync.layout import dead_letter_prefix
from tests.fault_proxy import FaultProxy
from tests.seaweedfs import RestartableSeaweedFS
from tests.servers import ACCESS_KEY, REGION, SECRET_KEY, make_client, unique_bucket_name
from tests.weed_process import pdeathsig_preexec

__all__ = ["POISON_PREFIX", "WRONG_SHAPES", "ChaosRun", "ChaosSettings", "ScenarioResult"]

REPO = Path(__file__).resolve().parents[2]
#: Ids starting with this are poison (the handler raises); normal ids never do.
POISON_PREFIX = "0badc0de"
#: Payloads of the wrong shape (not a dict with an "id"): the handler raises on them.
WRONG_SHAPES: tuple[Any, ...] = (["not", "a", "dict"], "a string", 42, {"no_id": True}, None)
#: The sweep's drain: idle this long (s) before it looks at the topic's stats.
SWEEP_IDLE_SECONDS = 1.0


@attrs.define
class ChaosSettings:
    """One run's settings (a scenario at one strategy and topic kind)."""

    kind: Literal["plain", "packed"]
    strategy: Literal["conditional_write", "csprng_verify", "auto"]
    messages: int
    processes: int = 3
    threads: int = 8
    seed: int = 0
    visibility_timeout: float = 10.0
    refresh_interval: float = 3.0
    max_delivery_count: int = 5
    read_timeout: float = 3.0
    quick: bool = False
    jitter_min_ms: int = 100
    jitter_max_ms: int = 400
    workdir: str | None = None
    #: A running ``RestartableSeaweedFS`` shared by several runs in turn,
    #: each with a bucket of its own (the quick suite: one start instead of one per row);
    #: None: the run starts and stops its own.
    shared_server: Any = attrs.field(default=None, eq=False, repr=False)


@attrs.frozen
class ScenarioResult:
    """One row of the table: a scenario's counts at one strategy and topic kind."""

    scenario: int
    name: str
    kind: str
    strategy: str
    counts: Counts
    notes: dict[str, Any]
    goals_met: bool
    misses: list[str]

    def as_dict(self) -> dict[str, Any]:
        out = attrs.asdict(self, recurse=False)
        out["counts"] = self.counts.as_dict()
        return out


class ChaosRun(Waits):
    """One server, proxy, bucket and topic for one scenario run (a context manager)."""

    def __init__(self, settings: ChaosSettings, *, topic: str = "chaos") -> None:
        self.settings = settings
        self.topic = topic
        self.bucket = unique_bucket_name("chaos")
        self.workdir = Path(settings.workdir or tempfile.mkdtemp(prefix="chaos-"))
        self.run_dir = self.workdir / f"run-{uuid.uuid4().hex[:8]}"
        self.ledger = Ledger(self.run_dir / "ledger")
        self.log: LedgerWriter = self.ledger.writer("harness")
        self.notes: dict[str, Any] = {}
        self.poison_ids: set[str] = set()
        self.pools: list[PoolHandle] = []
        #: helper programs (producers, the frozen consumer: ``programs.spawn``), killed
        #: at close if still running
        self.helpers: list[subprocess.Popen[bytes]] = []
        self._owns_server = settings.shared_server is None
        self.server = settings.shared_server or RestartableSeaweedFS(self.workdir / "seaweedfs")
        self.proxy: FaultProxy | None = None
        self._queue: PawnQueue | None = None
        self._direct: PawnQueue | None = None
        self._producer: Any = None
        self._started = time.monotonic()
        self._lock = threading.Lock()

    # -- lifecycle ------------------------------------------------------------------------

    def __enter__(self) -> ChaosRun:
        try:
            if self._owns_server:
                self.server.start()
            make_client(self.server.endpoint_url).create_bucket(Bucket=self.bucket)
            self.proxy = FaultProxy(self.server.endpoint_url, seed=self.settings.seed).start()
            self.direct_queue().create_topic(self.topic, packed=self.settings.kind == "packed")
        except BaseException:
            self.close()
            raise
        self._started = time.monotonic()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop everything this run started; remove its files unless CHAOS_KEEP is set."""
        for helper in self.helpers:
            if helper.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    helper.kill()  # SIGKILL also ends a stopped (SIGSTOP) process
                helper.wait()
        for pool in self.pools:
            pool.stop(timeout=20)
        for pq in (self._queue, self._direct):
            if pq is not None:
                with contextlib.suppress(Exception):
                    pq.close()
        self._queue = self._direct = None
        if self.proxy is not None:
            self.proxy.stop()
        if self._owns_server:
            self.server.close()
        self.log.close()
        if not os.environ.get("CHAOS_KEEP") and self.settings.workdir is None:
            shutil.rmtree(self.workdir, ignore_errors=True)

    # -- configuration and queues ----------------------------------------------------------

    def config_dict(self, *, direct: bool = False) -> dict[str, Any]:
        """The library configuration: through the proxy (or straight to the server)."""
        s = self.settings
        endpoint = self.server.endpoint_url if direct or self.proxy is None else (
            self.proxy.endpoint_url)
        return {
            "s3": {
                "endpoint_url": endpoint, "bucket_name": self.bucket,
                "aws_access_key_id": ACCESS_KEY, "aws_secret_access_key": SECRET_KEY,
                "region_name": REGION, "use_ssl": False,
                "connect_timeout_seconds": 2.0, "read_timeout_seconds": s.read_timeout,
            },
            "polling": {
                "interval_seconds": 0.5,
                "visibility_timeout_seconds": s.visibility_timeout,
                "lease_refresh_interval_seconds": s.refresh_interval,
                "max_delivery_count": s.max_delivery_count,
            },
            "concurrency": {
                "strategy": s.strategy,
                "csprng_verify": {"jitter_min_ms": s.jitter_min_ms,
                                  "jitter_max_ms": s.jitter_max_ms},
            },
            "registry": {"heartbeat_interval_seconds": 5.0},
        }

    def queue(self) -> PawnQueue:
        """The harness's queue through the proxy (publishing), set up on first use."""
        with self._lock:
            if self._queue is None:
                self._queue = PawnQueue(self.config_dict()).setup()
                self.log.write("probe", strategy_chosen=self._queue.strategy)
            return self._queue

    def direct_queue(self) -> PawnQueue:
        """A queue straight to the server (topic creation, sweep, stats, dead letters)."""
        with self._lock:
            if self._direct is None:
                self._direct = PawnQueue(self.config_dict(direct=True)).setup()
            return self._direct

    # -- publishing -------------------------------------------------------------------------

    def publish(self, n: int, *, batch: int = 100, poison: int = 0,
                shape: int = 0) -> list[str]:
        """Publish ``n`` normal messages (``batch`` per publish_batch), ``poison`` poison
        ones (ids with POISON_PREFIX) among them, and ``shape`` of the wrong shape; record
        ``pub``/``pubfail``; return every id (poison and wrong-shape ids are kept in
        ``poison_ids``)."""
        if self._producer is None:
            self._producer = self.queue().register_producer("chaos-harness")
        ids = [_normal_id() for _ in range(n)]
        for i in range(min(poison, n)):
            ids[(i * 7919) % n] = POISON_PREFIX + uuid.uuid4().hex[8:]
        self.poison_ids.update(i for i in ids if i.startswith(POISON_PREFIX))
        for start in range(0, n, batch):
            chunk = ids[start:start + batch]
            self._publish_chunk(chunk)
        for i in range(shape):
            mid = str(uuid.uuid4())
            self.poison_ids.add(mid)
            try:
                self._producer.publish(self.topic, WRONG_SHAPES[i % len(WRONG_SHAPES)],
                                       message_id=mid)
            except Exception as exc:
                self.log.write("pubfail", id=mid, error=type(exc).__name__)
            else:
                self.log.write("pub", id=mid)
            ids.append(mid)
        return ids

    def _publish_chunk(self, chunk: Sequence[str]) -> None:
        payloads = [{"id": mid, "n": i} for i, mid in enumerate(chunk)]
        try:
            self._producer.publish_batch(self.topic, payloads)
        except Exception as exc:  # recorded: what a PublishError says was written is pub
            record_publish(self.log, list(chunk), exc)
        else:
            record_publish(self.log, list(chunk))

    # -- the pool -----------------------------------------------------------------------------

    def start_pool(self, processes: int | None = None, threads: int | None = None, *,
                   env: Mapping[str, str] | None = None,
                   listener_options: Mapping[str, Any] | None = None) -> PoolHandle:
        """Start a WorkerPool subprocess on the topic with the recording handler."""
        s = self.settings
        index = len(self.pools)
        spec = {
            "config": self.config_dict(), "topics": [self.topic],
            "processes": processes or s.processes, "threads": threads or s.threads,
            "listener_options": dict(listener_options or LISTENER_OPTIONS),
        }
        spec_path = self.run_dir / f"pool-{index}.json"
        spec_path.write_text(json.dumps(spec))
        child_env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
            "CHAOS_LEDGER_DIR": str(self.ledger.dir),
            "CHAOS_POISON_PREFIX": POISON_PREFIX,
            **(env or {}),
        }
        with (self.run_dir / f"pool-{index}.log").open("ab") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "benchmarks.chaos.pool", str(spec_path)],
                cwd=REPO, env=child_env, stdin=subprocess.DEVNULL, stdout=out,
                stderr=subprocess.STDOUT, start_new_session=True,
                # dies with us (kill -9 of the CLI): its children follow their parent
                preexec_fn=pdeathsig_preexec(),
            )
        handle = PoolHandle(proc, self.log)
        self.pools.append(handle)
        return handle

    # -- waiting, sweeping, counting -----------------------------------------------------------

    def published_ids(self, ids: Iterable[str] | None = None) -> set[str]:
        """The ids with a ``pub`` event (of ``ids`` if given)."""
        pub = {ev["id"] for ev in self.ledger.events() if ev.get("e") == "pub"}
        return pub if ids is None else pub & set(ids)

    def dead_letter_ids(self) -> set[str]:
        """The ids (as the ledger knows them) of the topic's dead letters."""
        store = self.direct_queue().store
        found: set[str] = set()
        for obj in store.list(dead_letter_prefix(self.topic)).objects:
            with contextlib.suppress(Exception):
                body = json.loads(store.get(obj.key).body)
                payload = body.get("payload")
                if isinstance(payload, dict) and isinstance(payload.get("id"), str):
                    found.add(payload["id"])
                else:
                    found.add(str(body.get("id")))
        return found

    def remaining(self) -> int:
        """Messages still in the topic (plain objects + packed messages not settled)."""
        return int(self.direct_queue().topic_stats(self.topic)["pending"])

    def sweep(self, timeout: float | None = None) -> set[str]:
        """Drain the topic in this process with the recording handler until it is empty,
        waiting out stale leases; the ids the sweep handled."""
        timeout = timeout if timeout is not None else 4 * self.settings.visibility_timeout + 120
        writer = self.ledger.writer("sweep")
        swept: set[str] = set()
        lock = threading.Lock()

        def handler(msg: Any) -> None:
            try:
                record_delivery(msg, writer, poison=POISON_PREFIX)
            finally:
                from benchmarks.chaos.handler import message_ident
                with lock:
                    swept.add(message_ident(msg))

        pq = self.direct_queue()
        consumer = pq.register_consumer("chaos-sweep", [self.topic])
        deadline = time.monotonic() + timeout
        try:
            while True:
                drain(consumer, handler, threads=8, idle_timeout_seconds=SWEEP_IDLE_SECONDS)
                if self.remaining() == 0 or time.monotonic() >= deadline:
                    break
                time.sleep(0.5)  # stale leases: their messages come back after the timeout
        finally:
            writer.close()
        return swept

    def finish(self, name: str, *, poison: Iterable[str] | None = None, scenario: int = 0,
               notes: Mapping[str, Any] | None = None,
               extra_misses: Sequence[str] = ()) -> ScenarioResult:
        """Stop the pools, disarm the proxy, sweep, count, judge: the scenario's row."""
        seconds = time.monotonic() - self._started
        for pool in self.pools:
            pool.stop(timeout=60)
        if self.proxy is not None:
            self.proxy.disarm()
        swept = self.sweep()
        poison_set = set(self.poison_ids if poison is None else poison)
        s = self.settings
        events = self.ledger.events()
        counts = count(
            events, dead_letters=self.dead_letter_ids(), swept=swept,
            remaining=self.remaining(), visibility_timeout=s.visibility_timeout,
            poison=poison_set, max_delivery_count=s.max_delivery_count if poison_set else None,
        )
        faults = self.proxy.fault_log() if self.proxy is not None else []
        aliases = {ev["id"]: ev["mid"] for ev in events if ev.get("e") == "start" and "mid" in ev}
        # every overlap is judged (counts.details lists only the first DETAIL_CAP)
        every = overlaps(deliveries(events), s.visibility_timeout, SLACK_SECONDS)
        explained = explain_overlaps(
            [{**attrs.asdict(o), "id": aliases.get(o.id, o.id)} for o in every],
            faults, jitter_min_ms=s.jitter_min_ms)
        chosen = [ev["strategy_chosen"] for ev in events if ev.get("e") == "probe"]
        all_notes: dict[str, Any] = {
            "seconds": round(seconds, 1),
            "rate_per_s": round(counts.published / seconds, 1) if seconds > 0 else None,
            "faults": dict(Counter(f.kind for f in faults)),
            "proxy_requests": self.proxy.requests if self.proxy is not None else 0,
            "kills": sum(p.kills for p in self.pools),
            "strategy_chosen": chosen[-1] if chosen else s.strategy,
            "overlap_delays": explained,
            **self.notes, **(notes or {}),
        }
        misses = judge(counts, events=events, strategy=all_notes["strategy_chosen"],
                       poison=poison_set, explained=explained) + list(extra_misses)
        return ScenarioResult(
            scenario=scenario, name=name, kind=s.kind, strategy=s.strategy, counts=counts,
            notes=all_notes, goals_met=not misses, misses=misses,
        )


def _normal_id() -> str:
    while True:
        mid = str(uuid.uuid4())
        if not mid.startswith(POISON_PREFIX):
            return mid

