"""Benchmark driver for pawn-queue-sync (runs in this project's venv).

``python benchmarks/ours_driver.py SPEC.json``; see :mod:`driverlib` for the protocol.
Requests are counted with a hook on the S3Store's process-local boto3 client
(``store._client().meta.events``), registered in every process.
"""

from __future__ import annotations

import itertools
import threading
import time
from typing import Any

from driverlib import (
    PollCost,
    RequestCounter,
    Sync,
    close_idle_window,
    close_window,
    open_window,
    payload,
    publish_time,
    quantile,
    role_table,
    start_driver,
    write_result,
)

from pawn_queue_sync import PawnQueue, load_config


def _listen_available() -> bool:
    try:
        from pawn_queue_sync.runtime import listen  # noqa: F401
    except ImportError:
        return False
    return True


def main() -> None:
    spec, sync, counter = start_driver()
    pq = PawnQueue(load_config(spec["config"]))
    pq.setup()
    try:
        counter.register(pq.store._client().meta.events)  # type: ignore[attr-defined]
        topic = spec["topic"]
        if spec.get("create_topic", True):
            if spec.get("packed"):  # issue 14: a packed topic (segments, group commit)
                pq.create_topic(topic, packed=True)  # type: ignore[call-arg]
            else:
                pq.create_topic(topic)
        write_result(spec, ROLES[spec["role"]](pq, spec, sync, counter, topic))
    finally:
        sync.close()
        pq.teardown()


def role_publish(pq: PawnQueue, spec: dict[str, Any], sync: Sync, counter: RequestCounter,
                 topic: str) -> dict[str, Any]:
    n = int(spec["n"])
    producer = pq.register_producer(spec.get("name", "bench-producer"))
    wait = spec.get("wait_go", True)
    mode = spec.get("mode", "sequential")
    rate = spec.get("rate")
    chunk = int(spec.get("chunk", 0)) or n
    size = int(spec.get("payload_bytes", 0))
    w = open_window(counter, sync, wait)
    if mode == "batch":
        threads = int(spec.get("threads", 16))
        for start in range(0, n, chunk):
            producer.publish_batch(
                topic, [payload(i, size) for i in range(start, min(n, start + chunk))],
                threads=threads,
            )
    elif mode == "threads":
        late = _publish_threads(producer, topic, n, int(spec.get("threads", 16)), rate, size)
        return close_window(w, counter, n=n, late_ms=late)
    else:
        t_start = time.monotonic()
        for i in range(n):
            if rate:
                delay = t_start + i / rate - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
            producer.publish(topic, payload(i, size))
    return close_window(w, counter, n=n)


def _publish_threads(producer: Any, topic: str, n: int, threads: int, rate: float | None,
                     size: int) -> dict[str, float | None]:
    """``threads`` threads calling ``publish()`` until ``n`` messages are published; with
    ``rate``, message i is due at ``i / rate`` s after the start (open loop: a slow
    publish delays only its thread). Returns how late publishes started (ms p50, p99,
    max), which tells whether the rate held. Raises the first publish error."""
    seq = itertools.count()
    lateness: list[float] = []
    errors: list[BaseException] = []
    t_start = time.monotonic()

    def work() -> None:
        while not errors:
            i = next(seq)
            if i >= n:
                return
            if rate:
                delay = t_start + i / rate - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                else:
                    lateness.append(-delay * 1000.0)
            try:
                producer.publish(topic, payload(i, size))
            except BaseException as exc:
                errors.append(exc)

    pool = [threading.Thread(target=work, daemon=True) for _ in range(threads)]
    for th in pool:
        th.start()
    for th in pool:
        th.join()
    if errors:
        raise errors[0]
    late = sorted(lateness + [0.0] * (n - len(lateness))) if rate else []
    return {"p50": quantile(late, 0.5), "p99": quantile(late, 0.99),
            "max": late[-1] if late else None}


