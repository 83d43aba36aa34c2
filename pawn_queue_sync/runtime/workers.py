"""Deprecated import path: the worker pool lives in :mod:`pawn_queue_sync.workers`.

``from pawn_queue_sync.runtime.workers import WorkerPool`` was documented before the
pool moved up a layer (process level, above the queue); it keeps working, with a
DeprecationWarning on import. Import from ``pawn_queue_sync`` or
``pawn_queue_sync.workers`` instead.
"""

from __future__ import annotations

import warnings

from ..workers import *  # noqa: F403  (the public names, re-exported)
from ..workers import __all__  # noqa: F401

warnings.warn(
    "pawn_queue_sync.runtime.workers is deprecated; import from pawn_queue_sync.workers "
    "(or pawn_queue_sync)",
    DeprecationWarning,
    stacklevel=2,
)
