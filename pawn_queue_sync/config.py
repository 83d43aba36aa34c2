"""Configuration: frozen attrs classes, loaded from a YAML file, a dict, the environment.

The shape (YAML keys, field names, ``PAWNQUEUE_*`` variables) is pawn-queue 0.1.3's, plus
a few settings of our own. Precedence, highest first:

1. explicit values: a dict passed to :func:`load_config`, or values set on the builder;
2. the environment (``PAWNQUEUE_*``, see :data:`ENV_VARS` / :func:`dump_env_docs`);
3. the YAML file;
4. the defaults below.

(pawn-queue lets the environment beat explicit values; we do not.)

Without an ``s3`` section the embedded local store is used (:attr:`PawnQueueConfig.backend`).
Every error is a :class:`~pawn_queue_sync.errors.ConfigError` naming the dotted field, and
no message, ``repr`` or ``str`` ever shows a credential.
"""

from __future__ import annotations

import difflib
import enum
import math
import os
import re
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, ClassVar, Literal
from urllib.parse import urlsplit

import attrs
import yaml

from .errors import ConfigError

if TYPE_CHECKING:
    from .queue.core import PawnQueue

__all__ = [
    "ENV_VARS",
    "SECRET_FIELDS",
    "AddressingStyle",
    "ConcurrencyConfig",
    "CsprngVerifyConfig",
    "LocalConfig",
    "PawnQueueBuilder",
    "PawnQueueConfig",
    "PollingConfig",
    "PublishingConfig",
    "RegistryConfig",
    "S3Config",
    "Strategy",
    "dump_env_docs",
    "load_config",
    "redact_endpoint",
]

Strategy = Literal["auto", "conditional_write", "csprng_verify"]
AddressingStyle = Literal["auto", "path", "virtual"]

_STRATEGIES: tuple[str, ...] = ("auto", "conditional_write", "csprng_verify")
_ADDRESSING_STYLES: tuple[str, ...] = ("auto", "path", "virtual")
_MASK = "***"

#: The one table of environment variables: dotted setting -> variable name.
#: Used for loading and for :func:`dump_env_docs`.
ENV_VARS: Mapping[str, str] = MappingProxyType(
    {
        "s3.endpoint_url": "PAWNQUEUE_S3_ENDPOINT_URL",
        "s3.bucket_name": "PAWNQUEUE_S3_BUCKET_NAME",
        "s3.aws_access_key_id": "PAWNQUEUE_S3_ACCESS_KEY",
        "s3.aws_secret_access_key": "PAWNQUEUE_S3_SECRET_KEY",
        "s3.region_name": "PAWNQUEUE_S3_REGION",
        "s3.use_ssl": "PAWNQUEUE_S3_USE_SSL",
        "s3.create_bucket": "PAWNQUEUE_S3_CREATE_BUCKET",
        "s3.fast_path": "PAWNQUEUE_S3_FAST_PATH",
        "local.path": "PAWNQUEUE_LOCAL_PATH",
        "polling.interval_seconds": "PAWNQUEUE_POLLING_INTERVAL_SECONDS",
        "polling.max_messages_per_poll": "PAWNQUEUE_POLLING_MAX_MESSAGES_PER_POLL",
        "polling.visibility_timeout_seconds": "PAWNQUEUE_POLLING_VISIBILITY_TIMEOUT",
        "polling.lease_refresh_interval_seconds": "PAWNQUEUE_POLLING_LEASE_REFRESH_INTERVAL",
        "polling.jitter_max_ms": "PAWNQUEUE_POLLING_JITTER_MAX_MS",
        "polling.max_delivery_count": "PAWNQUEUE_POLLING_MAX_DELIVERY_COUNT",
        "polling.claim_threads": "PAWNQUEUE_POLLING_CLAIM_THREADS",
        "concurrency.strategy": "PAWNQUEUE_CONCURRENCY_STRATEGY",
        "concurrency.csprng_verify.jitter_min_ms": "PAWNQUEUE_CSPRNG_JITTER_MIN_MS",
        "concurrency.csprng_verify.jitter_max_ms": "PAWNQUEUE_CSPRNG_JITTER_MAX_MS",
        "concurrency.csprng_verify.verify_retries": "PAWNQUEUE_CSPRNG_VERIFY_RETRIES",
        "concurrency.csprng_verify.verify_retry_delay_ms": "PAWNQUEUE_CSPRNG_RETRY_DELAY_MS",
        "concurrency.csprng_verify.consistent_list": "PAWNQUEUE_CSPRNG_CONSISTENT_LIST",
        "registry.heartbeat_interval_seconds": "PAWNQUEUE_REGISTRY_HEARTBEAT_INTERVAL",
        "publishing.max_payload_bytes": "PAWNQUEUE_PUBLISHING_MAX_PAYLOAD_BYTES",
        "publishing.batch_threads": "PAWNQUEUE_PUBLISHING_BATCH_THREADS",
    }
)

