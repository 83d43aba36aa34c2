"""Where the S3 store's boto3 clients come from: its settings (the default: a fresh
botocore session per client, the credential chain or the configured keys), a caller's
``boto3.Session`` (profiles, assumed roles, SSO: clients are built from it, in a forked
child too, where botocore's refresh locks of the session's credentials are replaced:
a thread of the parent may have held one at the fork), or a caller's ready boto3 S3
client (used as it is, in the process that gave it only: a client never crosses a
fork). Anything else given as either is a ConfigError (:func:`check_session_client`).

A store built from a session or a client cannot be pickled (:class:`StoreNotPortable`):
its credentials live in the session, which does not travel; Spark executors build
their own store from settings."""

from __future__ import annotations

import hashlib
import os
import threading
import weakref
from typing import TYPE_CHECKING, Any

import attrs

from ...errors import ConfigError, StoreNotPortable, StoreUnavailable
from .secrets import SECRET_FILTER
from .times import parse_timestamp

if TYPE_CHECKING:
    from ...config import S3Config

__all__ = ["Built", "ClientSource", "check_session_client"]


@attrs.frozen
class Built:
    """A boto3 client for this process, the credentials it signs with (None: unknown,
    the fast path then stands aside), the CA bundle its HTTPS verifies with (None: it
    does not verify, and neither could the fast path), and whether the store owns it
    (closes it and may change its event hooks)."""

    client: Any
    credentials: Any
    ca_bundle: str | None
    owned: bool


class ClientSource:
    """Builds the store's boto3 client for the current process (see the module)."""

    def __init__(self, config: S3Config, *, session: Any = None, client: Any = None) -> None:
        check_session_client(session, client)
        self._config = config
        self._session = session
        self._client = client
        self._pid = os.getpid()
        if session is not None:
            _SESSION_SOURCES.add(self)

    @property
    def kind(self) -> str:
        """``"settings"``, ``"session"`` or ``"client"``."""
        if self._client is not None:
            return "client"
        return "session" if self._session is not None else "settings"

    def endpoint(self) -> str | None:
        """The endpoint requests go to, as configured (a given client's own)."""
        if self._client is not None:
            return str(self._client.meta.endpoint_url)
        return self._config.endpoint_url

    def who(self) -> str:
        """Who we are to the server, for the capability probe's cache: a digest of the
        access key id the requests are signed with, or the default credential chain. A
        given client signs with its own credentials, never the configured ones; a
        session's clients are built with the configured keys when there are some."""
        who = None if self._client is not None else self._config.aws_access_key_id
        if who is None and self.kind != "settings":
            given = self._session if self._client is None else self._client
            creds = self._credentials_of(given)
            try:
                frozen = None if creds is None else creds.get_frozen_credentials()
            except Exception:  # credentials that fail to refresh: the request reports it
                frozen = None
            who = frozen.access_key if frozen else f"{self.kind} {id(given)}"
        digest = hashlib.sha256((who or "default credential chain").encode("utf-8")).hexdigest()
        return digest[:16]

    def check_portable(self) -> None:
        """Raise :class:`StoreNotPortable` for a store that cannot be pickled."""
        if self.kind != "settings":
            raise StoreNotPortable(
                f"an S3 store built from a boto3 {self.kind} cannot be pickled: its "
                "credentials live in that object. Build the store where it is used from "
                "settings (s3.* or the AWS environment), as Spark executors do"
            )

    def build(self, pool: int) -> Built:
        """This process's client (StoreUnavailable if it cannot be built;
        StoreNotPortable in a forked child of a store given a client)."""
        cfg = self._config
        SECRET_FILTER.add(cfg.aws_access_key_id, cfg.aws_secret_access_key)
        if self._client is not None:
            if os.getpid() != self._pid:
                raise StoreNotPortable(
                    "this S3 store uses a boto3 client given by the caller, which cannot "
                    "be used in a forked child (its connections are the parent's): build "
                    "the store in the child, or give a boto3 session instead"
                )
            creds = self._credentials_of(self._client)
            self._hide(creds)
            return Built(self._client, creds, _verify_of(self._client), owned=False)
        client, creds, ca_bundle = self._new_client(pool)
        self._hide(creds)
        return Built(client, creds, ca_bundle, owned=True)

    def _new_client(self, pool: int) -> tuple[Any, Any, str | None]:
        import boto3
        from botocore.config import Config

        cfg = self._config
        bc = Config(
            connect_timeout=cfg.connect_timeout_seconds,
            read_timeout=cfg.read_timeout_seconds,
            retries={"max_attempts": cfg.max_attempts, "mode": "standard"},
            max_pool_connections=pool,
            s3={"addressing_style": cfg.addressing_style},
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
        )
        if self._session is not None:
            session = self._session
            core = getattr(session, "_session", None)  # boto3's botocore session
        else:
            core = _new_botocore_session()
            # botocore parses every listed key's timestamp with dateutil (0.1-0.4 ms
            # each): the standard library does the same in a fraction of that.
            core.get_component("response_parser_factory").set_parser_defaults(
                timestamp_parser=parse_timestamp
            )
            session = boto3.session.Session(botocore_session=core)
        try:
            client = session.client(
                "s3",
                endpoint_url=cfg.endpoint_url,
                region_name=cfg.region_name,
                use_ssl=cfg.use_ssl,
                aws_access_key_id=cfg.aws_access_key_id,
                aws_secret_access_key=cfg.aws_secret_access_key,
                config=bc,
            )
        except Exception as exc:  # bad endpoint URL, bad region, ...
            raise StoreUnavailable(f"cannot build an S3 client: {type(exc).__name__}") from None
        if cfg.aws_access_key_id and cfg.aws_secret_access_key:
            from botocore.credentials import Credentials

            creds: Any = Credentials(cfg.aws_access_key_id, cfg.aws_secret_access_key)
        else:
            creds = session.get_credentials()
        ca_bundle = core.get_config_variable("ca_bundle") if core is not None else None
        if not ca_bundle:
            from botocore.httpsession import get_cert_path

            ca_bundle = get_cert_path(True)
        return client, creds, ca_bundle

    @staticmethod
    def _credentials_of(source: Any) -> Any:
        """The credentials of a boto3 session or client (refreshable ones stay so)."""
        get = getattr(source, "get_credentials", None) or getattr(
            source, "_get_credentials", None  # what s3transfer reads of a client
        )
        try:
            return get() if callable(get) else None
        except Exception:  # a broken profile: boto3 reports it on the first request
            return None

    @staticmethod
    def _hide(creds: Any) -> None:
        """Mask these credentials in the logs of botocore and urllib3 too."""
        if creds is None:
            return
        frozen = getattr(creds, "_frozen_credentials", None)  # no refresh just for this
        if frozen is None and not hasattr(creds, "refresh_needed"):
            frozen = creds.get_frozen_credentials()
        if frozen is not None:
            SECRET_FILTER.add(frozen.access_key, frozen.secret_key, frozen.token)


