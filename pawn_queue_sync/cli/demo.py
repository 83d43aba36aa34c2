"""``pawnq demo``: publish and consume messages through the public API, and say how it went."""

from __future__ import annotations

import argparse
import threading
import time
from collections import Counter
from typing import Any

from .exits import EXIT_ERROR, EXIT_OK
from .shared import count, emit, end_progress, open_queue, positive_seconds, progress


def cmd_demo(args: argparse.Namespace) -> int:
    """Publish and consume ``--messages`` messages through the public API, with a
    thread pool of consumers, and print what happened. With 0 messages there is
    nothing to wait for: it reports at once."""
    overrides: dict[str, Any] = {"polling": {"interval_seconds": 0.2}}
    if not args.config and args.path is not None:
        overrides["local"] = {"path": args.path}
    topic = args.topic
    n = args.messages
    with open_queue(args, overrides) as pq:
        emit(f"pawnq demo on {pq.store.describe()} (strategy: {pq.strategy})")
        pq.create_topic(topic)
        producer = pq.register_producer("pawnq-demo-producer")
        started = time.monotonic()
        sent: list[str] = []
        for i in range(0, n, 50):
            chunk = [{"n": k, "text": f"hello #{k}"} for k in range(i, min(n, i + 50))]
            sent.extend(producer.publish_batch(topic, chunk))
            progress("published", len(sent), n)
        published_s = time.monotonic() - started
        end_progress()

        consumer = pq.register_consumer("pawnq-demo-consumer", topics=[topic])
        seen: Counter[str] = Counter()
        lock = threading.Lock()
        done = threading.Event()
        wanted = set(sent)

        def handle(msg: Any) -> None:
            with lock:
                seen[msg.id] += 1
                progress("consumed ", len(seen), n)
                if wanted <= seen.keys():
                    done.set()

        consume_started = time.monotonic()
        finished = True
        if wanted:  # else nothing will ever set `done`: don't wait for --timeout
            runner = threading.Thread(
                target=consumer.listen, kwargs={"handler": handle, "max_workers": args.threads,
                                                "stop_event": done}, daemon=True
            )
            runner.start()
            finished = done.wait(timeout=args.timeout)
            done.set()
            runner.join()
        consumed_s = time.monotonic() - consume_started
        duplicates = sum(c - 1 for c in seen.values() if c > 1)
        missing = len(wanted - seen.keys())
        stats = pq.topic_stats(topic)
        end_progress()
        emit(
            f"published {len(sent)} in {published_s:.2f}s, consumed {len(seen)} in "
            f"{consumed_s:.2f}s, duplicates {duplicates}, missing {missing}, "
            f"elapsed {time.monotonic() - started:.2f}s",
            f"topic {topic!r} now: {stats}",
        )
    return EXIT_OK if finished and not missing and not duplicates else EXIT_ERROR


def add_parsers(sub: Any, common: argparse.ArgumentParser) -> None:
    """Add ``demo`` to ``pawnq``'s subcommands."""
    demo = sub.add_parser("demo", parents=[common],
                          help="publish and consume a few hundred messages")
    demo.add_argument("--messages", "-n", type=count(0), default=300)
    demo.add_argument("--threads", type=count(1), default=8)
    demo.add_argument("--topic", default="demo")
    demo.add_argument("--path", default=None,
                      help="local store directory (default: PAWNQUEUE_LOCAL_PATH, else "
                      "./.pawnqueue)")
    demo.add_argument("--timeout", type=positive_seconds, default=300.0,
                      help="seconds to wait for every message to be consumed "
                      "(default: 300)")
    demo.set_defaults(func=cmd_demo)
