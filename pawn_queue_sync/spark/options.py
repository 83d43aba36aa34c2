"""The ``pawnqueue`` data source's options: their names, which ones each mode takes, and
how their values are read.

The credential options are named so that Spark's default ``spark.redaction.regex``
(``secret|password|token|access[.]?key``) hides their values in plans; names Spark
would show unredacted (``aws_access_key_id``) are refused with a pointer, and so are
unknown names (a misspelt credential option would be shown). Errors name an option,
never its value.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping

from ..errors import ConfigError

__all__ = [
    "BOOL_OPTIONS",
    "CONFIG_PATH_OPTION",
    "CONNECTION_OPTIONS",
    "UNREDACTED_OPTIONS",
    "check_options",
    "int_option",
]

#: Data source options that are connection settings: option -> dotted config path.
CONNECTION_OPTIONS: Mapping[str, str] = {
    "endpointUrl": "s3.endpoint_url",
    "bucketName": "s3.bucket_name",
    "regionName": "s3.region_name",
    "accessKey": "s3.aws_access_key_id",
    "secretKey": "s3.aws_secret_access_key",
    "useSsl": "s3.use_ssl",
    "addressingStyle": "s3.addressing_style",
    "fastPath": "s3.fast_path",
    "localPath": "local.path",
}
#: Connection settings given as ``'true'``/``'false'``.
BOOL_OPTIONS = frozenset({"s3.use_ssl", "s3.fast_path"})
#: Option naming a YAML configuration file (read on the driver, where plans are made).
CONFIG_PATH_OPTION = "configPath"
#: Option names that would show a credential in plans: refused with a pointer.
UNREDACTED_OPTIONS = {"aws_access_key_id": "accessKey", "aws_secret_access_key": "secretKey",
                      "access_key": "accessKey", "secret_key": "secretKey"}

_COMMON_OPTIONS = ("topic", "path", CONFIG_PATH_OPTION, *CONNECTION_OPTIONS)
_MODE_OPTIONS = {
    "read": ("section", "numPartitions", "readThreads"),
    "stream": ("section", "numPartitions", "readThreads", "maxMessagesPerBatch"),
    "write": ("payloadColumn", "idColumn", "createdAtColumn", "batchSize", "publishThreads",
              "producerName"),
}


def check_options(options: Mapping[str, str], mode: str) -> None:
    """Refuse options this mode does not know (names only are shown, never values)."""
    known = [*_COMMON_OPTIONS, *_MODE_OPTIONS[mode]]
    by_lower = {k.lower(): k for k in known}
    for name in options:
        if name in UNREDACTED_OPTIONS:
            good = UNREDACTED_OPTIONS[name]
            raise ConfigError(name, f"use the option {good!r} instead: Spark shows {name!r} "
                              "in plans, unredacted")
        if name not in by_lower:
            close = difflib.get_close_matches(name, list(by_lower), n=1)
            hint = f"; did you mean {by_lower[close[0]]!r}?" if close else ""
            raise ConfigError(name, f"unknown option for a pawnqueue {mode}{hint} "
                              f"(known: {', '.join(known)})")


def int_option(options: Mapping[str, str], name: str, default: int, minimum: int = 1) -> int:
    """The integer option ``name`` (looked up lower-cased), ``default`` when unset."""
    raw = options.get(name.lower())
    if raw is None:
        return default
    try:
        value = int(str(raw).strip())
    except ValueError:
        raise ConfigError(name, f"option must be an integer, got {raw!r}") from None
    if value < minimum:
        raise ConfigError(name, f"option must be >= {minimum}, got {value}")
    return value
