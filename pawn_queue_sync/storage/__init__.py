"""Object stores behind one small protocol (see :mod:`.base`)."""

from .base import (
    DELETE_BATCH,
    ConditionFailed,
    GetResult,
    Listing,
    ObjectInfo,
    ObjectNotFound,
    PutResult,
    StorageError,
    Store,
    StoreUnavailable,
    normalize_etag,
)

__all__ = [
    "DELETE_BATCH",
    "ConditionFailed",
    "GetResult",
    "Listing",
    "ObjectInfo",
    "ObjectNotFound",
    "PutResult",
    "StorageError",
    "Store",
    "StoreUnavailable",
    "normalize_etag",
]
