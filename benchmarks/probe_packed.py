"""What bounds a packed-topic scenario: one scenario in this process, with its S3
requests counted by operation, the requests in flight (time-weighted mean and
maximum), the process's and the server's CPU, and optionally a py-spy profile of this
process (``--gil``: only the thread holding the GIL is sampled, so samples are Python
work, not waits; by thread, leaf function and file).

    python -m benchmarks.probe_packed publish16 [-n 50000] [--py-spy]
    python -m benchmarks.probe_packed publish_batch|consume|consume_plain [...]
    python -m benchmarks.probe_packed puts   # PUT latency and throughput by object size

``--py-spy`` uses ``py-spy`` from PATH, from ``$PY_SPY`` or from
``~/.cache/pawn-queue-sync/pyspy-venv`` (``python -m venv`` + ``pip install py-spy``:
a tool of the benchmark, not a dependency). Results are printed and written to
``benchmarks/results/probe_packed-<scenario>.json``. A SeaweedFS of its own is started
unless ``--endpoint`` is given.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from benchmarks.driverlib import RequestCounter, cpu_seconds, payload
from benchmarks.packed import CONSUME, PAYLOAD_BYTES
from benchmarks.server import SeaweedServer
from benchmarks.settings import OURS, RESULTS, lib_config, polling


class InFlight:
    """Requests in flight, from the client's before-send / after-send events: the
    time-weighted mean and the maximum over the window."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.now = self.max = 0
        self._area = 0.0
        self._t0 = self._last = time.perf_counter()

    def _move(self, step: int) -> None:
        with self._lock:
            t = time.perf_counter()
            self._area += self.now * (t - self._last)
            self._last = t
            self.now += step
            self.max = max(self.max, self.now)

    def register(self, events: Any) -> None:
        events.register("before-send.s3", lambda **_: self._move(1))
        events.register("after-send.s3", lambda **_: self._move(-1))

    def reset(self) -> None:
        with self._lock:
            self._area, self.max = 0.0, self.now
            self._t0 = self._last = time.perf_counter()

    def mean(self) -> float:
        self._move(0)
        return self._area / max(self._last - self._t0, 1e-9)


def py_spy_binary() -> str | None:
    for cand in (os.environ.get("PY_SPY"), shutil.which("py-spy"),
                 str(Path.home() / ".cache/pawn-queue-sync/pyspy-venv/bin/py-spy")):
        if cand and os.path.exists(cand):
            return cand
    return None


def summarize_raw(path: Path, top: int = 20) -> dict[str, Any]:
    """Leaf functions and files by samples, from py-spy's raw (collapsed) output."""
    leaf: collections.Counter[str] = collections.Counter()
    files: collections.Counter[str] = collections.Counter()
    threads: collections.Counter[str] = collections.Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        n = int(count)
        total += n
        frames = stack.split(";")
        leaf[frames[-1]] += n
        # 'thread (TID): NAME' -> NAME without its numbers: samples by kind of thread
        name = frames[0].split(": ", 1)[-1] if frames[0].startswith("thread") else "?"
        threads[re.sub(r"[-_]?\d+$", "", name)] += n
        for f in {fr.split("(", 1)[-1].split(":", 1)[0] for fr in frames}:
            files[f] += n
    return {"samples": total,
            "threads": [(t, n, round(100 * n / max(total, 1), 1))
                        for t, n in threads.most_common(top)],
            "leaf": [(f, n, round(100 * n / max(total, 1), 1)) for f, n in leaf.most_common(top)],
            "files_inclusive": [(f, n, round(100 * n / max(total, 1), 1))
                                for f, n in files.most_common(top)]}


