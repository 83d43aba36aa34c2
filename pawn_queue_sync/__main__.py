"""``python -m pawn_queue_sync ...``: the ``pawnq`` command, with the same arguments,
output and exit statuses (for an environment whose scripts directory is not on PATH)."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
