"""``pawnq``: everyday operations from the shell (also ``python -m pawn_queue_sync``).

Every command reads the configuration the library reads (``--config`` YAML, then
``PAWNQUEUE_*`` variables); with neither, it works on the embedded local store in
``./.pawnqueue``.

Output is written, flushed (and for a regular file, synced) before anything depends
on it: ``consume`` acks a batch only once its lines are out, and gives the batch back
when they could not be written. Errors print as one line on stderr (with the
traceback under ``--verbose``); the exit statuses are the ``EXIT_*`` constants
(:mod:`.exits`, exported here), documented in README.md ("The CLI").

Modules: :mod:`.parser` (the options, and each group's subcommands), one per command
group (:mod:`.demo`, :mod:`.topics`, :mod:`.messages`, :mod:`.deadletters`,
:mod:`.stats`, :mod:`.worker`), and
:mod:`.shared` (output, errors, the queue a command opens). The CLI sits at the top:
it imports the queue and the worker pool, and nothing imports it.
"""

from __future__ import annotations

import logging
import sys
import traceback
from collections.abc import Sequence

from ..errors import PawnQueueError
from .exits import (
    EXIT_BROKEN_PIPE,
    EXIT_CONFIG,
    EXIT_ERROR,
    EXIT_HANDLER_IMPORT,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_STORE_UNREACHABLE,
    EXIT_USAGE,
    EXIT_WORKERS_FAILED_TO_START,
)
from .parser import build_parser
from .shared import CliError, OutputError, discard_stdout, emit

__all__ = [
    "EXIT_BROKEN_PIPE",
    "EXIT_CONFIG",
    "EXIT_ERROR",
    "EXIT_HANDLER_IMPORT",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_STORE_UNREACHABLE",
    "EXIT_USAGE",
    "EXIT_WORKERS_FAILED_TO_START",
    "CliError",
    "OutputError",
    "build_parser",
    "main",
]


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
        emit()  # flush now: a failure at exit would be a traceback and status 120
        return status
    except BrokenPipeError:
        discard_stdout()
        return EXIT_BROKEN_PIPE
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except CliError as exc:
        if isinstance(exc, OutputError):  # what is left in the buffer can't be written
            discard_stdout()
        _report(str(exc), verbose)
        return EXIT_ERROR
    except PawnQueueError as exc:
        _report(f"{type(exc).__name__}: {exc}", verbose)
        return EXIT_ERROR
    except Exception as exc:  # a bug, or an error nobody translated: still one line
        hint = "" if verbose else " (--verbose shows the traceback)"
        _report(f"unexpected {type(exc).__name__}: {exc}{hint}", verbose)
        return EXIT_ERROR