#: Dotted settings whose values are never shown (repr, str, errors, redacted_dict).
SECRET_FIELDS: frozenset[str] = frozenset({"s3.aws_access_key_id", "s3.aws_secret_access_key"})

_BOOL_WORDS: Mapping[str, bool] = MappingProxyType(
    {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}
)
_BUCKET_RE = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")

Validator = Callable[[Any, "attrs.Attribute[Any]", Any], None]


# --------------------------------------------------------------------------- validators


def _where(inst: Any, attr: attrs.Attribute[Any]) -> str:
    """Dotted name of ``attr`` on a config instance."""
    section = type(inst)._SECTION
    return f"{section}.{attr.name}" if section else attr.name


def _type_name(value: object) -> str:
    return "null" if value is None else type(value).__name__


def _number(*, gt: float | None = None, ge: float | None = None) -> Validator:
    """A finite float (ints are converted beforehand), with optional bounds."""

    def check(inst: Any, attr: attrs.Attribute[Any], value: Any) -> None:
        name = _where(inst, attr)
        if isinstance(value, bool) or not isinstance(value, float):
            raise ConfigError(name, f"must be a number, got {_type_name(value)}")
        if not math.isfinite(value):
            raise ConfigError(name, f"must be a finite number, got {value!r}")
        if gt is not None and not value > gt:
            raise ConfigError(name, f"must be > {gt:g}, got {value!r}")
        if ge is not None and not value >= ge:
            raise ConfigError(name, f"must be >= {ge:g}, got {value!r}")

    return check


def _integer(*, ge: int) -> Validator:
    """An int (not a bool, not a float) >= ``ge``."""

    def check(inst: Any, attr: attrs.Attribute[Any], value: Any) -> None:
        name = _where(inst, attr)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(name, f"must be an integer, got {_type_name(value)}")
        if value < ge:
            raise ConfigError(name, f"must be >= {ge}, got {value!r}")

    return check


def _boolean(inst: Any, attr: attrs.Attribute[Any], value: Any) -> None:
    if not isinstance(value, bool):
        raise ConfigError(_where(inst, attr), f"must be true or false, got {_type_name(value)}")


def _text(inst: Any, attr: attrs.Attribute[Any], value: Any) -> None:
    """A non-empty string; the value is never echoed (it may be a secret)."""
    name = _where(inst, attr)
    if not isinstance(value, str):
        raise ConfigError(name, f"must be a string, got {_type_name(value)}")
    if not value.strip():
        raise ConfigError(name, "must be a non-empty string")


def _choice(choices: tuple[str, ...]) -> Validator:
    def check(inst: Any, attr: attrs.Attribute[Any], value: Any) -> None:
        if value not in choices or not isinstance(value, str):
            allowed = ", ".join(repr(c) for c in choices)
            got = repr(value) if isinstance(value, str) else _type_name(value)
            raise ConfigError(_where(inst, attr), f"must be one of {allowed}, got {got}")

    return check


def _optional(check: Validator) -> Validator:
    def optional_check(inst: Any, attr: attrs.Attribute[Any], value: Any) -> None:
        if value is not None:
            check(inst, attr, value)

    return optional_check


def _endpoint(inst: Any, attr: attrs.Attribute[Any], value: Any) -> None:
    _text(inst, attr, value)
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        # Not echoed: a URL may carry user:password.
        raise ConfigError(_where(inst, attr), "must be an http:// or https:// URL with a host")
    if any(c.isspace() or ord(c) < 32 or ord(c) == 127 for c in value):
        raise ConfigError(
            _where(inst, attr),
            "must not contain spaces or control characters (percent-encode them)",
        )
    # A raw '/', '?' or '#' in a user name or password ends the URL's host part early:
    # the password would then be taken for a path (and shown unmasked), or for a port.
    if "@" in value[len(parts.scheme) + 3 + len(parts.netloc):]:
        raise ConfigError(
            _where(inst, attr),
            "has an '@' after a '/', '?' or '#': percent-encode those characters in the "
            "user name or password (%2F, %3F, %23)",
        )
    try:
        parts.port  # noqa: B018  (parses the port: ValueError if it is not a number)
    except ValueError:
        raise ConfigError(_where(inst, attr), "has a port that is not a number") from None


def _bucket(inst: Any, attr: attrs.Attribute[Any], value: Any) -> None:
    name = _where(inst, attr)
    if not isinstance(value, str):
        raise ConfigError(name, f"must be a string, got {_type_name(value)}")
    if not _BUCKET_RE.match(value) or ".." in value:
        raise ConfigError(
            name,
            "must be 3-63 characters of lowercase letters, digits, '.' and '-', "
            f"starting and ending with a letter or digit, got {value!r}",
        )


