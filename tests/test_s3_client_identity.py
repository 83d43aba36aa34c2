"""Review of issue 13: the capability probe's cache is keyed by who signs
(ClientSource.who). For a caller's CLIENT the configured access key was taken as its
identity, but a given client signs with its own credentials and ignores the settings':
so a read-only client was accepted at setup after an admin queue probed the bucket
(and failed only at its first write), where the same with a read-only SESSION is
refused at setup (test_s3_session.py)."""

from __future__ import annotations

import pytest

from pawn_queue_sync import PawnQueue, load_config
from pawn_queue_sync.config import PawnQueueConfig
from pawn_queue_sync.errors import StoreUnavailable

from .servers import READONLY_ACCESS_KEY, READONLY_SECRET_KEY, S3Server, config_dict, make_client


def _read_only_client_refused(server: S3Server, cfg: PawnQueueConfig) -> None:
    readonly = make_client(server.endpoint_url, access_key=READONLY_ACCESS_KEY,
                           secret_key=READONLY_SECRET_KEY)
    pq = PawnQueue(cfg, client=readonly)
    try:
        with pytest.raises(StoreUnavailable, match="read-only"):
            pq.setup()
    finally:
        pq.close()


def test_a_read_only_client_is_refused_at_setup_after_an_admin_queue(
    real_s3: S3Server, real_bucket: str
) -> None:
    cfg = load_config(config_dict(real_s3, real_bucket))  # the admin keys, as settings
    with PawnQueue(cfg) as pq:
        pq.create_topic("orders")
    _read_only_client_refused(real_s3, cfg)


def test_control_without_an_earlier_admin_probe_the_client_is_refused(
    real_s3: S3Server, real_bucket: str
) -> None:
    """Control: in a fresh process state (a bucket not probed yet by anyone... the
    cache is per store identity: a new bucket), the read-only client IS refused."""
    _read_only_client_refused(real_s3, load_config(config_dict(real_s3, real_bucket)))
