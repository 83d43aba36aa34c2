"""``pawnq stats [TOPIC] [--watch [SECONDS]] [--json]``: what topics hold and who consumes
them (:meth:`~pawn_queue_sync.PawnQueue.stats` / ``stats_all``), once or refreshed.

A table of topics and one of consumers for people (the queue's consumers, also when it
has no topic: ``pq.consumers()``); ``--json`` prints one JSON document
a line (a topic's object with TOPIC, else a list of them), one per refresh with
``--watch``. ``--watch`` redraws in place on a terminal (``rich``'s live display) and
appends otherwise; Ctrl-C ends it with ``EXIT_OK``. A refresh that fails after the
first is reported on stderr and tried again at the next interval.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from typing import Any

from ..errors import PawnQueueError
from ..queue.core import PawnQueue
from ..queue.topic_stats import MAX_KEYS, ConsumerStatus, TopicStats
from .exits import EXIT_OK, EXIT_USAGE
from .shared import count, emit, open_queue, positive_seconds
from .tables import render_table

#: ``--watch`` without a number: seconds between refreshes.
WATCH_SECONDS = 5.0
#: The shortest ``--watch`` interval: each refresh is a LIST per prefix of every topic
#: (and a GET per segment lease), so a typo must not make them back to back (the
#: dashboard's floor is 2 s).
MIN_WATCH_SECONDS = 1.0
#: The longest ``--watch`` interval (a day; inf would not sleep).
MAX_WATCH_SECONDS = 86400.0

#: What one read gives: the topics' stats, and the queue's consumers and whether that
#: list is whole when no topic carries them (``pq.consumers()``; None otherwise).
_Found = tuple[list[TopicStats], "tuple[list[ConsumerStatus], bool] | None"]


def cmd_stats(args: argparse.Namespace) -> int:
    try:
        args.topic, args.watch = _watch_seconds(args.topic, args.watch)
    except argparse.ArgumentTypeError as exc:
        print(f"pawnq stats: --watch {exc}", file=sys.stderr)
        return EXIT_USAGE
    with open_queue(args) as pq:
        def read() -> _Found:
            if args.topic:
                return [pq.stats(args.topic, max_keys=args.max_keys)], None
            every = pq.stats_all(max_keys=args.max_keys)
            # no topic carries the registry listing: the queue's consumers on their own
            return every, None if every else pq.consumers(max_keys=args.max_keys)

        if args.watch is None:
            _show(read(), args)
            return EXIT_OK
        with contextlib.suppress(KeyboardInterrupt):  # the way a watch ends
            _watch(pq, read, args)
    return EXIT_OK


def _watch_seconds(topic: str | None, watch: str | None) -> tuple[str | None, float | None]:
    """(topic, seconds) from the words: ``--watch`` takes an optional number, so in
    ``pawnq stats --watch orders`` the word after it is the topic, not seconds."""
    if watch is None:
        return topic, None
    try:
        seconds = positive_seconds(watch)
    except ValueError:
        if topic is None:
            return watch, WATCH_SECONDS
        raise argparse.ArgumentTypeError(f"takes a number of seconds, got {watch!r}") from None
    if seconds < MIN_WATCH_SECONDS:
        raise argparse.ArgumentTypeError(f"must be at least {MIN_WATCH_SECONDS:g} "
                                         f"second(s), got {watch}")
    if seconds > MAX_WATCH_SECONDS:
        raise argparse.ArgumentTypeError(f"must be at most {MAX_WATCH_SECONDS:g}, got {watch}")
    return topic, seconds


def _watch(pq: PawnQueue, read: Callable[[], _Found], args: argparse.Namespace
           ) -> None:
    """Refresh every ``args.watch`` seconds until Ctrl-C; the first failure ends it (a
    topic or store that is not there), later ones are reported and retried."""
    found = read()
    live = None
    if not args.json and sys.stdout.isatty():
        from rich.console import Console
        from rich.live import Live
        from rich.text import Text

        live = Live(console=Console(), auto_refresh=False)
        live.start()

        def draw(lines: list[str]) -> None:
            live.update(Text("\n".join(lines), no_wrap=True, overflow="crop"),
                        refresh=True)
    else:
        def draw(lines: list[str]) -> None:
            emit(*lines, "")
    try:
        while True:
            if args.json:
                _show(found, args)
            else:
                head = (f"every {args.watch:g}s, Ctrl-C to stop; "
                        f"{_when(found[0][0].server_time if found[0] else None)}")
                draw([head, *_lines(found, args)])
            time.sleep(args.watch)
            try:
                found = read()
            except PawnQueueError as exc:
                print(f"pawnq stats: refresh failed: {type(exc).__name__}: {exc}; trying "
                      f"again in {args.watch:g}s", file=sys.stderr, flush=True)
    finally:
        if live is not None:
            live.stop()


def _show(read: _Found, args: argparse.Namespace) -> None:
    found = read[0]
    if args.json:
        doc: Any = found[0].to_dict() if args.topic else [s.to_dict() for s in found]
        emit(json.dumps(doc, ensure_ascii=False))
    else:
        emit(*_lines(read, args))


def _lines(read: _Found, args: argparse.Namespace) -> list[str]:
    """The tables: topics, then consumers, then what it cost (the topics' requests)."""
    found, queue_consumers = read
    rows = [[s.topic, "packed" if s.packed else "plain", str(s.pending), str(s.in_flight),
             str(s.delayed), str(s.dead_lettered), _age(s.oldest_pending_age_seconds),
             "all" if s.exact else f"first {args.max_keys} keys"] for s in found]
    lines = render_table(["topic", "kind", "pending", "in flight", "delayed", "dead",
                          "oldest pending", "counted"], rows,
                         title=None if rows else "no topics")
    consumers: Sequence[ConsumerStatus] = found[0].consumers if found else ()
    exact = found[0].consumers_exact if found else True
    if queue_consumers is not None:
        consumers, exact = queue_consumers
    if consumers:
        now = found[0].server_time if found else datetime.now(timezone.utc)
        alive = sum(c.alive for c in consumers)
        rows = [[c.name or "(unreadable entry)", c.id, _seen(c.last_seen, now),
                 "yes" if c.alive else "no"] for c in consumers]
        lines.append("")
        cut = "" if exact else f" in the first {args.max_keys} entries"
        lines += render_table(["consumer", "id", "last seen", "alive"], rows,
                              title=f"consumers ({alive} alive of {len(consumers)}{cut})")
    lines.append(f"{sum(s.requests for s in found)} requests")
    return lines


def _seen(last: datetime | None, now: datetime | None) -> str:
    if last is None or now is None:
        return "-"
    return f"{_age((now - last).total_seconds())} ago"


def _age(seconds: float | None) -> str:
    """``12s``, ``4m 05s``, ``3h 02m``, ``2d 04h``; ``-`` for None."""
    if seconds is None:
        return "-"
    s = max(0, int(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m {s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h {s % 3600 // 60:02d}m"
    return f"{s // 86400}d {s % 86400 // 3600:02d}h"


def _when(when: datetime | None) -> str:
    return "server time unknown" if when is None else when.strftime("%Y-%m-%d %H:%M:%S UTC")


def add_parsers(sub: Any, common: argparse.ArgumentParser) -> None:
    """Add ``stats`` to ``pawnq``'s subcommands."""
    stats = sub.add_parser(
        "stats", parents=[common],
        help="pending, in flight, delayed and dead-lettered counts, and consumers",
        description="What each topic (or TOPIC) holds, counted from listings (no "
                    "message is read), and the registered consumers, alive or not.")
    stats.add_argument("topic", nargs="?", help="one topic (default: every topic)")
    stats.add_argument("--watch", "-w", nargs="?", const=str(WATCH_SECONDS), default=None,
                       metavar="SECONDS",
                       help=f"refresh every SECONDS (default {WATCH_SECONDS:g}, at least "
                            f"{MIN_WATCH_SECONDS:g}) until Ctrl-C")
    stats.add_argument("--json", action="store_true",
                       help="one JSON document a line (with --watch: one per refresh)")
    stats.add_argument("--max-keys", type=count(1), default=MAX_KEYS, metavar="N",
                       help=f"count at most N keys per prefix (default {MAX_KEYS}); "
                            "deeper topics are counted approximately")
    stats.set_defaults(func=cmd_stats)
