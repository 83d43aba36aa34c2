"""What the benchmark gives both libraries: message counts per scenario (``sizes``),
and the same polling and csprng_verify settings for pawn-queue-sync and pawn-queue
(``lib_config``), so that only the client differs between two rows."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks.server import ACCESS_KEY, SECRET_KEY

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results"

OURS, PQ = "ours", "pawn-queue"


def sizes(quick: bool) -> dict[str, Any]:
    """Message counts per scenario; pawn-queue gets fewer where it is slow (csprng_verify
    ~1 msg/s). ``--quick`` is a smoke run: tiny counts, no 3-process csprng_verify."""
    if quick:
        return {
            "publish_seq": 100, "publish_batch": 400,
            "consume_cw": {OURS: 200, PQ: 100}, "consume_cw_3": {OURS: 150, PQ: 60},
            "consume_cs": {OURS: 80, PQ: 3}, "consume_cs_3": None,
            "e2e": 30, "e2e_rate": 10.0,
            "idle_seconds": 3.0, "backlogs": [500],
        }
    return {
        "publish_seq": 2000, "publish_batch": 10000,
        "consume_cw": {OURS: 1500, PQ: 1500}, "consume_cw_3": {OURS: 1500, PQ: 1500},
        "consume_cs": {OURS: 1500, PQ: 20}, "consume_cs_3": {OURS: 3000, PQ: 30},
        "e2e": 300, "e2e_rate": 10.0,
        "idle_seconds": 12.0, "backlogs": [1000, 10000, 100000],
    }


# -- configuration given to both libraries ---------------------------------------------


def polling(max_messages: int, interval: float = 0.2) -> dict[str, Any]:
    return {
        "interval_seconds": interval,
        "max_messages_per_poll": max_messages,
        "visibility_timeout_seconds": 30.0,
        "lease_refresh_interval_seconds": 10.0,
    }


CSPRNG = {"jitter_min_ms": 100, "jitter_max_ms": 400, "verify_retries": 2,
          "verify_retry_delay_ms": 150}


def lib_config(lib: str, endpoint: str, bucket: str, strategy: str,
               poll: dict[str, Any], claim_threads: int = 16) -> dict[str, Any]:
    s3 = {
        "endpoint_url": endpoint, "bucket_name": bucket,
        "aws_access_key_id": ACCESS_KEY, "aws_secret_access_key": SECRET_KEY,
        "region_name": "us-east-1", "use_ssl": endpoint.startswith("https"),
    }
    cfg: dict[str, Any] = {
        "s3": s3,
        "polling": dict(poll),
        "concurrency": {"strategy": strategy, "csprng_verify": dict(CSPRNG)},
    }
    if lib == OURS:
        s3["create_bucket"] = True
        cfg["polling"]["claim_threads"] = claim_threads
        cfg["publishing"] = {"batch_threads": 16}
    return cfg

