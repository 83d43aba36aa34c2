"""``pawnq``'s argument parser: the options every command takes, and each command group's
subcommands (each group adds its own, beside its code)."""

from __future__ import annotations

import argparse

from . import dashboard, deadletters, demo, messages, stats, topics

_EPILOG = """exit status: 0 ok; 1 failed (one line on stderr; --verbose adds the traceback);
2 usage error (and dead-letter purge without --yes off a terminal); 141 stdout closed by
its reader (| head), quietly; 130 Ctrl-C (stats --watch: 0).
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

    demo.add_parsers(sub, common)
    topics.add_topics_parser(sub, common)
    messages.add_parsers(sub, common)
    deadletters.add_parsers(sub, common)
    dashboard.add_parsers(sub, common)
    stats.add_parsers(sub, common)
    topics.add_info_parser(sub, common)
    # Imported here, not with the package: ``python -m pawn_queue_sync.cli.worker`` then
    # runs that module once, as __main__, instead of after a copy of it was imported.
    from . import worker

    worker.add_worker_parser(sub)
    return parser
