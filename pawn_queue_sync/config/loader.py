"""Loading: a YAML file, a dict, the ``PAWNQUEUE_*`` environment, merged by precedence.

Each source becomes a *layer* (dotted path -> (value, where it came from)); layers are
merged lowest precedence first and the result is built into the schema's classes, whose
validators judge every value. An error names the dotted field and where its value came
from, and never quotes a secret (nor a YAML line, which may hold one).
"""

from __future__ import annotations

import difflib
import enum
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

import attrs
import yaml

from ..errors import ConfigError
from .schema import ENV_VARS, LEAVES, OPTIONAL_SECTIONS, SECRET_FIELDS, SECTIONS, PawnQueueConfig
from .validators import type_name

_BOOL_WORDS: Mapping[str, bool] = MappingProxyType(
    {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}
)


class _Marker(enum.Enum):
    PRESENT = "present"  # a section given as a mapping (so an s3 section "is present")


PRESENT = _Marker.PRESENT
Layer = dict[str, tuple[Any, str]]  # dotted path -> (value, where it came from)


def _children(prefix: str) -> list[str]:
    """Names directly under a section ('' for the top level)."""
    depth = prefix.count(".")
    known = list(LEAVES) + list(SECTIONS)
    return sorted(p[len(prefix) :] for p in known if p.startswith(prefix) and p.count(".") == depth)


def _unknown_key_error(unknown: list[str], origin: str) -> ConfigError:
    first = unknown[0]
    prefix, _, key = first.rpartition(".")
    siblings = _children(prefix + "." if prefix else "")
    close = difflib.get_close_matches(key, siblings, n=1)
    hint = f"did you mean {close[0]!r}?" if close else "known keys: " + ", ".join(siblings)
    more = f"; also unknown: {', '.join(unknown[1:])}" if len(unknown) > 1 else ""
    return ConfigError(first, f"unknown key ({origin}); {hint}{more}")


def _flatten(data: Mapping[Any, Any], origin: str) -> Layer:
    """Turn a nested mapping into a layer, rejecting unknown keys."""
    out: Layer = {}
    unknown: list[str] = []

    def walk(mapping: Mapping[Any, Any], prefix: str) -> None:
        for key, value in mapping.items():
            if not isinstance(key, str):
                unknown.append(f"{prefix}{key!r}")
                continue
            path = prefix + key
            if path in SECTIONS:
                cls = SECTIONS[path]
                if isinstance(value, cls):  # a config object inside a dict
                    value = attrs.asdict(value, recurse=True)
                if value is None:  # `s3: null` = no s3; `polling:` with nothing = defaults
                    out[path] = (None if path in OPTIONAL_SECTIONS else PRESENT, origin)
                elif isinstance(value, Mapping):
                    out[path] = (PRESENT, origin)
                    walk(value, path + ".")
                else:
                    raise ConfigError(
                        path, f"must be a mapping, got {type_name(value)} ({origin})"
                    )
            elif path in LEAVES:
                out[path] = (value, origin)
            else:
                unknown.append(path)

    walk(data, "")
    if unknown:
        raise _unknown_key_error(sorted(unknown), origin)
    return out


def _parse_env_value(path: str, name: str, raw: str) -> Any:
    """Convert one environment string to its field's type."""
    field = LEAVES[path]
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


def env_layer(env: Mapping[str, str]) -> Layer:
    """The ``PAWNQUEUE_*`` variables as a layer; empty values count as unset."""
    out: Layer = {}
    for path, name in ENV_VARS.items():
        raw = env.get(name)
        if raw is None or not raw.strip():
            continue
        out[path] = (_parse_env_value(path, name, raw), f"from environment variable {name}")
    return out


def merge(layers: Iterable[Layer]) -> Layer:
    """Merge layers given lowest precedence first."""
    merged: Layer = {}
    for layer in layers:
        for path, (value, origin) in layer.items():
            if path in SECTIONS and value is None:  # explicit "no such section"
                for below in [p for p in merged if p.startswith(path + ".")]:
                    del merged[below]
            else:
                parts = path.split(".")
                for i in range(1, len(parts)):
                    parent = ".".join(parts[:i])
                    if merged.get(parent, (None,))[0] is not PRESENT:
                        merged[parent] = (PRESENT, origin)
            merged[path] = (value, origin)
    return merged


def _build_section(cls: type, prefix: str, merged: Layer) -> Any:
    kwargs: dict[str, Any] = {}
    for field in attrs.fields(cls):
        path = prefix + field.name
        section = field.metadata.get("section")
        if section is None:
            if path in merged:
                kwargs[field.name] = merged[path][0]
        elif field.metadata.get("optional"):
            if merged.get(path, (None,))[0] is PRESENT:
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


def build(layers: Iterable[Layer]) -> PawnQueueConfig:
    """Merge layers (lowest precedence first) and validate the result."""
    merged = merge(layers)
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
        raise ConfigError(where, f"must contain a YAML mapping, got {type_name(data)}")
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
    from_env = env_layer(os.environ if env is None else env)
    if source is None:
        return build([from_env])
    if isinstance(source, (str, os.PathLike)):
        where = f"from file {os.fspath(source)!r}"
        return build([_flatten(_read_yaml(source), where), from_env])
    if isinstance(source, Mapping):
        return build([from_env, _flatten(source, "from the dict passed to load_config")])
    raise TypeError(
        "load_config() takes a path, a dict, a PawnQueueConfig or None, "
        f"not {type(source).__name__}"
    )
