"""Bytes on the wire: canonical JSON (as pawn-queue writes it), ETags, timestamps."""

from __future__ import annotations

import hashlib
import json
from datetime import datetime, timezone
from typing import Any


def canonical_json(data: Any) -> bytes:
    """Sorted keys, no spaces, UTF-8: the same bytes as pawn-queue, so ETags match."""
    return json.dumps(
        data, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode("utf-8")


def md5_hex(data: bytes) -> str:
    """The ETag S3 gives a single-part upload of ``data``."""
    return hashlib.md5(data, usedforsecurity=False).hexdigest()


def iso(when: datetime) -> str:
    return when.astimezone(timezone.utc).isoformat()
