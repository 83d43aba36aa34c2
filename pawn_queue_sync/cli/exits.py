"""The exit statuses of ``pawnq``, documented in README.md ("The CLI"; a test checks
that every one is there). ``worker``'s pass through from the pool's ``RET_*`` codes."""

from __future__ import annotations

import signal

#: The command did what was asked.
EXIT_OK = 0
#: It failed: a library error (store, topic, lease, a topic not empty to delete...),
#: output that could not be written, a partly failed publish, a redrive with failed
#: moves, a purge declined at its question, an incomplete demo; ``worker``: stopped hard.
EXIT_ERROR = 1
#: Bad arguments (argparse's status), a payload that is not JSON, or a purge without
#: ``--yes`` when stdin is not a terminal to ask on.
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
#: Interrupted by Ctrl-C (128 + SIGINT, as a shell reports it); ``stats --watch``, which
#: Ctrl-C is the way to end, exits ``EXIT_OK`` instead.
EXIT_INTERRUPTED = 128 + signal.SIGINT
#: Standard output was closed by its reader (``pawnq ... | head``): 128 + SIGPIPE, the
#: status a shell shows for a tool that SIGPIPE stopped; nothing is printed.
EXIT_BROKEN_PIPE = 128 + signal.SIGPIPE
