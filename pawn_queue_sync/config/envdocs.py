"""The table of ``PAWNQUEUE_*`` variables as Markdown, from the schema's declarations.

docs/configuration.md holds its rows; a test checks that every row is there as written.
"""

from __future__ import annotations

from typing import Any

import attrs

from .schema import ENV_VARS, LEAVES

__all__ = ["dump_env_docs"]


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
        field = LEAVES[path]
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
