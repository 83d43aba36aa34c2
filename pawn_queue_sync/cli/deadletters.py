"""``pawnq dead-letter list|redrive|purge TOPIC`` and ``pawnq peek TOPIC``: looking at a
topic without consuming it, and putting its dead letters back or away.

``pawnq dead-letter TOPIC`` (no action) lists, as before. ``purge`` asks first unless
``--yes``, and refuses (``EXIT_USAGE``) when stdin is not a terminal to ask on.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from .. import layout
from ..errors import InvalidArgument
from ..queue.deadletters import MIN_RATE, DeadLetter, check_rate, iter_keys
from .exits import EXIT_ERROR, EXIT_OK, EXIT_USAGE
from .shared import count, emit, open_queue
from .tables import json_lines, progress_bar, table

ACTIONS = ("list", "redrive", "purge")


def _action(args: argparse.Namespace) -> tuple[str, str] | None:
    """(action, topic) from ``[ACTION] TOPIC``; None when the words do not fit."""
    words = args.words
    if len(words) == 1:
        return "list", words[0]
    if len(words) == 2 and words[0] in ACTIONS:
        return words[0], words[1]
    return None


def cmd_dead_letter(args: argparse.Namespace) -> int:
    parsed = _action(args)
    if parsed is None:
        print(f"pawnq dead-letter: expected [{'|'.join(ACTIONS)}] TOPIC, got "
              f"{' '.join(args.words)!r}", file=sys.stderr)
        return EXIT_USAGE
    action, topic = parsed
    if action == "purge" and not args.yes and not sys.stdin.isatty():
        print("pawnq dead-letter purge: stdin is not a terminal to confirm on: "
              "add --yes to delete without asking", file=sys.stderr)
        return EXIT_USAGE
    if action != "redrive" and args.rate is not None:
        print("pawnq dead-letter: --rate goes with redrive", file=sys.stderr)
        return EXIT_USAGE
    with open_queue(args) as pq:
        if action == "list":
            letters = list(pq.dead_letters(topic, limit=args.max or 100))
            _show_letters(letters, args.json, f"dead letters of {topic}")
            return EXIT_OK
        pq.context.require_topic(topic)  # one LIST per 1,000 to count them first
        total = sum(1 for _ in iter_keys(pq.context, layout.dead_letter_prefix(topic)))
        if action == "purge":
            if not args.yes and not _confirm(f"delete the {total} dead letter(s) of {topic}?"):
                print("pawnq: nothing deleted", file=sys.stderr)
                return EXIT_ERROR
            with progress_bar("purge", total) as update:
                deleted = pq.purge(topic, "dead-letter", progress=update)
            emit(json.dumps({"deleted": deleted}) if args.json
                 else f"{topic}: {deleted} dead letter(s) deleted")
            return EXIT_OK
        if args.max is not None:
            total = min(total, args.max)
        with progress_bar("redrive", total) as update:
            result = pq.redrive(topic, max=args.max, rate=args.rate, progress=update)
    if args.json:
        emit(json.dumps(result.to_dict()))
    else:
        emit(f"{topic}: {len(result.moved)} moved back, {len(result.skipped)} skipped, "
             f"{len(result.failed)} failed")
        rows = [[k, "skipped", why] for k, why in result.skipped.items()]
        rows += [[k, "failed", why] for k, why in result.failed.items()]
        if rows:
            table(["dead letter", "", "why"], rows)
    return EXIT_ERROR if result.failed else EXIT_OK


def _confirm(question: str) -> bool:
    """Ask on the terminal (stderr); only y/yes confirms."""
    print(f"{question} [y/N] ", end="", file=sys.stderr, flush=True)
    try:
        answer = sys.stdin.readline()
    except (OSError, ValueError):
        return False
    return answer.strip().lower() in ("y", "yes")


def _show_letters(letters: list[DeadLetter], as_json: bool, title: str) -> None:
    if as_json:
        json_lines([d.to_dict() for d in letters])
        return
    table(["id", "dead-lettered at", "deliveries", "reason", "payload"],
          [[d.id or "-", d.dead_lettered_at or "-", _count(d.delivery_count), d.reason,
            d.payload] for d in letters],
          title=f"{title} ({len(letters)})")


def _count(value: int | None) -> str:
    return "-" if value is None else str(value)


def cmd_peek(args: argparse.Namespace) -> int:
    """Show the oldest pending messages (or dead letters) without leasing them."""
    with open_queue(args) as pq:
        found: list[Any] = pq.peek(args.topic, n=args.n, dead_letter=args.dead_letter)
    if args.dead_letter:
        _show_letters(found, args.json, f"dead letters of {args.topic}")
        return EXIT_OK
    if args.json:
        json_lines([m.to_dict() for m in found])
        return EXIT_OK
    table(["id", "created at", "attempts", "leased", "payload"],
          [[m.id or "-", m.created_at or "-", str(m.attempts), "yes" if m.leased else "",
            m.payload if m.error is None else f"({m.error})"] for m in found],
          title=f"{args.topic}: {len(found)} oldest pending" if found
          else f"{args.topic}: nothing pending")
    return EXIT_OK


def _rate(text: str) -> float:
    """An argparse type: a redrive rate the library accepts (a usage error otherwise)."""
    try:
        value = float(text)
        check_rate(value)
    except (ValueError, InvalidArgument) as exc:
        raise argparse.ArgumentTypeError(
            f"must be a finite number >= {MIN_RATE}, got {text}") from exc
    return value


def add_parsers(sub: Any, common: argparse.ArgumentParser) -> None:
    """Add ``dead-letter`` and ``peek`` to ``pawnq``'s subcommands."""
    dl = sub.add_parser(
        "dead-letter", parents=[common],
        # stated: argparse would print nargs="+" as "WORDS [WORDS ...]"
        usage="pawnq dead-letter [list|redrive|purge] TOPIC [--max N] [--rate R] [--yes] "
              "[--json] [--config CONFIG] [--verbose]",
        help="a topic's dead letters: list (the default), redrive, purge",
        description="list: dead letters with their reasons; redrive: move them back to "
                    "the topic (written before deleted: a crash repeats one, never loses "
                    "one); purge: delete them (asks first unless --yes).")
    dl.add_argument("words", nargs="+", metavar="[list|redrive|purge] TOPIC",
                    help="the action (list when left out) and the topic")
    dl.add_argument("--max", type=count(1), default=None, metavar="N",
                    help="list: at most N (default 100); redrive: move at most N")
    dl.add_argument("--rate", type=_rate, default=None, metavar="R",
                    help=f"redrive: at most R moves a second (R >= {MIN_RATE})")
    dl.add_argument("--yes", "-y", action="store_true", help="purge: do not ask")
    dl.add_argument("--json", action="store_true", help="machine-readable output")
    dl.set_defaults(func=cmd_dead_letter)

    peek = sub.add_parser("peek", parents=[common],
                          help="the oldest pending messages, read without leasing them")
    peek.add_argument("topic")
    peek.add_argument("-n", type=count(1), default=10, help="how many (default 10)")
    peek.add_argument("--dead-letter", action="store_true", help="dead letters instead")
    peek.add_argument("--json", action="store_true", help="one JSON object a line")
    peek.set_defaults(func=cmd_peek)
