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
    RequestCounter,
    Sync,
    close_window,
    cpu_seconds,
    load_spec,
    open_window,
    payload,
    publish_time,
    write_result,
)
from pawn_queue import PawnQueue


async def main() -> None:
    spec = load_spec()
    sync = Sync(spec)
    counter = RequestCounter()
    pq = await PawnQueue.from_config(spec["config"])
    await pq.setup()
    try:
        counter.register(pq._client._client.meta.events)
        topic = spec["topic"]
        if spec.get("create_topic", True):
            await pq.create_topic(topic)
        role = spec["role"]
        result = await ROLES[role](pq, spec, sync, counter, topic)
        result["role"] = role
        write_result(spec, result)
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
    polls = []
    for _ in range(int(spec.get("polls", 3))):
        before, c0, t0 = counter.snapshot(), cpu_seconds(), time.perf_counter()
        msgs = await consumer.poll()
        poll_s, poll_cpu = time.perf_counter() - t0, cpu_seconds() - c0
        poll_req = RequestCounter.diff(counter.snapshot(), before)
        mid = counter.snapshot()
        for m in msgs:
            await m.ack()
        polls.append({
            "messages": len(msgs),
            "seconds": poll_s,
            "cpu": poll_cpu,
            "requests": poll_req,
            "ack_requests": RequestCounter.diff(counter.snapshot(), mid),
        })
    return close_window(w, counter, polls=polls, n=sum(p["messages"] for p in polls))


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
    second_half = RequestCounter.diff(counter.snapshot(), half)
    return close_window(w, counter, seconds=seconds, interval=interval, mode="listen", n=0,
                         second_half=second_half)


ROLES = {
    "publish": role_publish,
    "consume": role_consume,
    "poll_cost": role_poll_cost,
    "idle": role_idle,
}

if __name__ == "__main__":
    asyncio.run(main())
