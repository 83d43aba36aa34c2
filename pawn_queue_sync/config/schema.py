"""The configuration schema: one frozen attrs class per section, each setting declared once.

A field's declaration carries all that the rest of the package derives from it: its
type and bounds (validators), its default, its meaning (``doc``, shown by
:func:`~pawn_queue_sync.config.dump_env_docs`), its ``PAWNQUEUE_*`` variable (``env``),
whether it is a secret, and its keyword on :class:`~pawn_queue_sync.config.PawnQueueBuilder`
where pawn-queue's builder spells it otherwise (``builder``). The loader, the builder,
:data:`ENV_VARS`, :data:`SECRET_FIELDS` and the environment docs are all read from here,
so a new setting is one field (plus its row in docs/configuration.md, which a test checks).

The shape (YAML keys, field names, variable names) is pawn-queue 0.1.3's, plus a few
settings of our own; that is why four durations are in milliseconds (``*_ms``, pawn-queue's
names), and every other one is in seconds (``*_seconds``).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, ClassVar, Literal

import attrs

from ..errors import ConfigError
from . import validators as v

Strategy = Literal["auto", "conditional_write", "csprng_verify"]
AddressingStyle = Literal["auto", "path", "virtual"]

_STRATEGIES: tuple[str, ...] = ("auto", "conditional_write", "csprng_verify")
_ADDRESSING_STYLES: tuple[str, ...] = ("auto", "path", "virtual")


# --------------------------------------------------------------------------- classes


@attrs.frozen(kw_only=True)
class S3Config:
    """Connection to an S3-compatible object store."""

    _SECTION: ClassVar[str] = "s3"

    endpoint_url: str | None = attrs.field(
        default=None,
        validator=v.optional(v.endpoint),
        repr=v.endpoint_repr,
        metadata=v.meta(
            "str", "Endpoint URL; unset means AWS's default endpoint.",
            env="PAWNQUEUE_S3_ENDPOINT_URL",
        ),
    )
    bucket_name: str = attrs.field(
        validator=v.bucket,
        metadata=v.meta(
            "str", "Bucket holding all queue objects.", env="PAWNQUEUE_S3_BUCKET_NAME"
        ),
    )
    aws_access_key_id: str | None = v.secret_field(
        "Access key ID; with the secret key, or neither (boto3's default credential chain).",
        env="PAWNQUEUE_S3_ACCESS_KEY",
        builder="access_key",
    )
    aws_secret_access_key: str | None = v.secret_field(
        "Secret access key (never logged).", env="PAWNQUEUE_S3_SECRET_KEY", builder="secret_key"
    )
    region_name: str = attrs.field(
        default="us-east-1",
        validator=v.text,
        metadata=v.meta("str", "Region name.", env="PAWNQUEUE_S3_REGION"),
    )
    use_ssl: bool = v.bool_field(
        True, "Use HTTPS when the endpoint URL does not say.", env="PAWNQUEUE_S3_USE_SSL"
    )
    create_bucket: bool = v.bool_field(
        False, "Create the bucket at setup if it is missing.", env="PAWNQUEUE_S3_CREATE_BUCKET"
    )
    connect_timeout_seconds: float = v.float_field(5.0, "botocore connect timeout.")
    read_timeout_seconds: float = v.float_field(
        30.0, "botocore read timeout (SeaweedFS can be slow answering losing conditional PUTs)."
    )
    max_attempts: int = v.int_field(5, "botocore total attempts per request (retries + 1).")
    max_pool_connections: int | None = attrs.field(
        default=None,
        validator=v.optional(v.integer(ge=1)),
        metadata=v.meta("int", "HTTP pool size; unset means sized from thread pools."),
    )
    addressing_style: AddressingStyle = attrs.field(
        default="auto",
        validator=v.choice(_ADDRESSING_STYLES),
        metadata=v.meta("str", "S3 addressing style: auto, path or virtual."),
    )
    fast_path: bool = v.bool_field(
        True,
        "Send the hot requests (PUT, GET, HEAD, DELETE, DeleteObjects, ListObjectsV2) "
        "signed by the library over urllib3 (about 3x less client CPU than boto3); "
        "only with an endpoint_url, path addressing and no proxy. false: boto3 for all.",
        env="PAWNQUEUE_S3_FAST_PATH",
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
        converter=v.to_path_str,
        validator=v.text,
        metadata=v.meta(
            "str", "Directory of the local store (used without s3).", env="PAWNQUEUE_LOCAL_PATH"
        ),
    )
    fsync: bool = v.bool_field(True, "fsync files and directories on every write.")


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

    interval_seconds: float = v.float_field(
        5.0, "Pause between polls that found nothing.", env="PAWNQUEUE_POLLING_INTERVAL_SECONDS"
    )
    max_messages_per_poll: int = v.int_field(
        10, "Messages claimed per poll at most.", env="PAWNQUEUE_POLLING_MAX_MESSAGES_PER_POLL"
    )
    visibility_timeout_seconds: float = v.float_field(
        30.0, "How long a lease hides a message.", env="PAWNQUEUE_POLLING_VISIBILITY_TIMEOUT"
    )
    lease_refresh_interval_seconds: float = v.float_field(
        10.0,
        "How often held leases are renewed; must be < the visibility timeout.",
        env="PAWNQUEUE_POLLING_LEASE_REFRESH_INTERVAL",
    )
    jitter_max_ms: int = v.int_field(
        200,
        "Random extra delay added to each poll, at most.",
        ge=0,
        env="PAWNQUEUE_POLLING_JITTER_MAX_MS",
    )
    max_delivery_count: int = v.int_field(
        5,
        "Deliveries before a failing message is dead-lettered.",
        env="PAWNQUEUE_POLLING_MAX_DELIVERY_COUNT",
    )
    claim_threads: int = v.int_field(
        8,
        "Threads used to claim and fetch messages in parallel.",
        env="PAWNQUEUE_POLLING_CLAIM_THREADS",
    )
    max_segments_held: int = v.int_field(
        4,
        "Packed topics: segments with messages still to hand out that a consumer holds per "
        "topic at most (a segment whose messages are all out does not count).",
        env="PAWNQUEUE_POLLING_MAX_SEGMENTS_HELD",
    )

    def __attrs_post_init__(self) -> None:
        if self.visibility_timeout_seconds < MIN_VISIBILITY_TIMEOUT_SECONDS:
            raise ConfigError(
                "polling.visibility_timeout_seconds",
                f"must be at least {MIN_VISIBILITY_TIMEOUT_SECONDS:g} s, got "
                f"{self.visibility_timeout_seconds!r}: an ack deletes without asking the "
                f"server only while the lease is younger than the timeout minus the "
                f"fence margin ({FENCE_MARGIN_MIN_SECONDS:g} s at least, for the DELETE "
                f"to land), so a shorter timeout leaves under 1 s to ack after a refresh "
                f"(none at {FENCE_MARGIN_MIN_SECONDS:g} s or less)",
            )
        if not self.lease_refresh_interval_seconds < self.visibility_timeout_seconds:
            raise ConfigError(
                "polling.lease_refresh_interval_seconds",
                f"must be < polling.visibility_timeout_seconds "
                f"({self.visibility_timeout_seconds!r}), got "
                f"{self.lease_refresh_interval_seconds!r} (its default is 10: lower it "
                "with a short visibility timeout, e.g. to a third of it)",
            )


@attrs.frozen(kw_only=True)
class CsprngVerifyConfig:
    """Tuning of the write-then-verify lease strategy (stores without conditional writes)."""

    _SECTION: ClassVar[str] = "concurrency.csprng_verify"

    jitter_min_ms: int = v.int_field(
        100,
        "Least random wait before verifying; must exceed the worst one-way request delay "
        "(client to server or back; see docs/guarantees.md).",
        ge=0,
        env="PAWNQUEUE_CSPRNG_JITTER_MIN_MS",
    )
    jitter_max_ms: int = v.int_field(
        400,
        "Longest random wait before verifying (>= the minimum).",
        ge=0,
        env="PAWNQUEUE_CSPRNG_JITTER_MAX_MS",
    )
    verify_retries: int = v.int_field(
        2, "Extra verification reads.", ge=0, env="PAWNQUEUE_CSPRNG_VERIFY_RETRIES"
    )
    verify_retry_delay_ms: int = v.int_field(
        150, "Delay between verification reads.", ge=0, env="PAWNQUEUE_CSPRNG_RETRY_DELAY_MS"
    )
    consistent_list: bool = v.bool_field(
        True,
        "The store's LIST shows a write at once (AWS S3, SeaweedFS, MinIO): claim a poll's "
        "messages as one batch verified by listings; false: verify each claim by HEADs.",
        env="PAWNQUEUE_CSPRNG_CONSISTENT_LIST",
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
        validator=v.choice(_STRATEGIES),
        metadata=v.meta(
            "str", "auto, conditional_write or csprng_verify.", env="PAWNQUEUE_CONCURRENCY_STRATEGY"
        ),
    )
    csprng_verify: CsprngVerifyConfig = attrs.field(
        factory=CsprngVerifyConfig,
        validator=v.instance_of(CsprngVerifyConfig),
        metadata=v.section_meta(CsprngVerifyConfig),
    )


@attrs.frozen(kw_only=True)
class RegistryConfig:
    """Producer/consumer registration."""

    _SECTION: ClassVar[str] = "registry"

    heartbeat_interval_seconds: float = v.float_field(
        60.0,
        "How often a busy consumer re-reads the consumer registry (its rank among its "
        "peers, to spread claims), and how often a polling consumer rewrites its registry "
        "entry (`last_seen`, one PUT per interval at most). A consumer counts as alive in "
        "the rank while its entry was written within `LIVENESS_HEARTBEATS` = 3 intervals, "
        "by the server's clock (`pawn_queue_sync.queue.registry`); registering again "
        "revives it. A consumer that stops polling for that long (say, every handler "
        "thread busy for minutes) drops out of its peers' count until it polls again: "
        "that only narrows how claims are spread.",
        env="PAWNQUEUE_REGISTRY_HEARTBEAT_INTERVAL",
    )


#: Room left in a segment for its header line beside one largest message.
SEGMENT_HEADER_ROOM = 4096
#: publishing.max_segment_bytes by default (grown to fit the largest accepted message).
DEFAULT_SEGMENT_BYTES = 8388608
#: The largest ``publishing.max_delay_seconds`` accepted: 10 years (a delayed key's
#: delay in milliseconds then has 12 digits at most).
MAX_DELAY_CEILING_SECONDS = 315360000.0


@attrs.frozen(kw_only=True)
class PublishingConfig:
    """Limits and parallelism of publishing."""

    _SECTION: ClassVar[str] = "publishing"

    max_payload_bytes: int = v.int_field(
        1048576,
        "Largest accepted message: its JSON encoding (payload + ~200 bytes).",
        env="PAWNQUEUE_PUBLISHING_MAX_PAYLOAD_BYTES",
    )
    batch_threads: int = v.int_field(
        16, "Threads used to publish a batch in parallel.", env="PAWNQUEUE_PUBLISHING_BATCH_THREADS"
    )
    max_segment_messages: int = v.int_field(
        1000,
        "Packed topics: most messages in one segment object (1 to 100000).",
        le=100000,
        env="PAWNQUEUE_PUBLISHING_MAX_SEGMENT_MESSAGES",
    )
    max_segment_bytes: int = v.int_field(
        DEFAULT_SEGMENT_BYTES,
        "Packed topics: largest segment object in bytes; at least max_payload_bytes + 4096 "
        "(the default grows to that).",
        env="PAWNQUEUE_PUBLISHING_MAX_SEGMENT_BYTES",
    )
    linger_ms: int = v.int_field(
        5,
        "Packed topics: how long publish() collects messages from other threads into one "
        "segment at most (0 to 10000); a lone caller does not wait.",
        ge=0,
        le=10000,
        env="PAWNQUEUE_PUBLISHING_LINGER_MS",
    )
    max_delay_seconds: float = v.float_field(
        604800.0,
        "Longest delay of a delayed message (publish(delay_seconds=...), retry(delay_seconds="
        "...)), in seconds: 7 days by default, at most 10 years.",
        env="PAWNQUEUE_PUBLISHING_MAX_DELAY_SECONDS",
    )
    dedup_window_seconds: float = v.float_field(
        300.0,
        "How long, in seconds, a publish(dedup_id=...) makes later publishes of the same "
        "dedup id on the topic return the first message's id instead of writing (> 0; "
        "300 as SQS FIFO; 7 days and more allowed).",
        env="PAWNQUEUE_PUBLISHING_DEDUP_WINDOW_SECONDS",
    )

    def __attrs_post_init__(self) -> None:
        if self.max_delay_seconds > MAX_DELAY_CEILING_SECONDS:
            raise ConfigError(
                "publishing.max_delay_seconds",
                f"must be <= {MAX_DELAY_CEILING_SECONDS:.0f} (10 years), got "
                f"{self.max_delay_seconds!r}",
            )
        least = self.max_payload_bytes + SEGMENT_HEADER_ROOM
        if self.max_segment_bytes == DEFAULT_SEGMENT_BYTES < least:
            # A plain-topic setup that raised max_payload_bytes past 8 MiB keeps working:
            # the default segment limit follows it (frozen: set once, here).
            object.__setattr__(self, "max_segment_bytes", least)
        elif self.max_segment_bytes < least:
            raise ConfigError(
                "publishing.max_segment_bytes",
                f"must be >= publishing.max_payload_bytes + {SEGMENT_HEADER_ROOM} ({least}), "
                f"got {self.max_segment_bytes}: a segment holds its header and at least one "
                "message of the largest accepted size",
            )


@attrs.frozen(kw_only=True)
class PawnQueueConfig:
    """The whole configuration; build it with :func:`load_config` or the builder."""

    _SECTION: ClassVar[str] = ""

    s3: S3Config | None = attrs.field(
        default=None,
        validator=v.optional(v.instance_of(S3Config)),
        metadata={"section": S3Config, "optional": True},
    )
    local: LocalConfig = attrs.field(**v.section_field(LocalConfig))
    polling: PollingConfig = attrs.field(**v.section_field(PollingConfig))
    concurrency: ConcurrencyConfig = attrs.field(**v.section_field(ConcurrencyConfig))
    registry: RegistryConfig = attrs.field(**v.section_field(RegistryConfig))
    publishing: PublishingConfig = attrs.field(**v.section_field(PublishingConfig))

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
                node[leaf] = v.MASK
        if data.get("s3") and data["s3"].get("endpoint_url"):
            data["s3"]["endpoint_url"] = v.redact_endpoint(data["s3"]["endpoint_url"])
        return data


# --------------------------------------------------------------------------- the tables


def _walk(
    cls: type, prefix: str, leaves: dict[str, attrs.Attribute[Any]], sections: dict[str, type]
) -> None:
    for field in attrs.fields(cls):
        path = prefix + field.name
        section = field.metadata.get("section")
        if section is not None:
            sections[path] = section
            _walk(section, path + ".", leaves, sections)
        else:
            leaves[path] = field


def _tables() -> tuple[dict[str, attrs.Attribute[Any]], dict[str, type]]:
    leaves: dict[str, attrs.Attribute[Any]] = {}
    sections: dict[str, type] = {}
    _walk(PawnQueueConfig, "", leaves, sections)
    return leaves, sections


_leaves, _sections = _tables()
#: Every setting, in declaration order: dotted path -> its attrs field.
LEAVES: Mapping[str, attrs.Attribute[Any]] = MappingProxyType(_leaves)
#: Every section: dotted path -> its class (``concurrency.csprng_verify`` included).
SECTIONS: Mapping[str, type] = MappingProxyType(_sections)
#: Sections that may be absent (``s3``: absent means the local store).
OPTIONAL_SECTIONS: frozenset[str] = frozenset(
    f.name for f in attrs.fields(PawnQueueConfig) if f.metadata.get("optional")
)

#: The environment variables: dotted setting -> variable name, in declaration order.
#: Used for loading and for :func:`~pawn_queue_sync.config.dump_env_docs`.
ENV_VARS: Mapping[str, str] = MappingProxyType(
    {path: field.metadata["env"] for path, field in LEAVES.items() if "env" in field.metadata}
)

#: Dotted settings whose values are never shown (repr, str, errors, redacted_dict).
SECRET_FIELDS: frozenset[str] = frozenset(
    path for path, field in LEAVES.items() if field.metadata.get("secret")
)
