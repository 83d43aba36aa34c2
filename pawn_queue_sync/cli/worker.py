"""``pawnq worker``: run a supervised pool of worker processes from the command line.

    pawnq worker package.module:function --topic orders [--topic more] \\
        --processes 4 --threads 8 --config config.yaml [--consumer-name NAME] \\
        [--metrics-port 9108]

The handler is imported as ``python -m`` would: the working directory comes first on
``sys.path`` (after any ``--path DIR``), in the supervisor and in every worker process.
The exit status is one of the ``RET_*`` codes of :mod:`pawn_queue_sync.workers` (0:
stopped gracefully). Also ``python -m pawn_queue_sync worker ...``, and standalone, without
the subcommand, ``python -m pawn_queue_sync.cli.worker HANDLER --topic ...`` (:func:`main`).

The worker pool is imported when the command runs (it pulls in multiprocessing), and
never imports this module: the CLI sits above the pool.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import sys
from collections.abc import Sequence
from typing import Any

log = logging.getLogger(__name__)

__all__ = ["add_worker_parser", "run_worker", "main"]


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _port(text: str) -> int:
    """A TCP port, 0-65535 (0: any free one)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be 0-65535, got {value}")
    return value


def _seconds(text: str) -> float:
    """A finite number of seconds >= 0 (inf or nan would break the supervisor's waits)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text!r}")
    return value


def _add_arguments(parser: argparse.ArgumentParser, *, config_default: Any) -> None:
    parser.add_argument("handler", help="the handler to run, as package.module:function")
    parser.add_argument(
        "--topic", "-t", dest="topics", action="append", required=True, metavar="TOPIC",
        help="topic to consume (repeat for several)",
    )
    parser.add_argument("--processes", "-p", type=_positive_int, default=os.cpu_count() or 1,
                        help="worker processes (default: CPU count)")
    parser.add_argument("--threads", type=_positive_int, default=8,
                        help="handler threads per process (default: 8)")
    parser.add_argument("--config", "-c", default=config_default,
                        help="YAML configuration file (env PAWNQUEUE_* fills the gaps)")
    parser.add_argument("--consumer-name", default="worker",
                        help="base of the workers' registered consumer names: worker i "
                        "registers as NAME/i (default: worker)")
    parser.add_argument("--shutdown-timeout", type=_seconds, default=30.0,
                        help="seconds in-flight handlers get to finish on stop (default: 30)")
    parser.add_argument("--metrics-port", type=_port, default=None, metavar="N",
                        help="serve the workers' Prometheus metrics at "
                        "http://ADDR:N/metrics (needs pawn-queue-sync[metrics])")
    parser.add_argument("--metrics-addr", default="127.0.0.1", metavar="ADDR",
                        help="address the metrics are served on (default: 127.0.0.1, "
                        "this host only; 0.0.0.0 for every interface)")
    parser.add_argument("--path", dest="sys_path", action="append", default=[],
                        metavar="DIR", help="prepend DIR to sys.path to import the handler "
                        "(repeatable; the working directory is always importable, after "
                        "these)")


def add_worker_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``worker`` subcommand to ``pawnq``'s subparsers; it runs :func:`run_worker`.

    ``--config`` here does not override a ``--config`` given before the subcommand.
    """
    parser = subparsers.add_parser(
        "worker",
        help="run a pool of worker processes calling a handler for each message",
        description="Run PROCESSES worker processes x THREADS threads calling HANDLER for "
        "each message of the topics. SIGTERM/SIGINT: graceful stop; a second one: kill. "
        "Exit status: 0 ok, 1 killed, 2 usage error, 3 store unreachable, "
        "4 bad configuration or missing topic, 5 handler import failed, 6 workers kept "
        "failing to start. The handler is imported from the working directory (as with "
        "python -m) or a --path DIR.",
    )
    _add_arguments(parser, config_default=argparse.SUPPRESS)
    # -v after the command too, as every other subcommand takes it (added to a -v
    # given before it)
    parser.add_argument("--verbose", "-v", action="count", dest="verbose_after",
                        default=argparse.SUPPRESS,
                        help="more logging; errors with their traceback")
    parser.set_defaults(func=run_worker)
    return parser


def run_worker(args: argparse.Namespace) -> int:
    """Run the pool described by parsed ``worker`` arguments; the exit status."""
    from ..errors import MissingExtra
    from ..workers import RET_CONFIG, RET_OK, WorkerPool

    _prepend_import_paths(args.sys_path or [])
    config = getattr(args, "config", None)
    try:
        pool = WorkerPool(
            config,
            args.topics,
            args.handler,
            processes=args.processes,
            threads=args.threads,
            consumer_name=args.consumer_name,
            shutdown_timeout_seconds=args.shutdown_timeout,
            metrics_port=getattr(args, "metrics_port", None),
            metrics_addr=getattr(args, "metrics_addr", "127.0.0.1"),
        )
    except (ValueError, MissingExtra) as exc:
        log.error("%s", exc)
        return RET_CONFIG
    if config is None:
        _note_unread_config()
    print(_start_line(args), flush=True)
    status = pool.run()
    if status == RET_OK:
        print("pawnq worker: stopped", flush=True)
    return status


def _note_unread_config() -> None:
    """Say on stderr when the workers will use the local store while a ``config.yaml``
    (read only with ``--config``) sits in the working directory."""
    from ..config import load_config
    from ..errors import ConfigError
    from .shared import unread_config_note

    try:
        note = unread_config_note(None, load_config(None))
    except ConfigError:  # the pool reports a bad configuration itself
        return
    if note:
        print(f"pawnq worker: {note}", file=sys.stderr, flush=True)


def _start_line(args: argparse.Namespace) -> str:
    """What ``pawnq worker`` prints before it starts: what runs, and where its metrics
    are served (logging is at WARNING unless -v: the pool's own lines are INFO)."""
    line = (f"pawnq worker: starting {args.processes} process(es) x {args.threads} "
            f"thread(s) of {args.handler} on {', '.join(args.topics)}")
    port = getattr(args, "metrics_port", None)
    if port is not None:
        addr = getattr(args, "metrics_addr", "127.0.0.1")
        host = f"[{addr}]" if ":" in addr else addr
        line += (f"; metrics at http://{host}:{port}/metrics" if port
                 else f"; metrics on a free port of {addr} (-v logs which)")
    return line + "; SIGTERM or Ctrl-C stops it gracefully"


def _prepend_import_paths(dirs: Sequence[str]) -> None:
    """Make the working directory, and before it each of ``dirs``, importable, as
    ``python -m`` does for the working directory: a console script's ``sys.path``
    starts with its own bin directory instead. Spawned workers get this ``sys.path``
    (multiprocessing passes the parent's to each child)."""
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
    for path in reversed(dirs):
        sys.path.insert(0, os.path.abspath(path))


def main(argv: Sequence[str] | None = None) -> int:
    """Standalone entry (``python -m pawn_queue_sync.cli.worker``)."""
    parser = argparse.ArgumentParser(prog="pawnq-worker", description=__doc__.splitlines()[0])
    parser.add_argument("--verbose", "-v", action="count", default=0)
    _add_arguments(parser, config_default=None)
    args = parser.parse_args(argv)
    level = logging.WARNING - 10 * min(args.verbose, 2)
    logging.basicConfig(level=level, format="%(asctime)s %(processName)s[%(process)d] "
                        "%(levelname)s %(name)s: %(message)s")
    return run_worker(args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
