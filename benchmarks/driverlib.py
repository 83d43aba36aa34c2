"""What both benchmark drivers share: stdlib only, because one of them runs in
pawn-queue's venv and the other in ours.

A driver is started as ``python DRIVER.py SPEC.json``. It sets its queue up, counts
every S3 request its client sends (a botocore ``before-send.s3`` hook), writes
``ready-<index>`` into the spec's sync directory, waits for ``go``, runs its role, and
writes the result as JSON to ``spec["out"]``. Consumers append one line per acked
message to ``acks-<index>.txt`` (``id publish_time ack_time``) and stop when ``stop``
appears.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

#: the roles a driver plays; each driver module defines ``role_<name>`` for every one
ROLE_NAMES = ("publish", "consume", "poll_cost", "idle")


def role_table(namespace: Mapping[str, Any]) -> dict[str, Callable[..., Any]]:
    """A driver's role functions by name, from its module ``globals()``: both drivers
    answer the same roles, and one that lacks a role fails at import, not mid-run."""
    return {name: namespace[f"role_{name}"] for name in ROLE_NAMES}


class RequestCounter:
    """Counts S3 requests by operation; register :meth:`hook` on a botocore client's
    ``meta.events`` for ``before-send.s3`` (fires once per HTTP attempt, retries too)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.ops: Counter[str] = Counter()

    def hook(self, event_name: str = "", **_: Any) -> None:
        op = event_name.rsplit(".", 1)[-1] if event_name else "?"
        with self._lock:
            self.ops[op] += 1

    def status_hook(self, event_name: str = "", http_response: Any = None, **_: Any) -> None:
        """For ``after-call.s3``: count answers >= 300 as ``"!Op status"`` (412 lost
        claims, 404 reads of vanished objects)."""
        status = getattr(http_response, "status_code", None)
        if status is not None and status >= 300:
            op = event_name.rsplit(".", 1)[-1] if event_name else "?"
            with self._lock:
                self.ops[f"!{op} {status}"] += 1

    def register(self, events: Any) -> None:
        events.register("before-send.s3", self.hook)
        events.register("after-call.s3", self.status_hook)
        # pawn-queue-sync's fast path (storage/s3/wire.py) answers through this event
        events.register("after-send.s3", self.status_hook)

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self.ops)

    def reset(self) -> None:
        with self._lock:
            self.ops.clear()

    @staticmethod
    def diff(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
        keys = set(after) | set(before)
        out = {k: after.get(k, 0) - before.get(k, 0) for k in keys}
        return {k: v for k, v in sorted(out.items()) if v}


def cpu_seconds() -> float:
    """User + system CPU of this process, all threads."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime



class Sync:
    """File-based rendezvous with the runner (works across venvs and processes)."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.dir = spec["sync_dir"]
        self.index = int(spec.get("index", 0))
        self._stop_path = os.path.join(self.dir, "stop")
        self._acks = None

    def ready(self) -> None:
        path = os.path.join(self.dir, f"ready-{self.index}")
        with open(path + ".tmp", "w") as f:
            f.write(str(os.getpid()))
        os.replace(path + ".tmp", path)

    def wait_go(self, timeout: float = 300.0) -> float:
        """Block until the runner says go; returns the wall-clock start time."""
        go = os.path.join(self.dir, "go")
        deadline = time.monotonic() + timeout
        while not os.path.exists(go):
            if time.monotonic() > deadline:
                raise TimeoutError("runner never said go")
            time.sleep(0.005)
        return time.time()

    def stopped(self) -> bool:
        return os.path.exists(self._stop_path)

    def record_acks(self, rows: list[tuple[str, float, float]]) -> None:
        if self._acks is None:
            self._acks = open(os.path.join(self.dir, f"acks-{self.index}.txt"), "a")  # noqa: SIM115
        self._acks.write("".join(f"{mid} {tp:.6f} {ta:.6f}\n" for mid, tp, ta in rows))
        self._acks.flush()

    def close(self) -> None:
        if self._acks is not None:
            self._acks.close()
            self._acks = None


def start_driver() -> tuple[dict[str, Any], Sync, RequestCounter]:
    """The spec named on the command line, its rendezvous with the runner, and the
    request counter the driver registers on its client."""
    with open(sys.argv[1]) as f:
        spec = json.load(f)
    return spec, Sync(spec), RequestCounter()


def write_result(spec: dict[str, Any], result: dict[str, Any]) -> None:
    """Write a role's result (with the role's name and this process id) for the runner."""
    result["role"] = spec["role"]
    result.setdefault("pid", os.getpid())
    out = spec["out"]
    with open(out + ".tmp", "w") as f:
        json.dump(result, f)
    os.replace(out + ".tmp", out)


def payload(seq: int, size: int = 0) -> dict[str, Any]:
    """A small payload that carries its publish time; with ``size``, padded so that
    its compact JSON is ``size`` bytes (e.g. 1024 for the packed-topic scenarios)."""
    t = time.time()
    doc: dict[str, Any] = {"seq": seq, "t": t}
    if size:  # len('{"seq":' ',"t":' ',"pad":""}') == 22; json writes floats by repr
        doc["pad"] = "x" * max(size - 22 - len(str(seq)) - len(repr(t)), 0)
    return doc


def publish_time(payload_obj: Any) -> float:
    try:
        return float(payload_obj["t"])
    except (TypeError, KeyError, ValueError):
        return float("nan")


def quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    data = sorted(values)
    pos = (len(data) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(data) - 1)
    return data[lo] + (data[hi] - data[lo]) * (pos - lo)


def open_window(counter: RequestCounter, sync: Sync, wait: bool = True) -> dict[str, Any]:
    """Start a measured window: wait for the common go signal (or start now), and
    remember the CPU time and request counts at its start."""
    if wait:
        sync.ready()
        t0 = sync.wait_go()
    else:
        t0 = time.time()
    return {"t_go": t0, "cpu0": cpu_seconds(), "req0": counter.snapshot()}


def close_window(w: dict[str, Any], counter: RequestCounter, **extra: Any) -> dict[str, Any]:
    """End a window: elapsed time, CPU and requests since ``open_window``."""
    return {
        "t_go": w["t_go"],
        "t_end": time.time(),
        "cpu": cpu_seconds() - w["cpu0"],
        "requests": RequestCounter.diff(counter.snapshot(), w["req0"]),
        **extra,
    }


def close_idle_window(w: dict[str, Any], counter: RequestCounter, half: dict[str, int], *,
                      seconds: float, interval: float, mode: str) -> dict[str, Any]:
    """End an idle consumer's window; ``half`` is the request counts at its middle, so
    the second half (after start-up) is reported on its own."""
    second_half = RequestCounter.diff(counter.snapshot(), half)
    return close_window(w, counter, seconds=seconds, interval=interval, mode=mode, n=0,
                        second_half=second_half)


class PollCost:
    """Measures single polls one after the other: call :meth:`begin` right before a
    poll, :meth:`polled` right after it, :meth:`acked` once its messages are acked.
    Each poll's seconds, CPU and requests, and its acks' requests, go to ``polls``."""

    def __init__(self, counter: RequestCounter) -> None:
        self.counter = counter
        self.polls: list[dict[str, Any]] = []
        self._before: dict[str, int] = {}
        self._c0 = self._t0 = 0.0
        self._row: dict[str, Any] = {}
        self._mid: dict[str, int] = {}

    def begin(self) -> None:
        self._before, self._c0, self._t0 = (self.counter.snapshot(), cpu_seconds(),
                                            time.perf_counter())

    def polled(self, messages: int) -> None:
        poll_s, poll_cpu = time.perf_counter() - self._t0, cpu_seconds() - self._c0
        poll_req = RequestCounter.diff(self.counter.snapshot(), self._before)
        self._mid = self.counter.snapshot()
        self._row = {"messages": messages, "seconds": poll_s, "cpu": poll_cpu,
                     "requests": poll_req}

    def acked(self) -> None:
        self._row["ack_requests"] = RequestCounter.diff(self.counter.snapshot(), self._mid)
        self.polls.append(self._row)

    def close(self, w: dict[str, Any]) -> dict[str, Any]:
        """End the window opened before the first poll."""
        return close_window(w, self.counter, polls=self.polls,
                            n=sum(p["messages"] for p in self.polls))
