"""Find (or build) a Python that has pawn-queue 0.1.3, in a venv of its own.

pawn-queue 0.1.3 pins botocore 1.40.61 through aiobotocore, so it never shares a venv
with this library. Order of preference:

1. ``PAWNQUEUE_PYTHON`` (an interpreter that imports ``pawn_queue``);
2. ``tests/interop.py:pawnqueue_python()`` when the test helpers have it;
3. the venv tests/interop.py would use (``$PAWNQ_INTEROP_VENV``, default
   ``~/.cache/pawn-queue-sync/pawn-queue-0.1.3-venv``), built here on first use
   (``python -m venv`` + ``pip install pawn-queue==0.1.3``, ~20 s).
"""

from __future__ import annotations

import importlib
import logging
import os
import subprocess
import sys
from pathlib import Path

log = logging.getLogger(__name__)

PAWN_QUEUE_VERSION = "0.1.3"
#: the same place (and variable) as tests/interop.py uses
VENV = Path(os.environ.get("PAWNQ_INTEROP_VENV")
            or Path.home() / ".cache" / "pawn-queue-sync" / f"pawn-queue-{PAWN_QUEUE_VERSION}-venv")


def _python_in(venv: Path) -> Path:
    return venv / "bin" / "python"


def _has_pawn_queue(python: str | os.PathLike[str]) -> bool:
    try:
        out = subprocess.run(
            [str(python), "-c",
             "import importlib.metadata as m; print(m.version('pawn-queue'))"],
            capture_output=True, text=True, timeout=60,
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return out.returncode == 0 and out.stdout.strip() == PAWN_QUEUE_VERSION


def _from_test_helpers() -> str | None:
    root = Path(__file__).resolve().parent.parent
    if not (root / "tests" / "interop.py").exists():
        return None
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    try:
        helper = getattr(importlib.import_module("tests.interop"), "pawnqueue_python", None)
        if helper is None:
            return None
        return str(helper())
    except Exception as exc:  # the helper is someone else's work in progress
        log.warning("tests/interop.py:pawnqueue_python() failed (%s); using our own venv", exc)
        return None


def build_venv(venv: Path = VENV) -> Path:
    """Create ``venv`` with pawn-queue 0.1.3 in it (idempotent)."""
    python = _python_in(venv)
    if python.exists() and _has_pawn_queue(python):
        return python
    log.info("building a pawn-queue %s venv in %s (once)", PAWN_QUEUE_VERSION, venv)
    venv.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
    subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", "--upgrade", "pip"], check=True
    )
    subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", f"pawn-queue=={PAWN_QUEUE_VERSION}"],
        check=True,
    )
    if not _has_pawn_queue(python):
        raise RuntimeError(f"pawn-queue {PAWN_QUEUE_VERSION} did not install in {venv}")
    return python


def pawnqueue_python() -> str:
    """An interpreter with pawn-queue 0.1.3 importable."""
    given = os.environ.get("PAWNQUEUE_PYTHON")
    if given:
        if not _has_pawn_queue(given):
            raise RuntimeError(f"PAWNQUEUE_PYTHON={given} has no pawn-queue {PAWN_QUEUE_VERSION}")
        return given
    helper = _from_test_helpers()
    if helper and _has_pawn_queue(helper):
        return helper
    return str(build_venv())