def run(args: argparse.Namespace, endpoint: str, server: SeaweedServer | None) -> dict[str, Any]:
    from pawn_queue_sync import PawnQueue, load_config

    cfg = lib_config(OURS, endpoint, "pqs-probe", "conditional_write",
                     polling(CONSUME["max_messages"]), CONSUME["claim_threads"])
    if args.segment_messages:  # e.g. 16: the segments a steady 2,000 msg/s makes
        cfg["publishing"]["max_segment_messages"] = args.segment_messages
    for item in args.set:  # SECTION.KEY=VALUE
        name, value = _parse(item)
        section, _, key = name.partition(".")
        cfg.setdefault(section, {})[key] = value
    pq = PawnQueue(load_config(cfg))
    pq.setup()
    counter, inflight = RequestCounter(), InFlight()
    events = pq.store._client().meta.events  # type: ignore[attr-defined]
    counter.register(events)
    inflight.register(events)
    topic = f"probe-{args.scenario}-{int(time.time())}"
    pq.create_topic(topic, packed=args.scenario != "consume_plain")
    producer = pq.register_producer("probe")
    n = args.n
    if args.scenario.startswith("consume"):
        for start in range(0, n, 10000):
            producer.publish_batch(topic, [payload(i, PAYLOAD_BYTES)
                                           for i in range(start, min(n, start + 10000))])
    spy = _start_spy(args)
    counter.reset()
    inflight.reset()
    srv0 = server.cpu_seconds() if server else None
    cpu0, t0 = cpu_seconds(), time.perf_counter()
    if args.scenario == "publish16":
        _publish16(producer, topic, n)
    elif args.scenario == "publish_batch":
        for start in range(0, n, 20000):
            producer.publish_batch(topic, [payload(i, PAYLOAD_BYTES)
                                           for i in range(start, min(n, start + 20000))],
                                   threads=16)
    else:
        _consume(pq, topic, n, dict(_parse(item) for item in args.listen))
    took, cpu = time.perf_counter() - t0, cpu_seconds() - cpu0
    srv = (server.cpu_seconds() or 0) - srv0 if server and srv0 is not None else None
    result = {
        "scenario": args.scenario, "settings": args.set + args.listen, "messages": n,
        "seconds": took,
        "msgs_per_s": n / took,
        "client_cpu_ms_per_msg": 1000 * cpu / n, "client_cpu_cores": cpu / took,
        "server_cpu_ms_per_msg": 1000 * srv / n if srv is not None else None,
        "server_cpu_cores": srv / took if srv is not None else None,
        "requests": counter.snapshot(),
        "requests_per_msg": sum(v for k, v in counter.snapshot().items()
                                if not k.startswith("!")) / n,
        "in_flight_mean": inflight.mean(), "in_flight_max": inflight.max,
        "loadavg": [round(x, 2) for x in os.getloadavg()],
    }
    if spy:
        result["py_spy"] = _stop_spy(*spy)
    pq.teardown()
    return result


