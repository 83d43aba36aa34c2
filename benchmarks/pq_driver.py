"""Benchmark driver for pawn-queue 0.1.3 (runs in pawn-queue's own venv).

``PQ_PYTHON benchmarks/pq_driver.py SPEC.json``; see :mod:`driverlib` for the protocol.
Requests are counted with a hook on the aiobotocore client pawn-queue opens in
``setup()`` (``pq._client._client.meta.events``, ``before-send.s3``).

pawn-queue is driven the way its README shows: ``await consumer.poll()`` then
``await msg.ack()`` for each message, in a tight loop that sleeps
``interval_seconds`` only after an empty poll (its own ``listen`` sleeps after every
poll, which would only make it slower); idle cost is measured with its ``listen``.
"""

from __future__ import annotations

import asyncio
import contextlib
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
    role_table,
    start_driver,
    write_result,
)
from pawn_queue import PawnQueue


async def main() -> None:
    spec, sync, counter = start_driver()
    pq = await PawnQueue.from_config(spec["config"])
    await pq.setup()
    try:
        counter.register(pq._client._client.meta.events)
        topic = spec["topic"]
        if spec.get("create_topic", True):
            await pq.create_topic(topic)
        write_result(spec, await ROLES[spec["role"]](pq, spec, sync, counter, topic))
    finally:
        sync.close()
        await pq.teardown()


async def role_publish(pq: Any, spec: dict[str, Any], sync: Sync, counter: RequestCounter,
                       topic: str) -> dict[str, Any]:
    n = int(spec["n"])
    producer = await pq.register_producer(spec.get("name", "bench-producer"))
    mode = spec.get("mode", "sequential")
    rate = spec.get("rate")
    w = open_window(counter, sync, spec.get("wait_go", True))
    if mode == "batch":  # pawn-queue has no batch call: publish concurrently
        await asyncio.gather(*(producer.publish(topic, payload(i)) for i in range(n)))
    else:
        t_start = time.monotonic()
        for i in range(n):
            if rate:
                delay = t_start + i / rate - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
            await producer.publish(topic, payload(i))
    return close_window(w, counter, n=n)


async def role_consume(pq: Any, spec: dict[str, Any], sync: Sync, counter: RequestCounter,
                       topic: str) -> dict[str, Any]:
    consumer = await pq.register_consumer(spec.get("name", "bench-consumer"), topics=[topic])
    interval = float(spec.get("interval", spec["config"]["polling"]["interval_seconds"]))
    w = open_window(counter, sync)
    done = 0
    while not sync.stopped():
        msgs = await consumer.poll()
        if not msgs:
            await asyncio.sleep(interval)
            continue
        rows = []
        for m in msgs:
            await m.ack()
            rows.append((m.id, publish_time(m.payload), time.time()))
        sync.record_acks(rows)
        done += len(rows)
    return close_window(w, counter, n=done, mode="poll")


async def role_poll_cost(pq: Any, spec: dict[str, Any], sync: Sync, counter: RequestCounter,
                         topic: str) -> dict[str, Any]:
    consumer = await pq.register_consumer(spec.get("name", "bench-scale"), topics=[topic])
    w = open_window(counter, sync, spec.get("wait_go", False))
    cost = PollCost(counter)
    for _ in range(int(spec.get("polls", 3))):
        cost.begin()
        msgs = await consumer.poll()
        cost.polled(len(msgs))
        for m in msgs:
            await m.ack()
        cost.acked()
    return cost.close(w)


async def role_idle(pq: Any, spec: dict[str, Any], sync: Sync, counter: RequestCounter,
                    topic: str) -> dict[str, Any]:
    consumer = await pq.register_consumer(spec.get("name", "bench-idle"), topics=[topic])
    seconds = float(spec["seconds"])

    async def handler(msg: Any) -> None:
        await msg.ack()

    w = open_window(counter, sync, wait=False)
    task = asyncio.create_task(consumer.listen(handler))
    await asyncio.sleep(seconds / 2)
    half = counter.snapshot()
    await asyncio.sleep(seconds / 2)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    interval = float(spec["config"]["polling"]["interval_seconds"])
    return close_idle_window(w, counter, half, seconds=seconds, interval=interval,
                             mode="listen")


ROLES = role_table(globals())

if __name__ == "__main__":
    asyncio.run(main())