def _to_float(value: Any) -> Any:
    """Ints become floats; anything else is left for the validator to judge."""
    if isinstance(value, int) and not isinstance(value, bool):
        try:
            return float(value)
        except OverflowError:
            return value
    return value


def _to_path_str(value: Any) -> Any:
    """Absolute at load time, so child processes started elsewhere use the same store."""
    value = os.fspath(value) if isinstance(value, os.PathLike) else value
    return os.path.abspath(value) if isinstance(value, str) and value else value


def _mask_repr(value: object) -> str:
    return "None" if value is None else repr(_MASK)


#: the userinfo of URLs in a text: ``//user:password@`` up to the host
_USERINFO = re.compile(r"(?<=//)[^/?#\s]*@")


def redact_endpoint(text: str) -> str:
    """``http://user:password@host:9000/x`` -> ``http://***@host:9000/x``: an endpoint
    (or a text quoting one) fit to show. The one place credentials inside an endpoint
    URL are masked: reprs, ``describe()``, log lines and error messages all use it."""
    return _USERINFO.sub(_MASK + "@", text)


def _endpoint_repr(value: str | None) -> str:
    return repr(value if value is None else redact_endpoint(value))


# --------------------------------------------------------------------------- field helpers


def _float(default: float, doc: str, *, gt: float | None = 0.0) -> Any:
    return attrs.field(
        default=default,
        converter=_to_float,
        validator=_number(gt=gt),
        metadata={"kind": "float", "doc": doc},
    )


def _int(default: int, doc: str, *, ge: int = 1) -> Any:
    return attrs.field(
        default=default, validator=_integer(ge=ge), metadata={"kind": "int", "doc": doc}
    )


def _bool(default: bool, doc: str) -> Any:
    return attrs.field(default=default, validator=_boolean, metadata={"kind": "bool", "doc": doc})


def _secret(doc: str) -> Any:
    return attrs.field(
        default=None,
        validator=_optional(_text),
        repr=_mask_repr,
        metadata={"kind": "str", "doc": doc, "secret": True},
    )


def _instance_of(cls: type) -> Validator:
    def check(inst: Any, attr: attrs.Attribute[Any], value: Any) -> None:
        if not isinstance(value, cls):
            raise ConfigError(
                _where(inst, attr), f"must be a {cls.__name__}, got {_type_name(value)}"
            )

    return check


def _section(cls: type) -> dict[str, Any]:
    """The field arguments of a sub-section: its defaults, and it must be that class."""
    return {"factory": cls, "validator": _instance_of(cls), "metadata": _section_meta(cls)}


def _section_meta(cls: type) -> dict[str, Any]:
    return {"section": cls}


# --------------------------------------------------------------------------- classes


@attrs.frozen(kw_only=True)
class S3Config:
    """Connection to an S3-compatible object store."""

    _SECTION: ClassVar[str] = "s3"

    endpoint_url: str | None = attrs.field(
        default=None,
        validator=_optional(_endpoint),
        repr=_endpoint_repr,
        metadata={"kind": "str", "doc": "Endpoint URL; unset means AWS's default endpoint."},
    )
    bucket_name: str = attrs.field(
        validator=_bucket, metadata={"kind": "str", "doc": "Bucket holding all queue objects."}
    )
    aws_access_key_id: str | None = _secret(
        "Access key ID; with the secret key, or neither (boto3's default credential chain)."
    )
    aws_secret_access_key: str | None = _secret("Secret access key (never logged).")
    region_name: str = attrs.field(
        default="us-east-1", validator=_text, metadata={"kind": "str", "doc": "Region name."}
    )
    use_ssl: bool = _bool(True, "Use HTTPS when the endpoint URL does not say.")
    create_bucket: bool = _bool(False, "Create the bucket at setup if it is missing.")
    connect_timeout_seconds: float = _float(5.0, "botocore connect timeout.")
    read_timeout_seconds: float = _float(
        30.0, "botocore read timeout (SeaweedFS can be slow answering losing conditional PUTs)."
    )
    max_attempts: int = _int(5, "botocore total attempts per request (retries + 1).")
    max_pool_connections: int | None = attrs.field(
        default=None,
        validator=_optional(_integer(ge=1)),
        metadata={"kind": "int", "doc": "HTTP pool size; unset means sized from thread pools."},
    )
    addressing_style: AddressingStyle = attrs.field(
        default="auto",
        validator=_choice(_ADDRESSING_STYLES),
        metadata={"kind": "str", "doc": "S3 addressing style: auto, path or virtual."},
    )
    fast_path: bool = _bool(
        True,
        "Send the hot requests (PUT, GET, HEAD, DELETE, DeleteObjects, ListObjectsV2) "
        "signed by the library over urllib3 (about 3x less client CPU than boto3); "
        "only with an endpoint_url, path addressing and no proxy. false: boto3 for all.",
    )

    def __attrs_post_init__(self) -> None:
        if (self.aws_access_key_id is None) != (self.aws_secret_access_key is None):
            given, missing = (
                ("aws_access_key_id", "aws_secret_access_key")
                if self.aws_secret_access_key is None
                else ("aws_secret_access_key", "aws_access_key_id")
            )
            raise ConfigError(
                f"s3.{missing}",
                f"required when s3.{given} is set (give both, or neither to use "
                "boto3's default credential chain)",
            )


