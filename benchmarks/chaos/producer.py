"""A producer process for scenario 5 (producers killed mid-publish): it publishes until
stopped or its budget is spent, and records every call in the ledger.

Before each call it writes ``pubtry`` {ids} (what it is about to publish); after the
call returns, one ``pub`` {ids} line for all of them (a kill cannot leave half of a
returned call recorded); when the call raises, ``pub`` {ids} for the ids that a
PublishError says were written and ``pubfail`` for the rest (``ledger.record_publish``).
A kill -9 mid-call leaves ids with ``pubtry`` alone: the scenario records them as
``pubfail`` ("killed") for the accounting, which counts those delivered anyway as
``unconfirmed``.

Modes: ``batch`` (one thread, ``publish_batch`` of ``--min``..``--max`` payloads; on a
packed topic that writes whole segments in parallel) and ``group`` (``--threads``
threads each calling ``publish()``: on a packed topic, the batcher's group commit).
Payloads are ``{"id": id, "n": i}``; ``publish()`` also passes ``message_id=id``
(publish_batch draws its own message ids: the payload's is the one the handler records).

    python -m benchmarks.chaos.producer --config C.json --ledger DIR --topic T \
        --mode group --threads 8 --budget 2000 --seed 1
"""

from __future__ import annotations

import argparse
import json
import random
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from benchmarks.chaos.ledger import Ledger, LedgerWriter, record_publish
from pawn_queue_sync import PawnQueue

#: The producer's registered name (one id for every producer process of a run).
PRODUCER_NAME = "chaos-producer"


class Budget:
    """How many messages this process may still try to publish (shared by threads);
    none once the file ``stop`` exists."""

    def __init__(self, total: int, stop: Path | None = None) -> None:
        self._left = total
        self._stop = stop
        self._lock = threading.Lock()

    def take(self, n: int) -> int:
        """Up to ``n`` more; 0 once spent or told to stop."""
        if self._stop is not None and self._stop.exists():
            return 0
        with self._lock:
            got = min(n, self._left)
            self._left -= got
            return got


def _batches(pq: PawnQueue, topic: str, out: LedgerWriter, budget: Budget,
             rng: random.Random, low: int, high: int, pause: float) -> None:
    """publish_batch in a loop. The payload ids are ours; the message ids the batch draws
    are mapped back through the payloads (``pub`` records the payload id)."""
    producer = pq.register_producer(PRODUCER_NAME)
    while True:
        time.sleep(pause)
        n = budget.take(rng.randint(low, high))
        if not n:
            return
        ids = [str(uuid.uuid4()) for _ in range(n)]
        out.write("pubtry", ids=ids)
        try:
            mids = producer.publish_batch(topic, [{"id": i, "n": k} for k, i in enumerate(ids)])
        except Exception as exc:  # recorded: the ledger is the report
            record_publish(out, ids, exc)
            continue
        if len(mids) != len(ids):  # never: publish_batch returns one id per payload
            raise RuntimeError(f"publish_batch returned {len(mids)} ids for {len(ids)}")
        record_publish(out, ids)


def _singles(pq: PawnQueue, topic: str, out: LedgerWriter, budget: Budget,
             pause: float) -> None:
    """publish() in a loop (on a packed topic: the group commit of the topic's batcher)."""
    producer = pq.register_producer(PRODUCER_NAME)
    while budget.take(1):
        time.sleep(pause)
        mid = str(uuid.uuid4())
        out.write("pubtry", ids=[mid])
        try:
            producer.publish(topic, {"id": mid}, message_id=mid)
        except Exception as exc:  # recorded: the ledger is the report
            record_publish(out, [mid], exc)
            continue
        record_publish(out, [mid])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True, help="a JSON file: the queue's config")
    parser.add_argument("--ledger", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--mode", choices=("batch", "group"), default="batch")
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--min", type=int, default=50)
    parser.add_argument("--max", type=int, default=200)
    parser.add_argument("--budget", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--stop-file", default=None, help="stop once this file exists")
    parser.add_argument("--pause", type=float, default=0.0,
                        help="seconds each thread waits before each call (pacing)")
    parser.add_argument("--with-batch", action="store_true",
                        help="group mode: one more thread runs publish_batch")
    args = parser.parse_args(argv)
    config: dict[str, Any] = json.loads(Path(args.config).read_text())
    out = Ledger(Path(args.ledger)).writer("producer")
    budget = Budget(args.budget, Path(args.stop_file) if args.stop_file else None)
    with PawnQueue.from_config(config) as pq:
        out.write("ready")
        if args.mode == "batch":
            _batches(pq, args.topic, out, budget, random.Random(args.seed), args.min,
                     args.max, args.pause)
            return 0
        threads = [
            threading.Thread(target=_singles, args=(pq, args.topic, out, budget, args.pause),
                             name=f"chaos-producer-{n}")
            for n in range(args.threads)
        ]
        if args.with_batch:
            threads.append(threading.Thread(
                target=_batches, name="chaos-producer-batch",
                args=(pq, args.topic, out, budget, random.Random(args.seed), args.min,
                      args.max, args.pause)))
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
