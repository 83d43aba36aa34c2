"""The store a configuration asks for: S3 when an ``s3`` section is given, else the
local directory store. ``session``/``client`` bring the caller's boto3 session or S3
client (profiles, assumed roles, SSO), as s3transfer's ``TransferManager(client)``
takes the caller's client; see :class:`~pawn_queue_sync.storage.s3.S3Store` for what
happens to such a store across a fork and in a pickle."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..config import PawnQueueConfig
from ..errors import ConfigError
from .base import Store

__all__ = ["build_store", "check_session_client"]


def check_session_client(session: Any, client: Any) -> None:
    """ConfigError unless ``session`` is None or a ``boto3.Session``, ``client`` None or
    a boto3 S3 client, and not both are given (boto3 is imported only to check one)."""
    if session is not None or client is not None:
        from .s3.source import check_session_client as check

        check(session, client)


def build_store(config: PawnQueueConfig, *, session: Any = None, client: Any = None) -> Store:
    """The configured store, checked (an S3 bucket is reached, and created when
    ``s3.create_bucket`` asks). ``session``: a ``boto3.Session``; ``client``: a ready
    boto3 S3 client; at most one, and only for an S3 store (ConfigError otherwise)."""
    check_session_client(session, client)
    if config.s3 is not None:
        from .s3 import S3Store

        threads = config.polling.claim_threads + config.publishing.batch_threads + 8
        s3 = S3Store(config.s3, max_pool_connections=threads, session=session, client=client)
        try:
            s3.ensure_bucket(create=config.s3.create_bucket)
        except BaseException:
            s3.close()
            raise
        return s3
    if session is not None or client is not None:
        raise ConfigError(
            "s3", "a boto3 session or client needs an S3 store: give an s3 section "
            "(bucket_name, endpoint_url, ...)"
        )
    from .local import LocalStore

    return LocalStore(Path(config.local.path), fsync=config.local.fsync)