@attrs.frozen(kw_only=True)
class LocalConfig:
    """The embedded local store, used when there is no ``s3`` section."""

    _SECTION: ClassVar[str] = "local"

    path: str = attrs.field(
        default="./.pawnqueue",
        converter=_to_path_str,
        validator=_text,
        metadata={"kind": "str", "doc": "Directory of the local store (used without s3)."},
    )
    fsync: bool = _bool(True, "fsync files and directories on every write.")


#: The time fence of acks (Context.fence_margin): a lease counts as ours without asking
#: the server until ``visibility - max(FENCE_MARGIN_MIN_SECONDS, FENCE_MARGIN_FRACTION x
#: visibility)`` after it was written; the margin is the time an ack's DELETE may take to
#: land after the check (docs/guarantees.md, Fencing).
FENCE_MARGIN_MIN_SECONDS = 2.0
FENCE_MARGIN_FRACTION = 0.2
#: The least visibility timeout: it leaves a lease 1 s inside the fence after a refresh,
#: time for an ack to re-prove it and delete; at 2 s or less no ack could ever pass.
MIN_VISIBILITY_TIMEOUT_SECONDS = FENCE_MARGIN_MIN_SECONDS + 1.0


@attrs.frozen(kw_only=True)
class PollingConfig:
    """How consumers poll, lease and give up on messages."""

    _SECTION: ClassVar[str] = "polling"

    interval_seconds: float = _float(5.0, "Pause between polls that found nothing.")
    max_messages_per_poll: int = _int(10, "Messages claimed per poll at most.")
    visibility_timeout_seconds: float = _float(30.0, "How long a lease hides a message.")
    lease_refresh_interval_seconds: float = _float(
        10.0, "How often held leases are renewed; must be < the visibility timeout."
    )
    jitter_max_ms: int = _int(200, "Random extra delay added to each poll, at most.", ge=0)
    max_delivery_count: int = _int(5, "Deliveries before a failing message is dead-lettered.")
    claim_threads: int = _int(8, "Threads used to claim and fetch messages in parallel.")

    def __attrs_post_init__(self) -> None:
        if self.visibility_timeout_seconds < MIN_VISIBILITY_TIMEOUT_SECONDS:
            raise ConfigError(
                "polling.visibility_timeout_seconds",
                f"must be at least {MIN_VISIBILITY_TIMEOUT_SECONDS:g} s, got "
                f"{self.visibility_timeout_seconds:g}: an ack deletes without asking the "
                f"server only while the lease is younger than the timeout minus the "
                f"fence margin ({FENCE_MARGIN_MIN_SECONDS:g} s at least, for the DELETE "
                f"to land), so a shorter timeout leaves under 1 s to ack after a refresh "
                f"(none at {FENCE_MARGIN_MIN_SECONDS:g} s or less)",
            )
        if not self.lease_refresh_interval_seconds < self.visibility_timeout_seconds:
            raise ConfigError(
                "polling.lease_refresh_interval_seconds",
                f"must be < polling.visibility_timeout_seconds "
                f"({self.visibility_timeout_seconds:g}), got "
                f"{self.lease_refresh_interval_seconds:g} (its default is 10: lower it "
                "with a short visibility timeout, e.g. to a third of it)",
            )


@attrs.frozen(kw_only=True)
class CsprngVerifyConfig:
    """Tuning of the write-then-verify lease strategy (stores without conditional writes)."""

    _SECTION: ClassVar[str] = "concurrency.csprng_verify"

    jitter_min_ms: int = _int(
        100,
        "Least random wait before verifying; must exceed the worst one-way request delay "
        "(client to server or back; see docs/guarantees.md).",
        ge=0,
    )
    jitter_max_ms: int = _int(400, "Longest random wait before verifying (>= the minimum).", ge=0)
    verify_retries: int = _int(2, "Extra verification reads.", ge=0)
    verify_retry_delay_ms: int = _int(150, "Delay between verification reads.", ge=0)
    consistent_list: bool = _bool(
        True,
        "The store's LIST shows a write at once (AWS S3, SeaweedFS, MinIO): claim a poll's "
        "messages as one batch verified by listings; false: verify each claim by HEADs.",
    )

    def __attrs_post_init__(self) -> None:
        if self.jitter_max_ms < self.jitter_min_ms:
            raise ConfigError(
                "concurrency.csprng_verify.jitter_max_ms",
                f"must be >= concurrency.csprng_verify.jitter_min_ms ({self.jitter_min_ms}), "
                f"got {self.jitter_max_ms}",
            )


