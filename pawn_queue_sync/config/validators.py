"""How a setting is declared: validators, converters, field helpers; secret masking.

Each validator is an attrs validator that raises :class:`~pawn_queue_sync.errors.ConfigError`
naming the dotted field (``polling.interval_seconds: must be > 0 ...``); none echoes a
value that may be a secret (credentials, URLs with a password).
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import attrs

from ..errors import ConfigError

#: what a secret shows instead of its value
MASK = "***"
_BUCKET_RE = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")

Validator = Callable[[Any, "attrs.Attribute[Any]", Any], None]


def where(inst: Any, attr: attrs.Attribute[Any]) -> str:
    """Dotted name of ``attr`` on a config instance."""
    section = type(inst)._SECTION
    return f"{section}.{attr.name}" if section else attr.name


def type_name(value: object) -> str:
    return "null" if value is None else type(value).__name__


def number(*, gt: float | None = None, ge: float | None = None) -> Validator:
    """A finite float (ints are converted beforehand), with optional bounds."""

    def check(inst: Any, attr: attrs.Attribute[Any], value: Any) -> None:
        name = where(inst, attr)
        if isinstance(value, bool) or not isinstance(value, float):
            raise ConfigError(name, f"must be a number, got {type_name(value)}")
        if not math.isfinite(value):
            raise ConfigError(name, f"must be a finite number, got {value!r}")
        if gt is not None and not value > gt:
            raise ConfigError(name, f"must be > {gt:g}, got {value!r}")
        if ge is not None and not value >= ge:
            raise ConfigError(name, f"must be >= {ge:g}, got {value!r}")

    return check


def integer(*, ge: int, le: int | None = None) -> Validator:
    """An int (not a bool, not a float) >= ``ge`` (and <= ``le`` when given)."""

    def check(inst: Any, attr: attrs.Attribute[Any], value: Any) -> None:
        name = where(inst, attr)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(name, f"must be an integer, got {type_name(value)}")
        if value < ge:
            raise ConfigError(name, f"must be >= {ge}, got {value!r}")
        if le is not None and value > le:
            raise ConfigError(name, f"must be <= {le}, got {value!r}")

    return check


def boolean(inst: Any, attr: attrs.Attribute[Any], value: Any) -> None:
    if not isinstance(value, bool):
        raise ConfigError(where(inst, attr), f"must be true or false, got {type_name(value)}")


def text(inst: Any, attr: attrs.Attribute[Any], value: Any) -> None:
    """A non-empty string; the value is never echoed (it may be a secret)."""
    name = where(inst, attr)
    if not isinstance(value, str):
        raise ConfigError(name, f"must be a string, got {type_name(value)}")
    if not value.strip():
        raise ConfigError(name, "must be a non-empty string")


def choice(choices: tuple[str, ...]) -> Validator:
    def check(inst: Any, attr: attrs.Attribute[Any], value: Any) -> None:
        if value not in choices or not isinstance(value, str):
            allowed = ", ".join(repr(c) for c in choices)
            got = repr(value) if isinstance(value, str) else type_name(value)
            raise ConfigError(where(inst, attr), f"must be one of {allowed}, got {got}")

    return check


def optional(check: Validator) -> Validator:
    def optional_check(inst: Any, attr: attrs.Attribute[Any], value: Any) -> None:
        if value is not None:
            check(inst, attr, value)

    return optional_check


def endpoint(inst: Any, attr: attrs.Attribute[Any], value: Any) -> None:
    text(inst, attr, value)
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        # Not echoed: a URL may carry user:password.
        raise ConfigError(where(inst, attr), "must be an http:// or https:// URL with a host")
    if any(c.isspace() or ord(c) < 32 or ord(c) == 127 for c in value):
        raise ConfigError(
            where(inst, attr),
            "must not contain spaces or control characters (percent-encode them)",
        )
    # A raw '/', '?' or '#' in a user name or password ends the URL's host part early:
    # the password would then be taken for a path (and shown unmasked), or for a port.
    if "@" in value[len(parts.scheme) + 3 + len(parts.netloc):]:
        raise ConfigError(
            where(inst, attr),
            "has an '@' after a '/', '?' or '#': percent-encode those characters in the "
            "user name or password (%2F, %3F, %23)",
        )
    try:
        parts.port  # noqa: B018  (parses the port: ValueError if it is not a number)
    except ValueError:
        raise ConfigError(where(inst, attr), "has a port that is not a number") from None


def bucket(inst: Any, attr: attrs.Attribute[Any], value: Any) -> None:
    name = where(inst, attr)
    if not isinstance(value, str):
        raise ConfigError(name, f"must be a string, got {type_name(value)}")
    if not _BUCKET_RE.match(value) or ".." in value:
        raise ConfigError(
            name,
            "must be 3-63 characters of lowercase letters, digits, '.' and '-', "
            f"starting and ending with a letter or digit, got {value!r}",
        )


def to_float(value: Any) -> Any:
    """Ints become floats; anything else is left for the validator to judge."""
    if isinstance(value, int) and not isinstance(value, bool):
        try:
            return float(value)
        except OverflowError:
            return value
    return value


def to_path_str(value: Any) -> Any:
    """Absolute at load time, so child processes started elsewhere use the same store."""
    value = os.fspath(value) if isinstance(value, os.PathLike) else value
    return os.path.abspath(value) if isinstance(value, str) and value else value


def mask_repr(value: object) -> str:
    return "None" if value is None else repr(MASK)


#: the userinfo of URLs in a text: ``//user:password@`` up to the host
_USERINFO = re.compile(r"(?<=//)[^/?#\s]*@")


def redact_endpoint(text: str) -> str:
    """``http://user:password@host:9000/x`` -> ``http://***@host:9000/x``: an endpoint
    (or a text quoting one) fit to show. The one place credentials inside an endpoint
    URL are masked: reprs, ``describe()``, log lines and error messages all use it."""
    return _USERINFO.sub(MASK + "@", text)


def endpoint_repr(value: str | None) -> str:
    return repr(value if value is None else redact_endpoint(value))


def instance_of(cls: type) -> Validator:
    def check(inst: Any, attr: attrs.Attribute[Any], value: Any) -> None:
        if not isinstance(value, cls):
            raise ConfigError(
                where(inst, attr), f"must be a {cls.__name__}, got {type_name(value)}"
            )

    return check


# --------------------------------------------------------------------------- field helpers


def meta(
    kind: str,
    doc: str,
    *,
    env: str | None = None,
    builder: str | None = None,
    secret: bool = False,
) -> dict[str, Any]:
    """A leaf's metadata: ``kind`` (how an environment string converts: str, int, float,
    bool), ``doc``, and optionally ``env``, ``builder`` and ``secret``."""
    out: dict[str, Any] = {"kind": kind, "doc": doc}
    if env is not None:
        out["env"] = env
    if builder is not None:
        out["builder"] = builder
    if secret:
        out["secret"] = True
    return out


def float_field(default: float, doc: str, *, gt: float | None = 0.0, env: str | None = None) -> Any:
    return attrs.field(
        default=default,
        converter=to_float,
        validator=number(gt=gt),
        metadata=meta("float", doc, env=env),
    )


def int_field(
    default: int, doc: str, *, ge: int = 1, le: int | None = None, env: str | None = None
) -> Any:
    return attrs.field(
        default=default, validator=integer(ge=ge, le=le), metadata=meta("int", doc, env=env)
    )


def bool_field(default: bool, doc: str, *, env: str | None = None) -> Any:
    return attrs.field(default=default, validator=boolean, metadata=meta("bool", doc, env=env))


def secret_field(doc: str, *, env: str, builder: str) -> Any:
    return attrs.field(
        default=None,
        validator=optional(text),
        repr=mask_repr,
        metadata=meta("str", doc, env=env, builder=builder, secret=True),
    )


def section_field(cls: type) -> dict[str, Any]:
    """The field arguments of a sub-section: its defaults, and it must be that class."""
    return {"factory": cls, "validator": instance_of(cls), "metadata": section_meta(cls)}


def section_meta(cls: type) -> dict[str, Any]:
    return {"section": cls}
