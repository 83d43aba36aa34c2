"""The fluent builder, with pawn-queue's method names, its setters generated from the schema.

Each top-level section of :class:`~pawn_queue_sync.config.PawnQueueConfig` has one
method taking its settings (and those of its sub-sections, as ``concurrency()`` takes
``csprng_verify``'s) as keywords, so a setting declared in the schema is settable here
with no edit. A keyword is the field's name, or the ``builder`` name its declaration
gives where pawn-queue's builder spells it otherwise (``s3(access_key=, secret_key=)``).
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from .loader import PRESENT, Layer, build, env_layer
from .schema import ENV_VARS, LEAVES, OPTIONAL_SECTIONS, SECTIONS, PawnQueueConfig
from .validators import to_path_str

if TYPE_CHECKING:
    from ..queue.core import PawnQueue

__all__ = ["PawnQueueBuilder", "keywords"]

Setter = Callable[..., "PawnQueueBuilder"]


def keywords(section: str) -> dict[str, str]:
    """The keywords of the builder's ``section()`` method -> the dotted setting each
    sets, in declaration order: every setting under ``section``, sub-sections included."""
    out: dict[str, str] = {}
    for path, field in LEAVES.items():
        if path.split(".", 1)[0] != section:
            continue
        name = field.metadata.get("builder", field.name)
        if name in out:  # pragma: no cover - guards edits of the schema
            raise RuntimeError(f"builder keyword {name!r} of {section}(): {out[name]}, {path}")
        out[name] = path
    return out


def _section_setter(section: str) -> Setter:
    """The builder method of a top-level ``section``: its keywords set those settings
    (``None`` leaves one unset); calling the method of an optional section (``s3``) at
    all selects it."""
    names = keywords(section)
    selects = section in OPTIONAL_SECTIONS

    def setter(self: PawnQueueBuilder, /, **values: Any) -> PawnQueueBuilder:
        unknown = [name for name in values if name not in names]
        if unknown:
            raise TypeError(
                f"PawnQueueBuilder.{section}() got an unexpected keyword argument {unknown[0]!r}"
            )
        if selects:
            self._values[section] = PRESENT
        for name, value in values.items():
            if value is not None:
                self._values[names[name]] = value
        return self

    params = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_ONLY)]
    lines = []
    for name, path in names.items():
        field = LEAVES[path]
        annotation = str(field.type)
        if field.converter is to_path_str:  # a path-like is made a str when loaded
            annotation += " | os.PathLike[str]"
        if "None" not in annotation:
            annotation += " | None"
        params.append(
            inspect.Parameter(
                name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=annotation
            )
        )
        lines.append(f"- ``{name}`` (``{path}``): {field.metadata.get('doc', '')}")
    summary = (inspect.getdoc(SECTIONS[section]) or "").splitlines()[0]
    if selects:
        summary += f" Calling this at all selects the {section} backend."
    setter.__name__ = section
    setter.__qualname__ = f"PawnQueueBuilder.{section}"
    setter.__doc__ = summary + "\n\nKeywords (each optional):\n\n" + "\n".join(lines)
    setter.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        params, return_annotation="PawnQueueBuilder"
    )
    return setter


class PawnQueueBuilder:
    """Fluent configuration, with pawn-queue's method names.

    Values set here are explicit and beat the environment; :meth:`from_env` only fills
    what is not set, whenever it is called. Without :meth:`from_env` the environment is
    not read. Without :meth:`s3` (or ``PAWNQUEUE_S3_*``) the local store is used.
    """

    _ORIGIN = "set on the builder"

    # One method per section of PawnQueueConfig (a test checks that none is missing).
    s3 = _section_setter("s3")
    local = _section_setter("local")
    polling = _section_setter("polling")
    concurrency = _section_setter("concurrency")
    registry = _section_setter("registry")
    publishing = _section_setter("publishing")

    def __init__(self) -> None:
        self._values: dict[str, Any] = {}
        self._env: dict[str, str] | None = None

    def from_env(self, env: Mapping[str, str] | None = None) -> PawnQueueBuilder:
        """Fill settings not set on the builder from ``env`` (default ``os.environ``, read now)."""
        source = os.environ if env is None else env
        self._env = {name: source[name] for name in ENV_VARS.values() if name in source}
        return self

    def build_config(self) -> PawnQueueConfig:
        """The validated configuration."""
        layers: list[Layer] = []
        if self._env is not None:
            layers.append(env_layer(self._env))
        layers.append({path: (value, self._ORIGIN) for path, value in self._values.items()})
        return build(layers)

    def build(self) -> PawnQueue:
        """A :class:`~pawn_queue_sync.queue.core.PawnQueue` (not yet set up).

        pawn-queue's builder API: the one reference of the config layer to the queue
        above it, imported here, when called, so that the config package imports alone.
        """
        from ..queue.core import PawnQueue

        return PawnQueue(self.build_config())