@attrs.frozen(kw_only=True)
class ConcurrencyConfig:
    """Which lease strategy to use; ``auto`` probes the store at setup."""

    _SECTION: ClassVar[str] = "concurrency"

    strategy: Strategy = attrs.field(
        default="auto",
        validator=_choice(_STRATEGIES),
        metadata={"kind": "str", "doc": "auto, conditional_write or csprng_verify."},
    )
    csprng_verify: CsprngVerifyConfig = attrs.field(
        factory=CsprngVerifyConfig,
        validator=_instance_of(CsprngVerifyConfig),
        metadata=_section_meta(CsprngVerifyConfig),
    )


@attrs.frozen(kw_only=True)
class RegistryConfig:
    """Producer/consumer registration."""

    _SECTION: ClassVar[str] = "registry"

    heartbeat_interval_seconds: float = _float(
        60.0,
        "How often a busy consumer re-reads the consumer registry (its rank among its "
        "peers, to spread claims), and how often a polling consumer rewrites its registry "
        "entry (`last_seen`, one PUT per interval at most). A consumer counts as alive in "
        "the rank while its entry was written within `LIVENESS_HEARTBEATS` = 3 intervals, "
        "by the server's clock (`pawn_queue_sync.queue.registry`); registering again "
        "revives it. A consumer that stops polling for that long (say, every handler "
        "thread busy for minutes) drops out of its peers' count until it polls again: "
        "that only narrows how claims are spread.",
    )


@attrs.frozen(kw_only=True)
class PublishingConfig:
    """Limits and parallelism of publishing."""

    _SECTION: ClassVar[str] = "publishing"

    max_payload_bytes: int = _int(
        1048576, "Largest accepted message: its JSON encoding (payload + ~200 bytes)."
    )
    batch_threads: int = _int(16, "Threads used to publish a batch in parallel.")


@attrs.frozen(kw_only=True)
class PawnQueueConfig:
    """The whole configuration; build it with :func:`load_config` or the builder."""

    _SECTION: ClassVar[str] = ""

    s3: S3Config | None = attrs.field(
        default=None,
        validator=_optional(_instance_of(S3Config)),
        metadata={"section": S3Config, "optional": True},
    )
    local: LocalConfig = attrs.field(**_section(LocalConfig))
    polling: PollingConfig = attrs.field(**_section(PollingConfig))
    concurrency: ConcurrencyConfig = attrs.field(**_section(ConcurrencyConfig))
    registry: RegistryConfig = attrs.field(**_section(RegistryConfig))
    publishing: PublishingConfig = attrs.field(**_section(PublishingConfig))

    @property
    def backend(self) -> Literal["s3", "local"]:
        """``"s3"`` with an s3 section, else ``"local"`` (the embedded store)."""
        return "local" if self.s3 is None else "s3"

    def to_dict(self) -> dict[str, Any]:
        """Every setting as plain data; ``load_config(cfg.to_dict()) == cfg``.

        Meant for handing the configuration to child processes, so it INCLUDES the
        credentials: never log it (use :meth:`redacted_dict`). All fields are explicit,
        so the environment of the process that loads it cannot change it.
        """
        return attrs.asdict(self, recurse=True)

    def redacted_dict(self) -> dict[str, Any]:
        """Like :meth:`to_dict`, with every set secret replaced by ``'***'`` (and the
        userinfo of the endpoint URL too)."""
        data = self.to_dict()
        for path in SECRET_FIELDS:
            *parents, leaf = path.split(".")
            node: Any = data
            for key in parents:
                node = node.get(key) if isinstance(node, dict) else None
            if isinstance(node, dict) and node.get(leaf) is not None:
                node[leaf] = _MASK
        if data.get("s3") and data["s3"].get("endpoint_url"):
            data["s3"]["endpoint_url"] = redact_endpoint(data["s3"]["endpoint_url"])
        return data


# --------------------------------------------------------------------------- schema


class _Marker(enum.Enum):
    PRESENT = "present"  # a section given as a mapping (so an s3 section "is present")


_PRESENT = _Marker.PRESENT
_Layer = dict[str, tuple[Any, str]]  # dotted path -> (value, where it came from)


def _walk_schema(
    cls: type, prefix: str, leaves: dict[str, attrs.Attribute[Any]], sections: dict[str, type]
) -> None:
    for field in attrs.fields(cls):
        path = prefix + field.name
        section = field.metadata.get("section")
        if section is not None:
            sections[path] = section
            _walk_schema(section, path + ".", leaves, sections)
        else:
            leaves[path] = field