def check_session_client(session: Any, client: Any) -> None:
    """ConfigError unless ``session`` is None or a ``boto3.Session`` and ``client`` None
    or a boto3 S3 client, and not both given: checked where they are given, before any
    request (a wrong object would fail later with an untyped error)."""
    if session is not None and client is not None:
        raise ConfigError("s3", "give a boto3 session or a boto3 client, not both")
    if session is not None:
        import boto3.session

        if not isinstance(session, boto3.session.Session):
            raise ConfigError(
                "session", f"expected a boto3.Session (boto3.Session(profile_name=...)), "
                f"not {_kind_of(session)}"
            )
    if client is not None:
        import botocore.client

        service = None
        if isinstance(client, botocore.client.BaseClient):
            service = getattr(getattr(client.meta, "service_model", None), "service_name", None)
        if service != "s3":
            raise ConfigError(
                "client", f"expected a boto3 S3 client (boto3.client('s3', ...)), not "
                f"{_kind_of(client)}"
            )


def _kind_of(value: Any) -> str:
    """What a value is, for an error: a boto3 client's service, else its type (never
    its repr, which could quote a secret)."""
    model = getattr(getattr(value, "meta", None), "service_model", None)
    service = getattr(model, "service_name", None)
    if isinstance(service, str):
        return f"a boto3 client of {service}"
    return f"a {type(value).__module__}.{type(value).__qualname__}"


def _verify_of(client: Any) -> str | None:
    """The CA bundle a given client verifies HTTPS with (None: the default bundle);
    the fast path never verifies less than the client does."""
    verify = getattr(getattr(getattr(client, "_endpoint", None), "http_session", None),
                     "_verify", True)
    if isinstance(verify, str):
        return verify
    from botocore.httpsession import get_cert_path

    return get_cert_path(True) if verify else None


_LOADER: Any = None


def _new_botocore_session() -> Any:
    """A fresh botocore session (own credentials, config and events) sharing this
    process's data loader: loading the S3 service model again for every client costs
    ~0.5 s of CPU with the GIL held. The loader is a cache of read-only JSON files, so
    no lock (a race builds two, harmlessly) and nothing to redo after a fork."""
    import botocore.loaders
    import botocore.session

    global _LOADER
    loader = _LOADER
    if loader is None:
        loader = _LOADER = botocore.loaders.create_loader()
    session = botocore.session.Session()
    session.register_component("data_loader", loader)
    return session


#: the sources built from a caller's session, for :func:`_after_fork_in_child`
_SESSION_SOURCES: weakref.WeakSet[ClientSource] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    """In a forked child, new locks for botocore's refreshing credentials and token of
    every session a store uses: a thread of the parent refreshing them (an STS or SSO
    call, under the lock) at the fork does not exist here, and the child's first
    request would wait for that lock forever. Guarded by ``hasattr``: a botocore
    without these attributes keeps its own."""
    for source in list(_SESSION_SOURCES):
        core = getattr(source._session, "_session", None)  # boto3's botocore session
        for held in (getattr(core, "_credentials", None), getattr(core, "_auth_token", None)):
            lock = getattr(held, "_refresh_lock", None)
            if lock is not None:
                rlock = isinstance(lock, type(threading.RLock()))
                held._refresh_lock = threading.RLock() if rlock else threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)
