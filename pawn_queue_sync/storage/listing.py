"""S3's listing rules over keys in ascending order, shared by the stores that list
from a sorted key set (:mod:`.local`, :mod:`.memory`) and the test simulator."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import datetime

from .base import Listing, ObjectInfo

__all__ = ["build_listing"]


def build_listing(
    keys: Iterable[str],
    info: Callable[[str], ObjectInfo | None],
    prefix: str,
    limit: int | None,
    delimiter: str | None,
    server_time: datetime | None,
    start_after: str | None = None,
) -> Listing:
    """Turn keys in ascending order into a :class:`Listing`, the way S3 does.

    Keys not starting with ``prefix`` are skipped. With a ``delimiter``, a key whose
    rest (after the prefix) contains it is folded into the common prefix up to and
    including the delimiter's first occurrence. ``limit`` counts objects only, as the
    protocol says: the listing stops right after the ``limit``-th object (so it holds
    the common prefixes before it), and ``truncated`` says whether anything (an object
    or a new common prefix) follows, which is what S3's IsTruncated reports when paging
    with MaxKeys = objects still wanted. ``info`` returns None for a key that vanished
    meanwhile (it is then skipped). Keys up to ``start_after`` (in code point order,
    which is UTF-8 byte order) are skipped.
    """
    objects: list[ObjectInfo] = []
    prefixes: list[str] = []
    budget = None if limit is None else max(0, limit)
    last_prefix: str | None = None
    truncated = False
    for key in keys:
        if not key.startswith(prefix) or (start_after is not None and key <= start_after):
            continue
        common: str | None = None
        if delimiter:
            at = key.find(delimiter, len(prefix))
            if at >= 0:
                common = key[: at + len(delimiter)]
                if common == last_prefix:
                    continue
        if budget is not None and len(objects) >= budget:
            truncated = True
            break
        if common is not None:
            last_prefix = common
            prefixes.append(common)
            continue
        obj = info(key)
        if obj is not None:
            objects.append(obj)
    return Listing(objects=objects, prefixes=prefixes, server_time=server_time, truncated=truncated)
