"""``python -m pawn_queue_sync.workers ...``: the same as ``pawnq worker ...``."""

import sys

from ..cli.worker import main

sys.exit(main())
