"""``pawnq``: everyday operations from the shell.

Every command reads the configuration the library reads (``--config`` YAML, then
``PAWNQUEUE_*`` variables); with neither, it works on the embedded local store in
``./.pawnqueue``.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import threading
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

from .config import load_config
from .errors import PawnQueueError
from .queue.core import PawnQueue

log = logging.getLogger("pawnq")

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2


def _queue(args: argparse.Namespace, overrides: dict[str, Any] | None = None) -> PawnQueue:
    config = load_config(args.config) if args.config else load_config(overrides or None)
    if args.config and overrides:
        merged = config.to_dict()
        for section, values in overrides.items():
            merged.setdefault(section, {}).update(values)
        config = load_config(merged)
    return PawnQueue(config)


# -- commands ---------------------------------------------------------------------------


def cmd_demo(args: argparse.Namespace) -> int:
    """Publish and consume ``--messages`` messages through the public API, with a
    thread pool of consumers, and print what happened."""
    overrides: dict[str, Any] = {"polling": {"interval_seconds": 0.2}}
    if not args.config:
        overrides["local"] = {"path": args.path}
    topic = args.topic
    n = args.messages
    out = sys.stdout
    with _queue(args, overrides) as pq:
        print(f"pawnq demo on {pq.store.describe()} (strategy: {pq.strategy})", file=out)
        pq.create_topic(topic)
        producer = pq.register_producer("pawnq-demo-producer")
        started = time.monotonic()
        sent: list[str] = []
        for i in range(0, n, 50):
            chunk = [{"n": k, "text": f"hello #{k}"} for k in range(i, min(n, i + 50))]
            sent.extend(producer.publish_batch(topic, chunk))
            _progress("published", len(sent), n)
        published_s = time.monotonic() - started
        print(file=out)

        consumer = pq.register_consumer("pawnq-demo-consumer", topics=[topic])
        seen: Counter[str] = Counter()
        lock = threading.Lock()
        done = threading.Event()
        wanted = set(sent)

        def handle(msg: Any) -> None:
            with lock:
                seen[msg.id] += 1
                _progress("consumed ", len(seen), n)
                if wanted <= seen.keys():
                    done.set()

        consume_started = time.monotonic()
        runner = threading.Thread(
            target=consumer.listen, kwargs={"handler": handle, "max_workers": args.threads,
                                            "stop_event": done}, daemon=True
        )
        runner.start()
        finished = done.wait(timeout=args.timeout)
        done.set()
        runner.join()
        consumed_s = time.monotonic() - consume_started
        print(file=out)
        duplicates = sum(c - 1 for c in seen.values() if c > 1)
        missing = len(wanted - seen.keys())
        print(
            f"published {len(sent)} in {published_s:.2f}s, consumed {len(seen)} in "
            f"{consumed_s:.2f}s, duplicates {duplicates}, missing {missing}, "
            f"elapsed {time.monotonic() - started:.2f}s",
            file=out,
        )
        stats = pq.topic_stats(topic)
        print(f"topic {topic!r} now: {stats}", file=out)
    return EXIT_OK if finished and not missing and not duplicates else EXIT_ERROR


def cmd_topics(args: argparse.Namespace) -> int:
    with _queue(args) as pq:
        if args.create:
            for t in args.create:
                created = pq.create_topic(t)
                print(f"{t}: {'created' if created else 'exists'}")
            return EXIT_OK
        for t in pq.list_topics():
            if args.stats:
                print(f"{t}\t" + "\t".join(f"{k}={v}" for k, v in pq.topic_stats(t).items()))
            else:
                print(t)
    return EXIT_OK


def cmd_publish(args: argparse.Namespace) -> int:
    """Publish JSON payloads given as arguments, or one per line on stdin."""
    lines = args.payload or [line for line in sys.stdin.read().splitlines() if line.strip()]
    payloads = []
    for i, text in enumerate(lines):
        try:
            payloads.append(json.loads(text))
        except json.JSONDecodeError as exc:
            print(f"payload #{i} is not JSON: {exc}", file=sys.stderr)
            return EXIT_USAGE
    with _queue(args) as pq:
        if args.create:
            pq.create_topic(args.topic)
        ids = pq.register_producer(args.producer).publish_batch(args.topic, payloads)
    for mid in ids:
        print(mid)
    return EXIT_OK


def cmd_consume(args: argparse.Namespace) -> int:
    """Poll once (or until --max), print messages as JSON lines; ack unless --no-ack."""
    with _queue(args) as pq:
        consumer = pq.register_consumer(args.consumer, topics=args.topic)
        held: list[Any] = []  # with --no-ack, kept leased until the end so a peek sees each once
        count = 0
        try:
            while count < args.max:
                msgs = consumer.poll(max_messages=min(args.max - count, 100))
                if not msgs:
                    break
                for msg in msgs:
                    print(json.dumps(msg.to_dict(), ensure_ascii=False))
                if args.no_ack:
                    held.extend(msgs)
                else:
                    consumer.ack_many(msgs)
                count += len(msgs)
        finally:
            for msg in held:
                msg.release()
    return EXIT_OK


def cmd_dead_letter(args: argparse.Namespace) -> int:
    """List the dead-letter objects of a topic (id and reason), or print one whole."""
    from .queue import layout

    with _queue(args) as pq:
        pq.context.require_topic(args.topic)
        listing = pq.store.list(layout.dead_letter_prefix(args.topic), limit=args.max)
        for info in listing.objects:
            body = pq.store.get(info.key).body
            try:
                doc = json.loads(body)
                reason = (doc.get("dead_letter") or {}).get("reason", "")
                print(json.dumps({"key": info.key, "id": doc.get("id"), "reason": reason,
                                  "payload": doc.get("payload")}, ensure_ascii=False))
            except (json.JSONDecodeError, AttributeError):
                print(json.dumps({"key": info.key, "raw": body[:200].decode("latin-1")}))
    return EXIT_OK


def cmd_info(args: argparse.Namespace) -> int:
    """Show the effective configuration (secrets masked) and what the server honours."""
    pq = _queue(args)
    print(json.dumps(pq.config.redacted_dict(), indent=2, sort_keys=True))
    with pq:
        caps = pq.context.caps
        print(f"store: {pq.store.describe()}")
        print(f"if_none_match: {caps.if_none_match}  if_match: {caps.if_match}")
        print(f"strategy: {caps.strategy}")
    return EXIT_OK


# -- wiring -------------------------------------------------------------------------------


def _progress(label: str, done: int, total: int) -> None:
    """A progress bar on a terminal; silence when output goes to a file or a pipe."""
    if not sys.stdout.isatty():
        return
    width = 30
    filled = int(width * done / max(total, 1))
    sys.stdout.write(f"\r{label} [{'#' * filled}{'.' * (width - filled)}] {done}/{total}")
    sys.stdout.flush()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pawnq",
        description="pawn-queue-sync: a message queue on any S3-compatible object store.",
    )
    parser.add_argument("--config", "-c", help="YAML configuration file (env PAWNQUEUE_* too)")
    parser.add_argument("--verbose", "-v", action="count", default=0)
    sub = parser.add_subparsers(dest="command", required=True)

    demo = sub.add_parser("demo", help="publish and consume a few hundred messages")
    demo.add_argument("--messages", "-n", type=int, default=300)
    demo.add_argument("--threads", type=int, default=8)
    demo.add_argument("--topic", default="demo")
    demo.add_argument("--path", default="./.pawnqueue", help="local store directory")
    demo.add_argument("--timeout", type=float, default=300.0)
    demo.set_defaults(func=cmd_demo)

    topics = sub.add_parser("topics", help="list topics (or create them)")
    topics.add_argument("--create", nargs="+", metavar="TOPIC")
    topics.add_argument("--stats", action="store_true", help="with pending/leased/dead counts")
    topics.set_defaults(func=cmd_topics)

    pub = sub.add_parser("publish", help="publish JSON payloads (args or stdin lines)")
    pub.add_argument("topic")
    pub.add_argument("payload", nargs="*")
    pub.add_argument("--producer", default="pawnq-cli")
    pub.add_argument("--create", action="store_true", help="create the topic if missing")
    pub.set_defaults(func=cmd_publish)

    con = sub.add_parser("consume", help="print messages as JSON lines and ack them")
    con.add_argument("topic", nargs="+")
    con.add_argument("--consumer", default="pawnq-cli")
    con.add_argument("--max", type=int, default=10)
    con.add_argument("--no-ack", action="store_true", help="release instead of ack (peek)")
    con.set_defaults(func=cmd_consume)

    dl = sub.add_parser("dead-letter", help="list a topic's dead letters with reasons")
    dl.add_argument("topic")
    dl.add_argument("--max", type=int, default=100)
    dl.set_defaults(func=cmd_dead_letter)

    info = sub.add_parser("info", help="effective configuration and server capabilities")
    info.set_defaults(func=cmd_info)

    try:
        from .runtime.cli_worker import add_worker_parser
    except ImportError:  # pragma: no cover - the runtime is part of the package
        pass
    else:
        add_worker_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    level = logging.WARNING - 10 * min(args.verbose, 2)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return int(args.func(args))
    except PawnQueueError as exc:
        print(f"pawnq: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
