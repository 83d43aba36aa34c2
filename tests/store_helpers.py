"""What the store tests share: the ETag of a body, a listing's keys, how long to wait
for a thread or process."""

from __future__ import annotations

import hashlib
from typing import Any

#: Seconds a test waits for a racing thread or process before calling it hung.
JOIN_TIMEOUT = 120.0


def md5(data: bytes) -> str:
    """The ETag every supported server gives a single-part object."""
    return hashlib.md5(data).hexdigest()


def keys_of(listing: Any) -> list[str]:
    """The object keys of a listing, in the order returned."""
    return [o.key for o in listing.objects]