def role_consume(pq: PawnQueue, spec: dict[str, Any], sync: Sync, counter: RequestCounter,
                 topic: str) -> dict[str, Any]:
    consumer = pq.register_consumer(spec.get("name", "bench-consumer"), topics=[topic])
    interval = float(spec.get("interval", pq.config.polling.interval_seconds))
    mode = spec.get("mode", "poll")
    if mode == "listen" and not _listen_available():
        mode = "poll"
    w = open_window(counter, sync)
    done = 0
    if mode == "listen":
        done = _consume_listen(consumer, spec, sync)
    else:
        max_messages = spec.get("max_messages")
        while not sync.stopped():
            msgs = consumer.poll(max_messages)
            if not msgs:
                time.sleep(interval)
                continue
            consumer.ack_many(msgs)
            t = time.time()
            sync.record_acks([(m.id, publish_time(m.payload), t) for m in msgs])
            done += len(msgs)
    return close_window(w, counter, n=done, mode=mode)


def _consume_listen(consumer: Any, spec: dict[str, Any], sync: Sync) -> int:
    """Consume with ``consumer.listen`` (its thread pool and batched acks). Ack times
    are taken when ``ack_many`` returns, by wrapping it on this consumer instance; with
    ``stamp: "handler"`` the time the handler was called is recorded instead (end to end
    publish -> handler), and every call counts (a redelivery shows as a duplicate)."""
    stop = threading.Event()
    done = 0
    ack_many = consumer.ack_many
    handled: list[tuple[str, float, float]] = []
    by_handler = spec.get("stamp") == "handler"

    def handler(msg: Any) -> None:
        if by_handler:  # list.append is atomic: the watcher writes the rows out
            handled.append((msg.id, publish_time(msg.payload), time.time()))

    def timed_ack_many(msgs: Any) -> None:
        nonlocal done
        msgs = list(msgs)
        try:
            ack_many(msgs)
        finally:
            t = time.time()
            rows = [(m.id, publish_time(m.payload), t) for m in msgs if m.state == "acked"]
            if rows:
                sync.record_acks(rows)
                done += len(rows)

    if not by_handler:
        consumer.ack_many = timed_ack_many
    written = 0

    def flush_handled() -> None:
        nonlocal written, done
        upto = len(handled)
        if upto > written:
            sync.record_acks(handled[written:upto])
            done += upto - written
            written = upto

    def watcher() -> None:
        while not sync.stopped():
            time.sleep(0.02)
            flush_handled()
        stop.set()

    th = threading.Thread(target=watcher, daemon=True)
    th.start()
    consumer.listen(handler, max_workers=int(spec.get("workers", 8)), stop_event=stop)
    th.join()
    flush_handled()
    return done


def role_poll_cost(pq: PawnQueue, spec: dict[str, Any], sync: Sync, counter: RequestCounter,
                   topic: str) -> dict[str, Any]:
    """K single polls on a backlog: requests and seconds of each poll, and of its acks."""
    consumer = pq.register_consumer(spec.get("name", "bench-scale"), topics=[topic])
    max_messages = int(spec.get("max_messages", 10))
    w = open_window(counter, sync, spec.get("wait_go", False))
    cost = PollCost(counter)
    for _ in range(int(spec.get("polls", 5))):
        cost.begin()
        msgs = consumer.poll(max_messages)
        cost.polled(len(msgs))
        if msgs:
            consumer.ack_many(msgs)
        cost.acked()
    return cost.close(w)


def role_idle(pq: PawnQueue, spec: dict[str, Any], sync: Sync, counter: RequestCounter,
              topic: str) -> dict[str, Any]:
    """An idle consumer for ``seconds``: how many requests does it make?"""
    consumer = pq.register_consumer(spec.get("name", "bench-idle"), topics=[topic])
    seconds = float(spec["seconds"])
    interval = float(pq.config.polling.interval_seconds)
    mode = spec.get("mode", "poll")
    if mode == "listen" and not _listen_available():
        mode = "poll"
    w = open_window(counter, sync, wait=False)
    half: dict[str, Any] = {}
    snap = threading.Timer(seconds / 2, lambda: half.update(counter.snapshot()))
    snap.start()
    if mode == "listen":
        stop = threading.Event()
        timer = threading.Timer(seconds, stop.set)
        timer.start()
        consumer.listen(lambda m: None, max_workers=2, stop_event=stop)
        timer.cancel()
    else:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if not consumer.poll():
                time.sleep(min(interval, max(0.0, deadline - time.monotonic())))
    snap.join()
    return close_idle_window(w, counter, half, seconds=seconds, interval=interval, mode=mode)


ROLES = role_table(globals())

if __name__ == "__main__":
    main()
