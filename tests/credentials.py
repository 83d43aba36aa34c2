"""Test helpers for credentials that come from a boto3 session, not the settings."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

import boto3
import botocore.session
from botocore.credentials import CredentialProvider, RefreshableCredentials

from pawn_queue_sync import load_config

from .servers import S3Server, config_dict


def keyless_config(server: S3Server, bucket: str, *, fast: bool = True) -> Any:
    """The library's settings without credentials: they must come from the session."""
    raw = config_dict(server, bucket, s3={"fast_path": fast})
    del raw["s3"]["aws_access_key_id"], raw["s3"]["aws_secret_access_key"]
    return load_config(raw)


def session_of(provider: CredentialProvider) -> Any:
    """A boto3 session whose credentials come from *provider* first."""
    core = botocore.session.Session()
    core.get_component("credential_provider").insert_before("env", provider)
    return boto3.Session(botocore_session=core)


class ExpiringCredentials(CredentialProvider):
    """Credentials that expire within botocore's mandatory refresh window, so every
    request reads them again: from :meth:`current`, which a subclass defines."""

    METHOD = "test-expiring"

    def current(self) -> dict[str, str]:
        """``access_key``, ``secret_key`` and, optionally, ``token`` of this refresh."""
        raise NotImplementedError

    def _metadata(self) -> dict[str, str]:
        keys = self.current()
        expiry = datetime.now(timezone.utc) + timedelta(minutes=1)
        return {"token": "", **keys, "expiry_time": expiry.isoformat()}

    def load(self) -> RefreshableCredentials:
        return RefreshableCredentials.create_from_metadata(
            self._metadata(), refresh_using=self._metadata, method=self.METHOD
        )