_LEAVES: dict[str, attrs.Attribute[Any]] = {}
_SECTIONS: dict[str, type] = {}
_walk_schema(PawnQueueConfig, "", _LEAVES, _SECTIONS)
_OPTIONAL_SECTIONS = frozenset(
    f.name for f in attrs.fields(PawnQueueConfig) if f.metadata.get("optional")
)
if not set(ENV_VARS) <= set(_LEAVES):  # pragma: no cover - guards edits of the table
    raise RuntimeError(f"ENV_VARS names unknown settings: {set(ENV_VARS) - set(_LEAVES)}")
if {p for p, f in _LEAVES.items() if f.metadata.get("secret")} != SECRET_FIELDS:  # pragma: no cover
    raise RuntimeError("SECRET_FIELDS does not match the fields marked secret")


def _children(prefix: str) -> list[str]:
    """Names directly under a section ('' for the top level)."""
    depth = prefix.count(".")
    known = list(_LEAVES) + list(_SECTIONS)
    return sorted(p[len(prefix) :] for p in known if p.startswith(prefix) and p.count(".") == depth)


def _unknown_key_error(unknown: list[str], origin: str) -> ConfigError:
    first = unknown[0]
    prefix, _, key = first.rpartition(".")
    siblings = _children(prefix + "." if prefix else "")
    close = difflib.get_close_matches(key, siblings, n=1)
    hint = f"did you mean {close[0]!r}?" if close else "known keys: " + ", ".join(siblings)
    more = f"; also unknown: {', '.join(unknown[1:])}" if len(unknown) > 1 else ""
    return ConfigError(first, f"unknown key ({origin}); {hint}{more}")


def _flatten(data: Mapping[Any, Any], origin: str) -> _Layer:
    """Turn a nested mapping into a layer, rejecting unknown keys."""
    out: _Layer = {}
    unknown: list[str] = []

    def walk(mapping: Mapping[Any, Any], prefix: str) -> None:
        for key, value in mapping.items():
            if not isinstance(key, str):
                unknown.append(f"{prefix}{key!r}")
                continue
            path = prefix + key
            if path in _SECTIONS:
                cls = _SECTIONS[path]
                if isinstance(value, cls):  # a config object inside a dict
                    value = attrs.asdict(value, recurse=True)
                if value is None:  # `s3: null` = no s3; `polling:` with nothing = defaults
                    out[path] = (None if path in _OPTIONAL_SECTIONS else _PRESENT, origin)
                elif isinstance(value, Mapping):
                    out[path] = (_PRESENT, origin)
                    walk(value, path + ".")
                else:
                    raise ConfigError(
                        path, f"must be a mapping, got {_type_name(value)} ({origin})"
                    )
            elif path in _LEAVES:
                out[path] = (value, origin)
            else:
                unknown.append(path)

    walk(data, "")
    if unknown:
        raise _unknown_key_error(sorted(unknown), origin)
    return out


def _parse_env_value(path: str, name: str, raw: str) -> Any:
    """Convert one environment string to its field's type."""
    field = _LEAVES[path]
    kind = field.metadata["kind"]
    shown = "" if path in SECRET_FIELDS else f"={raw!r}"
    if kind == "bool":
        word = raw.strip().lower()
        if word not in _BOOL_WORDS:
            raise ConfigError(
                path, f"{name}{shown} is not a boolean (use true/false, 1/0 or yes/no)"
            )
        return _BOOL_WORDS[word]
    if kind == "int":
        try:
            return int(raw.strip(), 10)
        except ValueError:
            raise ConfigError(path, f"{name}{shown} is not an integer") from None
    if kind == "float":
        try:
            return float(raw.strip())
        except ValueError:
            raise ConfigError(path, f"{name}{shown} is not a number") from None
    return raw


def _env_layer(env: Mapping[str, str]) -> _Layer:
    """The ``PAWNQUEUE_*`` variables as a layer; empty values count as unset."""
    out: _Layer = {}
    for path, name in ENV_VARS.items():
        raw = env.get(name)
        if raw is None or not raw.strip():
            continue
        out[path] = (_parse_env_value(path, name, raw), f"from environment variable {name}")
    return out


def _merge(layers: Iterable[_Layer]) -> _Layer:
    """Merge layers given lowest precedence first."""
    merged: _Layer = {}
    for layer in layers:
        for path, (value, origin) in layer.items():
            if path in _SECTIONS and value is None:  # explicit "no such section"
                for below in [p for p in merged if p.startswith(path + ".")]:
                    del merged[below]
            else:
                parts = path.split(".")
                for i in range(1, len(parts)):
                    parent = ".".join(parts[:i])
                    if merged.get(parent, (None,))[0] is not _PRESENT:
                        merged[parent] = (_PRESENT, origin)
            merged[path] = (value, origin)
    return merged


