"""Benchmark driver for redis-message-queue 11 (runs in its own venv, see
:mod:`benchmarks.rmq`): ``RMQ_PYTHON benchmarks/rmq_driver.py SPEC.json``.

Publishes ``n`` payloads of the benchmark's shape (1 KiB), then consumes them with one
consumer the way its README shows (``with queue.process_message() as received:`` in a
loop), and writes rates, CPU per message and Redis commands per message (from the
server's ``INFO stats``) to ``spec["out"]``. The queue is built with the library's
defaults (at-least-once: visibility timeout 300 s, max_delivery_count 10).
"""

from __future__ import annotations

import importlib.metadata as md
import json
import os
import sys
import time
from typing import Any

import redis.client
from driverlib import cpu_seconds, payload, publish_time, quantile
from redis import Redis
from redis_message_queue import RedisMessageQueue

#: client round trips: one per command sent alone, one per pipeline executed
ROUND_TRIPS = [0]


def _counted(method: Any) -> Any:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        ROUND_TRIPS[0] += 1
        return method(*args, **kwargs)
    return wrapper


redis.client.Redis.execute_command = _counted(redis.client.Redis.execute_command)
redis.client.Pipeline.execute = _counted(redis.client.Pipeline.execute)


def commands(client: Any) -> int:
    """Commands the server ran so far (those run inside Lua scripts included)."""
    return int(client.info("stats")["total_commands_processed"])


def main() -> None:
    with open(sys.argv[1]) as f:
        spec = json.load(f)
    n, size = int(spec["n"]), int(spec.get("payload_bytes", 0))
    client = Redis.from_url(spec["url"], decode_responses=True)
    queue = RedisMessageQueue(spec["queue"], client=client)
    result: dict[str, Any] = {"n": n}

    c0, cpu0, t0 = commands(client), cpu_seconds(), time.perf_counter()
    r0 = ROUND_TRIPS[0]
    for i in range(n):
        queue.publish(payload(i, size))
    took = time.perf_counter() - t0
    result["publish"] = {"seconds": took, "cpu": cpu_seconds() - cpu0,
                         "round_trips": ROUND_TRIPS[0] - r0,
                         "commands": commands(client) - c0 - 1}

    seen: set[int] = set()
    lat: list[float] = []
    duplicates = 0
    c0, cpu0, t0 = commands(client), cpu_seconds(), time.perf_counter()
    r0 = ROUND_TRIPS[0]
    deadline = time.monotonic() + float(spec.get("timeout", 600))
    while len(seen) < n and time.monotonic() < deadline:
        with queue.process_message() as received:
            if received is None:
                continue
            doc = json.loads(received)
            lat.append((time.time() - publish_time(doc)) * 1000.0)
            if doc["seq"] in seen:
                duplicates += 1
            seen.add(doc["seq"])
    took = time.perf_counter() - t0
    result["consume"] = {"seconds": took, "cpu": cpu_seconds() - cpu0,
                         "round_trips": ROUND_TRIPS[0] - r0,
                         "commands": commands(client) - c0 - 1, "messages": len(seen),
                         "duplicates": duplicates, "lost": n - len(seen),
                         "latency_ms": {"p50": quantile(lat, 0.5), "p99": quantile(lat, 0.99)}}
    result["versions"] = {p: md.version(p) for p in ("redis-message-queue", "redis")}
    result["python"] = sys.version.split()[0]
    client.close()
    with open(spec["out"] + ".tmp", "w") as f:
        json.dump(result, f)
    os.replace(spec["out"] + ".tmp", spec["out"])


if __name__ == "__main__":
    main()