def put_costs(endpoint: str, server: SeaweedServer | None) -> dict[str, Any]:
    """What one PUT costs by object size, through the library's store: the latency of
    sequential PUTs (p50, p90) and the rate of 16 concurrent ones, with the server's CPU.
    A segment of 16 messages of 1 KiB is ~18 KiB; a full one (1,000) ~1.1 MiB."""
    from concurrent.futures import ThreadPoolExecutor

    from pawn_queue_sync import PawnQueue, load_config

    pq = PawnQueue(load_config(lib_config(OURS, endpoint, "pqs-probe", "conditional_write",
                                          polling(10))))
    pq.setup()
    store = pq.store
    out: dict[str, Any] = {"scenario": "puts", "sizes": []}
    for size, count in ((1200, 200), (18 * 1024, 200), (1100 * 1024, 40)):
        body = b"x" * size
        lat = []
        for i in range(count):
            t = time.perf_counter()
            store.put(f"puts/{size}/seq-{i}", body)
            lat.append(1000 * (time.perf_counter() - t))
        lat.sort()
        srv0 = server.cpu_seconds() if server else None
        t0 = time.perf_counter()
        with ThreadPoolExecutor(16) as pool:
            list(pool.map(lambda i, b=body, z=size: store.put(f"puts/{z}/par-{i}", b),
                          range(count)))
        took = time.perf_counter() - t0
        srv = (server.cpu_seconds() or 0) - srv0 if server and srv0 is not None else None
        out["sizes"].append({
            "bytes": size, "sequential_ms_p50": lat[len(lat) // 2],
            "sequential_ms_p90": lat[int(len(lat) * 0.9)],
            "concurrent16_puts_per_s": count / took,
            "concurrent16_mib_per_s": count * size / took / 2**20,
            "server_cpu_ms_per_put": 1000 * srv / count if srv is not None else None})
    out["loadavg"] = [round(x, 2) for x in os.getloadavg()]
    pq.teardown()
    return out


def _publish16(producer: Any, topic: str, n: int) -> None:
    seq = iter(range(n))
    lock = threading.Lock()

    def work() -> None:
        while True:
            with lock:
                i = next(seq, None)
            if i is None:
                return
            producer.publish(topic, payload(i, PAYLOAD_BYTES))

    threads = [threading.Thread(target=work) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def _parse(item: str) -> tuple[str, Any]:
    """KEY=VALUE, VALUE as JSON where it parses."""
    key, _, value = item.partition("=")
    try:
        return key, json.loads(value)
    except ValueError:
        return key, value


def _consume(pq: Any, topic: str, n: int, options: dict[str, Any]) -> None:
    consumer = pq.register_consumer("probe-consumer", [topic])
    done = threading.Event()
    count = [0]
    lock = threading.Lock()

    def handler(msg: Any) -> None:
        with lock:
            count[0] += 1
            if count[0] >= n:
                done.set()

    options.setdefault("max_workers", CONSUME["workers"])
    consumer.listen(handler, stop_event=done, **options)


def _start_spy(args: argparse.Namespace) -> tuple[subprocess.Popen[bytes], Path] | None:
    if not args.py_spy:
        return None
    binary = py_spy_binary()
    if binary is None:
        print("py-spy not found: no profile", file=sys.stderr)
        return None
    out = Path(tempfile.mkdtemp()) / "profile.txt"
    proc = subprocess.Popen([binary, "record", "--pid", str(os.getpid()), "--rate", "200",
                             "--format", "raw", "--nonblocking", "--threads", "--gil",
                             "-o", str(out)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1.0)  # attached before the window opens
    return proc, out


def _stop_spy(proc: subprocess.Popen[bytes], out: Path) -> dict[str, Any]:
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=60)
    return summarize_raw(out) if out.exists() else {"error": "py-spy wrote nothing"}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.probe_packed", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("scenario", choices=["publish16", "publish_batch", "consume",
                                        "consume_plain", "puts"])
    p.add_argument("-n", type=int, default=20000)
    p.add_argument("--endpoint")
    p.add_argument("--py-spy", action="store_true")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="a setting of the probe's client, e.g. polling.max_segments_held=16")
    p.add_argument("--listen", action="append", default=[], metavar="KEY=VALUE",
                   help="a listen() option for consume, e.g. ack_flush_interval_seconds=0.01")
    p.add_argument("--segment-messages", type=int, default=0,
                   help="publishing.max_segment_messages of the probe's client (the seeded "
                        "backlog's segment size for consume)")
    args = p.parse_args(argv)
    with SeaweedServer() if not args.endpoint else contextlib.nullcontext() as server:
        endpoint = args.endpoint or server.endpoint
        from pawn_queue_sync.config import load_config
        from pawn_queue_sync.storage.s3 import S3Store

        cfg = load_config(lib_config(OURS, endpoint, "pqs-probe", "conditional_write",
                                     polling(10)))
        assert cfg.s3 is not None
        store = S3Store(cfg.s3)
        store.ensure_bucket(create=True)
        store.close()
        result = (put_costs(endpoint, server) if args.scenario == "puts"
                  else run(args, endpoint, server))
    print(json.dumps(result, indent=1))
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"probe_packed-{args.scenario}.json").write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
