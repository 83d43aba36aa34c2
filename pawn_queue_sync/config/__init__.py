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

The package's modules, bottom-up: :mod:`.validators` (how a setting is declared and
checked; secret masking), :mod:`.schema` (the classes: every setting declared once, with
its variable, its doc and its builder keyword), :mod:`.loader` (sources, precedence),
:mod:`.builder` (setters generated from the schema), :mod:`.envdocs`. This module is the
public API: import from ``pawn_queue_sync.config``.
"""

from __future__ import annotations

from .builder import PawnQueueBuilder
from .envdocs import dump_env_docs
from .loader import load_config
from .schema import (
    ENV_VARS,
    FENCE_MARGIN_FRACTION,
    FENCE_MARGIN_MIN_SECONDS,
    MIN_VISIBILITY_TIMEOUT_SECONDS,
    SECRET_FIELDS,
    AddressingStyle,
    ConcurrencyConfig,
    CsprngVerifyConfig,
    LocalConfig,
    PawnQueueConfig,
    PollingConfig,
    PublishingConfig,
    RegistryConfig,
    S3Config,
    Strategy,
)
from .validators import redact_endpoint

__all__ = [
    "ENV_VARS",
    "FENCE_MARGIN_FRACTION",
    "FENCE_MARGIN_MIN_SECONDS",
    "MIN_VISIBILITY_TIMEOUT_SECONDS",
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
