"""``pawnq``: everyday operations from the shell.

Every command reads the configuration the library reads (``--config`` YAML, then
``PAWNQUEUE_*`` variables); with neither, it works on the embedded local store in
``./.pawnqueue``.

Output is written, flushed (and for a regular file, synced) before anything depends
on it: ``consume`` acks a batch only once its lines are out, and gives the batch back
when they could not be written. Errors print as one line on stderr (with the
traceback under ``--verbose``); the exit statuses are the ``EXIT_*`` constants below,
documented in README.md ("The CLI").
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import stat
import sys
import threading
import time
import traceback
from collections import Counter
from collections.abc import Sequence
from typing import Any

from .config import load_config
from .errors import PawnQueueError, PublishError
from .queue.core import PawnQueue
from .queue.message import Message

log = logging.getLogger("pawnq")

#: The command did what was asked.
EXIT_OK = 0
#: It failed: a library error (store, topic, lease...), output that could not be
#: written, a partly failed publish, an incomplete demo; ``worker``: stopped hard.
EXIT_ERROR = 1
#: Bad arguments (argparse's status) or a payload that is not JSON.
EXIT_USAGE = 2
#: ``worker``: the store could not be reached at startup (``RET_CONNECT``).
EXIT_STORE_UNREACHABLE = 3
#: ``worker``: invalid configuration or a missing topic (``RET_CONFIG``).
EXIT_CONFIG = 4
#: ``worker``: the handler could not be imported (``RET_IMPORT``).
EXIT_HANDLER_IMPORT = 5
#: ``worker``: workers kept failing to start (each died before its first poll), so the
#: pool gave up (``RET_START_FAILED``).
EXIT_WORKERS_FAILED_TO_START = 6
#: Interrupted by Ctrl-C (128 + SIGINT, as a shell reports it).
EXIT_INTERRUPTED = 128 + signal.SIGINT
#: Standard output was closed by its reader (``pawnq ... | head``): 128 + SIGPIPE, the
#: status a shell shows for a tool that SIGPIPE stopped; nothing is printed.
EXIT_BROKEN_PIPE = 128 + signal.SIGPIPE


class CliError(Exception):
    """A command failed outside the library (its input or output): one line on
    stderr, exit ``EXIT_ERROR``."""


class OutputError(CliError):
    """Standard output could not be written (disk full, I/O error, ...)."""

    def __init__(self, cause: OSError, consequence: str = "") -> None:
        self.cause = cause
        text = f"cannot write output: {cause}"
        super().__init__(f"{text}; {consequence}" if consequence else text)


def _emit(*lines: str, sync: bool = False) -> None:
    """Write ``lines`` to stdout and flush them, so a failure surfaces here and not
    at exit, after we acted on the output as written. ``sync`` also fsyncs a regular
    file (what ``consume`` does before acking). BrokenPipeError goes through as is;
    any other OSError becomes :class:`OutputError`."""
    out = sys.stdout
    try:
        for line in lines:
            out.write(line + "\n")
        out.flush()
        if sync:
            _sync(out)
    except BrokenPipeError:
        raise
    except OSError as exc:
        raise OutputError(exc) from exc


def _sync(stream: Any) -> None:
    """fsync ``stream`` when it is a regular file (pipes and terminals can't be)."""
    try:
        fd = stream.fileno()
    except (AttributeError, OSError, ValueError):  # a replaced stdout (tests, embedders)
        return
    if stat.S_ISREG(os.fstat(fd).st_mode):
        os.fsync(fd)


def _discard_stdout() -> None:
    """Point stdout at /dev/null, so what is left in its buffer can't fail again when
    the interpreter flushes it at exit (Python's advice for SIGPIPE)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (AttributeError, OSError, ValueError):  # no real stdout: nothing to flush
        pass


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
    thread pool of consumers, and print what happened. With 0 messages there is
    nothing to wait for: it reports at once."""
    overrides: dict[str, Any] = {"polling": {"interval_seconds": 0.2}}
    if not args.config and args.path is not None:
        overrides["local"] = {"path": args.path}
    topic = args.topic
    n = args.messages
    with _queue(args, overrides) as pq:
        _emit(f"pawnq demo on {pq.store.describe()} (strategy: {pq.strategy})")
        pq.create_topic(topic)
        producer = pq.register_producer("pawnq-demo-producer")
        started = time.monotonic()
        sent: list[str] = []
        for i in range(0, n, 50):
            chunk = [{"n": k, "text": f"hello #{k}"} for k in range(i, min(n, i + 50))]
            sent.extend(producer.publish_batch(topic, chunk))
            _progress("published", len(sent), n)
        published_s = time.monotonic() - started
        _end_progress()

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
        _end_progress()
        _emit(
            f"published {len(sent)} in {published_s:.2f}s, consumed {len(seen)} in "
            f"{consumed_s:.2f}s, duplicates {duplicates}, missing {missing}, "
            f"elapsed {time.monotonic() - started:.2f}s",
            f"topic {topic!r} now: {stats}",
        )
    return EXIT_OK if finished and not missing and not duplicates else EXIT_ERROR


def cmd_topics(args: argparse.Namespace) -> int:
    with _queue(args) as pq:
        if args.create:
            for t in args.create:
                created = pq.create_topic(t)
                _emit(f"{t}: {'created' if created else 'exists'}")
            return EXIT_OK
        for t in pq.list_topics():
            if args.stats:
                _emit(f"{t}\t" + "\t".join(f"{k}={v}" for k, v in pq.topic_stats(t).items()))
            else:
                _emit(t)
    return EXIT_OK


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
    with _queue(args) as pq:
        if args.create:
            pq.create_topic(args.topic)
        try:
            ids = pq.register_producer(args.producer).publish_batch(args.topic, payloads)
        except PublishError as exc:
            published: list[str] = getattr(exc, "published_ids", [])
            failed: list[int] = getattr(exc, "failed_indices", [])
            if not published:
                raise
            try:
                _emit(*published)
            finally:
                print(f"pawnq: PublishError: {exc}; not published: payload "
                      f"{_numbers(failed)} (0-based, input order); the {len(published)} "
                      "printed ids were published", file=sys.stderr)
            return EXIT_ERROR
    _emit(*ids)
    return EXIT_OK


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
    with _queue(args) as pq:
        consumer = pq.register_consumer(args.consumer, topics=args.topic)
        held: list[Message] = []  # --no-ack: kept leased to the end, so a peek sees each once
        count = 0
        try:
            while count < args.max:
                msgs = consumer.poll(max_messages=min(args.max - count, 100))
                if not msgs:
                    break
                try:
                    _emit(*(json.dumps(m.to_dict(), ensure_ascii=False) for m in msgs),
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
                count += len(msgs)
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


def cmd_dead_letter(args: argparse.Namespace) -> int:
    """List the dead-letter objects of a topic (id and reason), or print one whole."""
    from . import layout

    with _queue(args) as pq:
        pq.context.require_topic(args.topic)
        listing = pq.store.list(layout.dead_letter_prefix(args.topic), limit=args.max)
        for info in listing.objects:
            body = pq.store.get(info.key).body
            try:
                doc = json.loads(body)
                reason = (doc.get("dead_letter") or {}).get("reason", "")
                line = json.dumps({"key": info.key, "id": doc.get("id"), "reason": reason,
                                   "payload": doc.get("payload")}, ensure_ascii=False)
            except (json.JSONDecodeError, AttributeError):
                line = json.dumps({"key": info.key, "raw": body[:200].decode("latin-1")})
            _emit(line)
    return EXIT_OK


def cmd_info(args: argparse.Namespace) -> int:
    """Show the effective configuration (secrets masked) and what the server honours."""
    pq = _queue(args)
    _emit(json.dumps(pq.config.redacted_dict(), indent=2, sort_keys=True))
    with pq:
        caps = pq.context.caps
        _emit(f"store: {pq.store.describe()}",
              f"if_none_match: {caps.if_none_match}  if_match: {caps.if_match}",
              f"strategy: {caps.strategy}")
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


def _end_progress() -> None:
    """End a progress bar's line (on a terminal only, as the bar itself)."""
    if sys.stdout.isatty():
        _emit("")


def _count(minimum: int) -> Any:
    """An argparse type: an int of at least ``minimum`` (else a usage error)."""

    def parse(text: str) -> int:
        value = int(text)
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        return value

    return parse


def _seconds(text: str) -> float:
    """An argparse type: a positive number of seconds."""
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


_EPILOG = """exit status: 0 ok; 1 failed (one line on stderr; --verbose adds the traceback);
2 usage error; 141 stdout closed by its reader (| head), quietly; 130 Ctrl-C.
worker: 1 stopped hard, 3 store unreachable, 4 bad configuration or missing topic,
5 handler import failed, 6 workers kept failing to start. See README.md, "The CLI"."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pawnq",
        description="pawn-queue-sync: a message queue on any S3-compatible object store.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--config", "-c", help="YAML configuration file (env PAWNQUEUE_* too)")
    parser.add_argument("--verbose", "-v", action="count", default=0,
                        help="more logging; errors with their traceback")
    sub = parser.add_subparsers(dest="command", required=True)
    # -c/-v after the command too (`pawnq consume orders -c config.yaml`), as `pawnq
    # worker` always took them; SUPPRESS keeps a value given before the command.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--config", "-c", default=argparse.SUPPRESS,
                        help="YAML configuration file (env PAWNQUEUE_* too)")
    common.add_argument("--verbose", "-v", action="count", dest="verbose_after",
                        default=argparse.SUPPRESS,
                        help="more logging; errors with their traceback")

    demo = sub.add_parser("demo", parents=[common],
                          help="publish and consume a few hundred messages")
    demo.add_argument("--messages", "-n", type=_count(0), default=300)
    demo.add_argument("--threads", type=_count(1), default=8)
    demo.add_argument("--topic", default="demo")
    demo.add_argument("--path", default=None,
                      help="local store directory (default: PAWNQUEUE_LOCAL_PATH, else "
                      "./.pawnqueue)")
    demo.add_argument("--timeout", type=_seconds, default=300.0)
    demo.set_defaults(func=cmd_demo)

    topics = sub.add_parser("topics", parents=[common], help="list topics (or create them)")
    topics.add_argument("--create", nargs="+", metavar="TOPIC")
    topics.add_argument("--stats", action="store_true", help="with pending/leased/dead counts")
    topics.set_defaults(func=cmd_topics)

    pub = sub.add_parser("publish", parents=[common],
                         help="publish JSON payloads (args or stdin lines)")
    pub.add_argument("topic")
    pub.add_argument("payload", nargs="*")
    pub.add_argument("--producer", default="pawnq-cli")
    pub.add_argument("--create", action="store_true", help="create the topic if missing")
    pub.set_defaults(func=cmd_publish)

    con = sub.add_parser("consume", parents=[common],
                         help="print messages as JSON lines and ack them")
    con.add_argument("topic", nargs="+")
    con.add_argument("--consumer", default="pawnq-cli")
    con.add_argument("--max", type=_count(1), default=10)
    con.add_argument("--no-ack", action="store_true", help="release instead of ack (peek)")
    con.set_defaults(func=cmd_consume)

    dl = sub.add_parser("dead-letter", parents=[common],
                        help="list a topic's dead letters with reasons")
    dl.add_argument("topic")
    dl.add_argument("--max", type=_count(1), default=100)
    dl.set_defaults(func=cmd_dead_letter)

    info = sub.add_parser("info", parents=[common],
                          help="effective configuration and server capabilities")
    info.set_defaults(func=cmd_info)

    try:
        from .runtime.cli_worker import add_worker_parser
    except ImportError:  # pragma: no cover - the runtime is part of the package
        pass
    else:
        add_worker_parser(sub)
    return parser


def _report(text: str, verbose: bool) -> None:
    """One line on stderr; the traceback of the exception being handled before it
    under ``--verbose``."""
    if verbose:
        traceback.print_exc(file=sys.stderr)
    print(f"pawnq: {text}", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``pawnq``; the exit status (one of the ``EXIT_*`` codes).

    Failures are handled here, once, for every command: a closed stdout (BrokenPipeError)
    ends quietly with ``EXIT_BROKEN_PIPE``; any other error prints one line.
    """
    verbose = False
    try:
        parser = build_parser()
        try:
            args = parser.parse_args(argv)
        except SystemExit:  # --help, or a usage error: its output must not fail at exit
            sys.stdout.flush()
            raise
        args.verbose += getattr(args, "verbose_after", 0)  # -v before and after add up
        verbose = args.verbose > 0
        level = logging.WARNING - 10 * min(args.verbose, 2)
        logging.basicConfig(level=level,
                            format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        status = int(args.func(args))
        _emit()  # flush now: a failure at exit would be a traceback and status 120
        return status
    except BrokenPipeError:
        _discard_stdout()
        return EXIT_BROKEN_PIPE
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except CliError as exc:
        if isinstance(exc, OutputError):  # what is left in the buffer can't be written
            _discard_stdout()
        _report(str(exc), verbose)
        return EXIT_ERROR
    except PawnQueueError as exc:
        _report(f"{type(exc).__name__}: {exc}", verbose)
        return EXIT_ERROR
    except Exception as exc:  # a bug, or an error nobody translated: still one line
        hint = "" if verbose else " (--verbose shows the traceback)"
        _report(f"unexpected {type(exc).__name__}: {exc}{hint}", verbose)
        return EXIT_ERROR


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
