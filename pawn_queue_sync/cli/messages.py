"""``pawnq publish`` and ``consume``: messages in and out from the shell.

``consume`` acks a batch only once its lines were written, flushed and (into a regular
file) synced, and gives the batch back when they could not be.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
from collections.abc import Sequence
from typing import Any

from ..errors import PawnQueueError, PayloadError, PublishError
from ..queue.dedup import check_dedup_id
from ..queue.message import Message
from ..queue.producer import Producer
from .exits import EXIT_ERROR, EXIT_OK, EXIT_USAGE
from .shared import CliError, OutputError, count, emit, open_queue

log = logging.getLogger("pawnq")


def cmd_publish(args: argparse.Namespace) -> int:
    """Publish JSON payloads given as arguments, or one per line on stdin; print the
    ids published, one a line. If some writes fail, the ids that were published are
    still printed (re-sending only the others avoids duplicates), stderr says which
    payloads were not, and the exit status is ``EXIT_ERROR``."""
    if args.payload:
        lines = args.payload
    else:
        try:
            lines = [line for line in sys.stdin.read().splitlines() if line.strip()]
        except (OSError, UnicodeDecodeError, AttributeError) as exc:  # AttributeError: no stdin
            raise CliError(f"cannot read payloads from stdin: {exc}") from exc
    payloads = []
    for i, text in enumerate(lines):
        try:
            payloads.append(json.loads(text))
        except (json.JSONDecodeError, RecursionError) as exc:
            print(f"pawnq: payload #{i} is not JSON: {exc}", file=sys.stderr)
            return EXIT_USAGE
    if args.dedup_id is not None:
        problem = _dedup_problem(args.dedup_id, len(payloads))
        if problem:
            print(f"pawnq: {problem}", file=sys.stderr)
            return EXIT_USAGE
    with open_queue(args) as pq:
        if args.create:
            pq.create_topic(args.topic)
        if args.dedup_id is not None:
            emit(pq.register_producer(args.producer).publish(
                args.topic, payloads[0], dedup_id=args.dedup_id,
                delay_seconds=getattr(args, "delay", None)))
            return EXIT_OK
        try:
            producer = pq.register_producer(args.producer)
            if args.delay:
                ids = _publish_delayed(producer, args.topic, payloads, args.delay)
            else:
                ids = producer.publish_batch(args.topic, payloads)
        except PublishError as exc:
            published: list[str] = getattr(exc, "published_ids", [])
            failed: list[int] = getattr(exc, "failed_indices", [])
            if not published:
                raise
            try:
                emit(*published)
            finally:
                print(f"pawnq: PublishError: {exc}; not published: payload "
                      f"{_numbers(failed)} (0-based, input order); the {len(published)} "
                      "printed ids were published", file=sys.stderr)
            return EXIT_ERROR
    emit(*ids)
    return EXIT_OK


def _publish_delayed(producer: Producer, topic: str, payloads: Sequence[Any],
                     delay: float) -> list[str]:
    """``--delay``: each payload published delayed, one at a time (one PUT each), in
    order; a failure stops there: raised as it is when nothing was published yet, else
    as a PublishError listing what was and was not published (as publish_batch's)."""
    ids: list[str] = []
    for index, payload in enumerate(payloads):
        try:
            ids.append(producer.publish(topic, payload, delay_seconds=delay))
        except PawnQueueError as exc:
            if not ids:
                raise
            err = PublishError(f"{len(payloads) - index} of {len(payloads)} messages to "
                               f"{topic!r} were not published (first error: {exc})")
            err.failed_indices = list(range(index, len(payloads)))  # type: ignore[attr-defined]
            err.published_ids = ids  # type: ignore[attr-defined]
            raise err from exc
    return ids


def delay_seconds(text: str) -> float:
    """An argparse type: seconds of delay, a finite number >= 0 (the library checks
    the maximum, ``publishing.max_delay_seconds``)."""
    value = float(text)
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text}")
    return value


