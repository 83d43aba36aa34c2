"""``pawnq topics`` and ``pawnq info``: what the store holds, and how it is configured."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from ..errors import TopicNotEmptyError
from ..queue.core import PawnQueue
from .exits import EXIT_OK, EXIT_USAGE
from .shared import CliError, emit, open_queue


def cmd_topics(args: argparse.Namespace) -> int:
    if args.packed and not args.create:
        print("pawnq topics: --packed goes with --create NAME", file=sys.stderr)
        return EXIT_USAGE
    if args.force and not args.delete:
        print("pawnq topics: --force goes with --delete NAME", file=sys.stderr)
        return EXIT_USAGE
    if args.delete and args.create:
        print("pawnq topics: --create and --delete do not go together", file=sys.stderr)
        return EXIT_USAGE
    kind = " (packed)" if args.packed else ""
    with open_queue(args) as pq:
        if args.delete:
            for t in args.delete:  # TopicNotEmptyError stops at the first refused
                n = _delete(pq, t, args.force)
                emit(_json({"topic": t, "deleted": n}) if args.json
                     else f"{t}: deleted ({n} objects)")
            return EXIT_OK
        if args.create:
            for t in args.create:
                switching = args.packed and pq.topic_exists(t) and not pq.context.topic_packed(t)
                created = pq.create_topic(t, packed=args.packed)
                if args.json:
                    emit(_json({"topic": t, "created": created, "switched": switching}))
                elif switching:  # a plain topic made packed: say so, not "exists"
                    emit(f"{t}: exists, switched to packed")
                else:
                    emit(f"{t}: {'created' if created else 'exists'}{kind}")
            return EXIT_OK
        for t in pq.list_topics():
            counts = pq.topic_stats(t) if args.stats else {}
            if args.json:
                emit(_json({"topic": t, **counts}))
            elif args.stats:
                emit(f"{t}\t" + "\t".join(f"{k}={v}" for k, v in counts.items()))
            else:
                emit(t)
    return EXIT_OK


def _delete(pq: PawnQueue, topic: str, force: bool) -> int:
    """``pq.delete_topic``; a refusal names the CLI's ``--force``, not the library's
    ``force=True``."""
    try:
        return pq.delete_topic(topic, force=force)
    except TopicNotEmptyError as exc:
        raise CliError(f"TopicNotEmptyError: topic {topic!r} is not empty ({exc.what}); "
                       f"pawnq topics --delete {topic} --force deletes it with "
                       "everything in it") from exc


def _json(doc: dict[str, Any]) -> str:
    """One line of ``--json`` output."""
    return json.dumps(doc, ensure_ascii=False)


def cmd_info(args: argparse.Namespace) -> int:
    """Show the effective configuration (secrets masked) and what the server honours."""
    pq = open_queue(args)
    emit(json.dumps(pq.config.redacted_dict(), indent=2, sort_keys=True))
    with pq:
        caps = pq.context.caps
        emit(f"store: {pq.store.describe()}",
             f"if_none_match: {caps.if_none_match}  if_match: {caps.if_match}",
             f"strategy: {caps.strategy}")
    return EXIT_OK


def add_topics_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    """Add ``topics`` to ``pawnq``'s subcommands."""
    topics = sub.add_parser("topics", parents=[common], help="list topics (or create them)")
    topics.add_argument("--create", nargs="+", metavar="TOPIC",
                        help="create these topics (those that exist are left as they are, "
                             "except that --packed switches a plain one to packed)")
    topics.add_argument("--packed", action="store_true",
                        help="with --create: packed topics (many messages per object; "
                             "pawn-queue 0.1.x consumers do not see them)")
    topics.add_argument("--delete", nargs="+", metavar="TOPIC",
                        help="delete these topics; refused while one holds messages, "
                             "dead letters or live leases, unless --force")
    topics.add_argument("--force", action="store_true",
                        help="with --delete: delete everything in the topics too")
    topics.add_argument("--stats", action="store_true",
                        help="with pending/leased/dead counts (packed topics: and segments)")
    topics.add_argument("--json", action="store_true",
                        help="one JSON object a line ({\"topic\": ...} and the counts, or "
                             "what --create/--delete did)")
    topics.set_defaults(func=cmd_topics)


def add_info_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    """Add ``info`` to ``pawnq``'s subcommands."""
    info = sub.add_parser("info", parents=[common],
                          help="effective configuration and server capabilities")
    info.set_defaults(func=cmd_info)
