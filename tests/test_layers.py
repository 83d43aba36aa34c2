"""The package's layers: every module imports on its own, and none imports a layer
above its own (lazy imports inside functions included), so there is no import cycle.

Bottom-up (see docs/architecture.md): the base modules (errors, clock, encoding,
layout), config, storage, protocol, runtime, queue, then the process level (workers,
spark, cli, testing and the package root)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "pawn_queue_sync"

#: Layer of each top-level name of the package, bottom-up.
LAYERS: dict[str, int] = {
    "errors": 0, "clock": 0, "encoding": 0, "layout": 0, "packing": 0, "events": 0,
    "config": 1,
    "storage": 2,
    "protocol": 3,
    "runtime": 4,
    "queue": 5,
    "workers": 6, "spark": 6, "cli": 6, "dashboard": 6, "metrics": 6, "testing": 6,
    "__main__": 6, "__init__": 6,
}

#: Imports that reach up on purpose, each with its reason.
ALLOWED_UP: dict[tuple[str, str], str] = {
    ("config.builder", "queue"): (
        "PawnQueueBuilder.build() returns a PawnQueue (pawn-queue's API); the import is "
        "inside build(), so config imports without the queue"
    ),
    ("runtime.workers", "workers"): (
        "a deprecated public import path (documented before the pool moved up to "
        "pawn_queue_sync.workers): re-exports it, with a DeprecationWarning on import"
    ),
}


def _modules() -> list[str]:
    names = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        if parts[-1] == "__init__" and len(parts) > 1:
            parts = parts[:-1]
        names.append(".".join(parts))
    return names


def _layer(module: str) -> int:
    return LAYERS[module.split(".")[0]]


def _imports(module: str) -> set[str]:
    """The package modules ``module`` imports (top level or inside functions)."""
    path = PACKAGE.joinpath(*module.split("."))
    is_package = path.is_dir() or module == "__init__"
    file = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
    if module == "__init__":
        file = PACKAGE / "__init__.py"
    tree = ast.parse(file.read_text(), str(file))
    here = [] if module == "__init__" else module.split(".")
    base = here if is_package else here[:-1]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                parent = base[: len(base) - (node.level - 1)]
                target = [*parent, *(node.module.split(".") if node.module else [])]
            elif node.module and node.module.startswith("pawn_queue_sync"):
                target = node.module.split(".")[1:]
            else:
                continue
            if target:
                found.add(".".join(target))
            else:  # from . import x (at the package root)
                found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("pawn_queue_sync."):
                    found.add(alias.name.split(".", 1)[1])
    return found


MODULES = _modules()


def test_the_layer_table_names_every_top_level_module() -> None:
    assert {m.split(".")[0] for m in MODULES} <= set(LAYERS)


@pytest.mark.parametrize("module", [m for m in MODULES if m != "__init__"])
def test_no_module_imports_a_layer_above_it(module: str) -> None:
    if module.startswith("__main__"):
        return
    up = sorted(
        target for target in _imports(module)
        if _layer(target) > _layer(module)
        and (module, target.split(".")[0]) not in ALLOWED_UP
    )
    assert up == [], f"{module} (layer {_layer(module)}) imports {up}"


def test_every_module_imports_on_its_own() -> None:
    """Each module imported first, with no module of the package loaded before it (one
    interpreter of its own; the package's modules are dropped from ``sys.modules``
    between imports, third-party ones stay): a cycle shows up as an ImportError
    (partially initialized module) for some entry point."""
    code = (
        "import importlib, sys, traceback, warnings\n"
        "warnings.simplefilter('ignore', DeprecationWarning)\n"
        "failed = []\n"
        "for name in sys.argv[1:]:\n"
        "    for loaded in [m for m in sys.modules if m.split('.')[0] == 'pawn_queue_sync']:\n"
        "        del sys.modules[loaded]\n"
        "    try:\n"
        "        importlib.import_module(name)\n"
        "    except Exception as exc:\n"
        "        failed.append((name, repr(exc)))\n"
        "print(failed)\n"
        "sys.exit(1 if failed else 0)\n"
    )
    names = [
        "pawn_queue_sync" if m == "__init__" else f"pawn_queue_sync.{m}"
        for m in MODULES
        if not m.startswith("__main__")
    ]
    result = subprocess.run(
        [sys.executable, "-c", code, *names], capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stdout + result.stderr