def _dedup_problem(dedup_id: str, payloads: int) -> str | None:
    """Why ``--dedup-id`` cannot be used as given (a usage error), or None."""
    if payloads != 1:
        return f"--dedup-id names one message: give exactly one payload, not {payloads}"
    try:
        check_dedup_id(dedup_id)
    except PayloadError as exc:
        return f"--dedup-id: {exc}"
    return None


def _numbers(indices: Sequence[int], limit: int = 20) -> str:
    """``#1, #4, #7-9``: runs of consecutive indices, the first ``limit`` runs."""
    runs: list[str] = []
    start = 0
    for pos, i in enumerate(indices):
        if pos == 0 or i != indices[pos - 1] + 1:
            start = i
        if pos + 1 == len(indices) or indices[pos + 1] != i + 1:
            runs.append(f"#{i}" if start == i else f"#{start}-{i}")
    more = f", ... ({len(runs) - limit} more runs)" if len(runs) > limit else ""
    return ", ".join(runs[:limit]) + more


def cmd_consume(args: argparse.Namespace) -> int:
    """Poll once (or until --max), print messages as JSON lines; ack unless --no-ack.

    A batch is acked only after its lines were written, flushed and (into a regular
    file) synced. If they could not be, the batch is released at once, so its
    messages are pending and delivered again right away (some of them may already
    have been printed: at least once). Lines a reader got from a pipe and then threw
    away unread (``| head``) count as delivered: the pipe can't tell.
    """
    with open_queue(args) as pq:
        consumer = pq.register_consumer(args.consumer, topics=args.topic)
        held: list[Message] = []  # --no-ack: kept leased to the end, so a peek sees each once
        got = 0
        try:
            while got < args.max:
                msgs = consumer.poll(max_messages=min(args.max - got, 100))
                if not msgs:
                    break
                try:
                    emit(*(json.dumps(m.to_dict(), ensure_ascii=False) for m in msgs),
                         sync=True)
                except OutputError as exc:
                    _release(msgs)
                    raise OutputError(exc.cause, f"{len(msgs)} message(s) not acked: "
                                      "released, still pending") from exc
                except BaseException:  # a closed pipe, Ctrl-C: give the batch back too
                    _release(msgs)
                    raise
                if args.no_ack:
                    held.extend(msgs)
                else:
                    consumer.ack_many(msgs)
                got += len(msgs)
        except KeyboardInterrupt:
            # Ctrl-C in a poll: claims under way finish on the claim pool (closing the
            # pools waits for them), then every message still held is given back, so
            # nothing waits out a lease nor counts an abandoned delivery.
            pq.context.close()
            _release(consumer.inflight())
            raise
        finally:
            _release(held)
    return EXIT_OK


def _release(msgs: Sequence[Message]) -> None:
    """Give leases back (best effort: one that can't be goes stale and is reaped)."""
    for msg in msgs:
        try:
            msg.release()
        except PawnQueueError as exc:
            log.warning("could not release message %s: %s", msg.id, exc)


def add_parsers(sub: Any, common: argparse.ArgumentParser) -> None:
    """Add ``publish`` and ``consume`` to ``pawnq``'s subcommands."""
    pub = sub.add_parser("publish", parents=[common],
                         help="publish JSON payloads (args or stdin lines)")
    pub.add_argument("topic")
    pub.add_argument("payload", nargs="*")
    pub.add_argument("--producer", default="pawnq-cli")
    pub.add_argument("--create", action="store_true", help="create the topic if missing")
    pub.add_argument("--delay", type=delay_seconds, metavar="S",
                     help="deliver no sooner than S seconds from now, by the server's "
                     "clock (up to publishing.max_delay_seconds, 7 days)")
    pub.add_argument("--dedup-id", metavar="K",
                     help="publish one payload at most once per K within "
                     "publishing.dedup_window_seconds (a repeat prints the first id)")
    pub.set_defaults(func=cmd_publish)

    con = sub.add_parser("consume", parents=[common],
                         help="print messages as JSON lines and ack them")
    con.add_argument("topic", nargs="+")
    con.add_argument("--consumer", default="pawnq-cli")
    con.add_argument("--max", type=count(1), default=10)
    con.add_argument("--no-ack", action="store_true", help="release instead of ack (peek)")
    con.set_defaults(func=cmd_consume)