def _build_section(cls: type, prefix: str, merged: _Layer) -> Any:
    kwargs: dict[str, Any] = {}
    for field in attrs.fields(cls):
        path = prefix + field.name
        section = field.metadata.get("section")
        if section is None:
            if path in merged:
                kwargs[field.name] = merged[path][0]
        elif field.metadata.get("optional"):
            if merged.get(path, (None,))[0] is _PRESENT:
                if f"{path}.bucket_name" not in merged:
                    raise ConfigError(
                        f"{path}.bucket_name",
                        f"required when an {path} section is given ({merged[path][1]}); "
                        f"omit {path} entirely to use the local store",
                    )
                kwargs[field.name] = _build_section(section, path + ".", merged)
            else:
                kwargs[field.name] = None
        else:
            kwargs[field.name] = _build_section(section, path + ".", merged)
    return cls(**kwargs)


def _build(layers: Iterable[_Layer]) -> PawnQueueConfig:
    """Merge layers (lowest precedence first) and validate the result."""
    merged = _merge(layers)
    try:
        return _build_section(PawnQueueConfig, "", merged)
    except ConfigError as exc:
        origin = merged.get(exc.field, (None, None))[1]
        if origin is None or origin in str(exc):
            raise
        problem = str(exc)[len(exc.field) + 2 :]
        raise ConfigError(exc.field, f"{problem} ({origin})") from None


