"""What the configuration tests share: credentials, a full configuration, a YAML
writer and a clean environment (test_config.py, test_config_builder.py,
test_config_validation.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pawn_queue_sync.config import ENV_VARS, PawnQueueConfig, load_config

ACCESS = "AKIA-ACCESS-ID-4711"
SECRET = "s3cr3t-VALUE-do-not-leak-0815"

S3_DICT: dict[str, Any] = {
    "endpoint_url": "http://localhost:9000",
    "bucket_name": "pawnqueue",
    "aws_access_key_id": ACCESS,
    "aws_secret_access_key": SECRET,
}


def clean_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests never see PAWNQUEUE_* variables of the machine running them (each config
    test module calls it from an autouse fixture)."""
    for name in ENV_VARS.values():
        monkeypatch.delenv(name, raising=False)


def write(tmp_path: Path, text: str, name: str = "pawnqueue.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def full_config() -> PawnQueueConfig:
    """A config with every section set to non-default values."""
    return load_config(
        {
            "s3": {
                **S3_DICT,
                "region_name": "eu-central-1",
                "use_ssl": False,
                "create_bucket": True,
                "connect_timeout_seconds": 2.5,
                "read_timeout_seconds": 45,
                "max_attempts": 3,
                "max_pool_connections": 64,
                "addressing_style": "path",
            },
            "local": {"path": "/var/lib/pq", "fsync": False},
            "polling": {
                "interval_seconds": 0.5,
                "max_messages_per_poll": 25,
                "visibility_timeout_seconds": 20,
                "lease_refresh_interval_seconds": 5,
                "jitter_max_ms": 0,
                "max_delivery_count": 9,
                "claim_threads": 4,
            },
            "concurrency": {
                "strategy": "csprng_verify",
                "csprng_verify": {
                    "jitter_min_ms": 10,
                    "jitter_max_ms": 20,
                    "verify_retries": 1,
                    "verify_retry_delay_ms": 5,
                },
            },
            "registry": {"heartbeat_interval_seconds": 15},
            "publishing": {"max_payload_bytes": 4096, "batch_threads": 2},
        },
        env={},
    )
