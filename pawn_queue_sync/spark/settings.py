"""Connection settings that travel from the driver to the executors without ever being
shown: :class:`Settings` (a resolved configuration as plain, picklable data whose
``repr`` names only the backend, bucket and endpoint), built from a configuration or
from data source options, and :func:`spark_options`, the options for a configuration.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from typing import Any

from ..config import PawnQueueConfig, load_config, redact_endpoint
from ..encoding import canonical_json
from ..errors import ConfigError
from .options import BOOL_OPTIONS, CONFIG_PATH_OPTION, CONNECTION_OPTIONS, UNREDACTED_OPTIONS

__all__ = ["ConfigSource", "Settings", "spark_options"]

ConfigSource = PawnQueueConfig | Mapping[str, Any] | str | os.PathLike[str] | None


def spark_options(config: ConfigSource) -> dict[str, str]:
    """Data source options for the connection settings of ``config`` (s3 only).

    Other settings (polling, publishing) are not options: use ``configPath`` for them.
    """
    cfg = load_config(config)
    if cfg.s3 is None:
        return {"localPath": cfg.local.path}
    s3 = cfg.s3
    out = {"bucketName": s3.bucket_name, "regionName": s3.region_name,
           "useSsl": str(s3.use_ssl).lower(), "addressingStyle": s3.addressing_style,
           "fastPath": str(s3.fast_path).lower()}
    if s3.endpoint_url:
        out["endpointUrl"] = s3.endpoint_url
    if s3.aws_access_key_id and s3.aws_secret_access_key:
        out["accessKey"] = s3.aws_access_key_id
        out["secretKey"] = s3.aws_secret_access_key
    return out


class Settings:
    """A resolved configuration to hand to executors: plain data, picklable, and
    never shown: ``repr`` names the backend, bucket and endpoint only."""

    __slots__ = ("_data", "_fingerprint")

    def __init__(self, config: ConfigSource) -> None:
        cfg = load_config(config)
        self._data: dict[str, Any] = cfg.to_dict()
        self._fingerprint = hashlib.sha256(canonical_json(self._data)).hexdigest()

    @property
    def fingerprint(self) -> str:
        """A digest of every setting: equal settings share one queue per process."""
        return self._fingerprint

    def config(self) -> PawnQueueConfig:
        return load_config(self._data)

    def describe(self) -> str:
        s3 = self._data.get("s3")
        if s3:
            where = redact_endpoint(s3.get("endpoint_url") or "AWS")
            return f"s3 bucket {s3['bucket_name']!r} at {where}"
        return f"local store at {self._data['local']['path']!r}"

    def __repr__(self) -> str:
        return f"Settings({self.describe()})"

    def __getstate__(self) -> tuple[dict[str, Any], str]:
        return self._data, self._fingerprint

    def __setstate__(self, state: tuple[dict[str, Any], str]) -> None:
        self._data, self._fingerprint = state

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> Settings:
        """Settings from data source options (case-insensitive): ``configPath`` (a
        YAML file), then the connection options on top (see
        :data:`CONNECTION_OPTIONS`), then the ``PAWNQUEUE_*`` environment for whatever
        is still unset."""
        opts = {k.lower(): v for k, v in options.items()}
        for bad, good in UNREDACTED_OPTIONS.items():
            if bad in opts:
                raise ConfigError(
                    bad, f"use the option {good!r} instead: Spark shows {bad!r} in plans"
                )
        path = opts.get(CONFIG_PATH_OPTION.lower())
        base: dict[str, Any] = load_config(path).to_dict() if path else {}
        given = {
            dotted: opts[name.lower()]
            for name, dotted in CONNECTION_OPTIONS.items()
            if name.lower() in opts
        }
        if not given:
            return cls(base or None)
        if any(p.startswith("s3.") for p in given) and base.get("s3") is None:
            base["s3"] = {}
        for dotted, raw in given.items():
            section, leaf = dotted.split(".")
            value: Any = raw
            if dotted in BOOL_OPTIONS:
                word = str(raw).strip().lower()
                if word not in ("true", "false"):
                    raise ConfigError(dotted, "option must be 'true' or 'false'")
                value = word == "true"
            base.setdefault(section, {})[leaf] = value
        return cls(base)