def _read_yaml(path: str | os.PathLike[str]) -> Mapping[Any, Any]:
    """Read a YAML mapping; an empty file is an empty mapping."""
    where = os.fspath(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(where, "config file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(where, f"cannot read config file: {type(exc).__name__}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        # str(exc) quotes the offending line, which may hold a secret: keep only the place.
        mark = getattr(exc, "problem_mark", None)
        place = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or type(exc).__name__
        raise ConfigError(where, f"invalid YAML{place}: {problem}") from None
    if data is None:
        return {}
    if not isinstance(data, Mapping):
        raise ConfigError(where, f"must contain a YAML mapping, got {_type_name(data)}")
    return data


def load_config(
    source: str | os.PathLike[str] | Mapping[str, Any] | PawnQueueConfig | None = None,
    *,
    env: Mapping[str, str] | None = None,
) -> PawnQueueConfig:
    """Build a validated :class:`PawnQueueConfig`.

    - a :class:`PawnQueueConfig` is returned as is;
    - a path: the YAML file, overridden by the environment;
    - a dict: its values, with the environment filling only what it lacks
      (``s3: None`` in the dict means "no s3", whatever the environment says);
    - ``None``: the environment over the defaults.

    ``env`` defaults to ``os.environ``. The caller's dict is never modified.
    """
    if isinstance(source, PawnQueueConfig):
        return source
    env_layer = _env_layer(os.environ if env is None else env)
    if source is None:
        return _build([env_layer])
    if isinstance(source, (str, os.PathLike)):
        where = f"from file {os.fspath(source)!r}"
        return _build([_flatten(_read_yaml(source), where), env_layer])
    if isinstance(source, Mapping):
        return _build([env_layer, _flatten(source, "from the dict passed to load_config")])
    raise TypeError(
        "load_config() takes a path, a dict, a PawnQueueConfig or None, "
        f"not {type(source).__name__}"
    )


# --------------------------------------------------------------------------- builder


class PawnQueueBuilder:
    """Fluent configuration, with pawn-queue's method names.

    Values set here are explicit and beat the environment; :meth:`from_env` only fills
    what is not set, whenever it is called. Without :meth:`from_env` the environment is
    not read. Without :meth:`s3` (or ``PAWNQUEUE_S3_*``) the local store is used.
    """

    _ORIGIN = "set on the builder"

    def __init__(self) -> None:
        self._values: dict[str, Any] = {}
        self._env: dict[str, str] | None = None

    def _set(self, section: str, **values: Any) -> PawnQueueBuilder:
        for key, value in values.items():
            if value is not None:
                self._values[f"{section}.{key}"] = value
        return self

    def s3(
        self,
        *,
        endpoint_url: str | None = None,
        bucket_name: str | None = None,
        access_key: str | None = None,
        secret_key: str | None = None,
        region_name: str | None = None,
        use_ssl: bool | None = None,
        create_bucket: bool | None = None,
        connect_timeout_seconds: float | None = None,
        read_timeout_seconds: float | None = None,
        max_attempts: int | None = None,
        max_pool_connections: int | None = None,
        addressing_style: AddressingStyle | None = None,
        fast_path: bool | None = None,
    ) -> PawnQueueBuilder:
        """Use an S3-compatible store (calling this at all selects the s3 backend)."""
        self._values["s3"] = _PRESENT
        return self._set(
            "s3",
            endpoint_url=endpoint_url,
            bucket_name=bucket_name,
            aws_access_key_id=access_key,
            aws_secret_access_key=secret_key,
            region_name=region_name,
            use_ssl=use_ssl,
            create_bucket=create_bucket,
            connect_timeout_seconds=connect_timeout_seconds,
            read_timeout_seconds=read_timeout_seconds,
            max_attempts=max_attempts,
            max_pool_connections=max_pool_connections,
            addressing_style=addressing_style,
            fast_path=fast_path,
        )

    def local(
        self, *, path: str | os.PathLike[str] | None = None, fsync: bool | None = None
    ) -> PawnQueueBuilder:
        """Settings of the embedded local store."""
        return self._set("local", path=path, fsync=fsync)

    def polling(
        self,
        *,
        interval_seconds: float | None = None,
        max_messages_per_poll: int | None = None,
        visibility_timeout_seconds: float | None = None,
        lease_refresh_interval_seconds: float | None = None,
        jitter_max_ms: int | None = None,
        max_delivery_count: int | None = None,
        claim_threads: int | None = None,
    ) -> PawnQueueBuilder:
        """Polling, leasing and dead-lettering."""
        return self._set(
            "polling",
            interval_seconds=interval_seconds,
            max_messages_per_poll=max_messages_per_poll,
            visibility_timeout_seconds=visibility_timeout_seconds,
            lease_refresh_interval_seconds=lease_refresh_interval_seconds,
            jitter_max_ms=jitter_max_ms,
            max_delivery_count=max_delivery_count,
            claim_threads=claim_threads,
        )

    def concurrency(
        self,
        *,
        strategy: Strategy | None = None,
        jitter_min_ms: int | None = None,
        jitter_max_ms: int | None = None,
        verify_retries: int | None = None,
        verify_retry_delay_ms: int | None = None,
        consistent_list: bool | None = None,
    ) -> PawnQueueBuilder:
        """Lease strategy and csprng_verify tuning."""
        self._set("concurrency", strategy=strategy)
        return self._set(
            "concurrency.csprng_verify",
            jitter_min_ms=jitter_min_ms,
            jitter_max_ms=jitter_max_ms,
            verify_retries=verify_retries,
            verify_retry_delay_ms=verify_retry_delay_ms,
            consistent_list=consistent_list,
        )

    def registry(self, *, heartbeat_interval_seconds: float | None = None) -> PawnQueueBuilder:
        """How often a busy consumer re-reads the consumer registry."""
        return self._set("registry", heartbeat_interval_seconds=heartbeat_interval_seconds)

    def publishing(
        self, *, max_payload_bytes: int | None = None, batch_threads: int | None = None
    ) -> PawnQueueBuilder:
        """Publishing limits and parallelism."""
        return self._set(
            "publishing", max_payload_bytes=max_payload_bytes, batch_threads=batch_threads
        )

    def from_env(self, env: Mapping[str, str] | None = None) -> PawnQueueBuilder:
        """Fill settings not set on the builder from ``env`` (default ``os.environ``, read now)."""
        source = os.environ if env is None else env
        self._env = {name: source[name] for name in ENV_VARS.values() if name in source}
        return self

    def build_config(self) -> PawnQueueConfig:
        """The validated configuration."""
        layers: list[_Layer] = []
        if self._env is not None:
            layers.append(_env_layer(self._env))
        layers.append({path: (value, self._ORIGIN) for path, value in self._values.items()})
        return _build(layers)

    def build(self) -> PawnQueue:
        """A :class:`~pawn_queue_sync.queue.core.PawnQueue` (not yet set up)."""
        from .queue.core import PawnQueue

        return PawnQueue(self.build_config())


# --------------------------------------------------------------------------- docs


def _render_default(field: attrs.Attribute[Any]) -> str:
    if field.default is attrs.NOTHING:
        return "required with S3"
    if field.default is None:
        return "unset"
    if isinstance(field.default, bool):
        return f"`{str(field.default).lower()}`"
    return f"`{field.default}`"


def dump_env_docs() -> str:
    """A markdown table of :data:`ENV_VARS`, with defaults and meanings."""
    lines = [
        "| Variable | Setting | Default | Meaning |",
        "|---|---|---|---|",
    ]
    for path, name in ENV_VARS.items():
        field = _LEAVES[path]
        doc = field.metadata.get("doc", "")
        lines.append(f"| `{name}` | `{path}` | {_render_default(field)} | {doc} |")
    lines += [
        "",
        "Booleans accept `true`/`false`, `1`/`0`, `yes`/`no` (any case). Empty variables "
        "count as unset. Setting any `PAWNQUEUE_S3_*` variable selects the S3 backend, "
        "which then needs `PAWNQUEUE_S3_BUCKET_NAME`. Explicit values (a dict passed to "
        "`load_config`, or the builder) beat the environment, which beats the YAML file.",
    ]
    return "\n".join(lines) + "\n"
