"""The Python examples of README.md and docs/*.md run as written.

Each Markdown file's ```python blocks run in order, as one script, in a fresh directory
that holds ``config.yaml`` and ``pawnqueue.yaml`` for a bucket on SeaweedFS (the reader's
own configuration, as the examples assume). What an example needs but does not show (a
``charge`` function, messages to consume, a thread that stops a listener once the topic
is drained, checks that every message was handled) comes from hidden blocks::

    <!-- docs-test
    def charge(order_id): ...
    -->

which run in their place in the file, between the shown blocks. A shown block that the
text says to save as a file of its own (a worker pool's script must be importable by its
spawned children) follows ``<!-- docs-test-file NAME -->`` and is written to ``NAME`` in
the directory, for the hidden blocks to run. A shown block is never edited or left out:
one that stops working fails this test.
"""

from __future__ import annotations

import os
import re
import runpy
import subprocess
import sys
from pathlib import Path
from typing import Any

import attrs
import pytest
import yaml

from tests.servers import S3Server, config_dict

ROOT = Path(__file__).resolve().parent.parent
_BLOCK = re.compile(
    r"^(?:<!-- docs-test-file (?P<file>[\w.]+) -->\n)?```python\n(?P<shown>.*?)^```"
    r"|^<!-- docs-test\n(?P<hidden>.*?)^-->",
    re.S | re.M,
)
#: Files whose Python blocks need Spark (a JVM, pyspark): they run with the spark extra,
#: in this process, on the session's SparkSession.
_SPARK = {"docs/spark.md"}


@attrs.frozen
class Block:
    code: str
    line: int
    hidden: bool
    #: the file this block is saved as, or None: part of the file's script
    file: str | None = None


def blocks_of(path: Path) -> list[Block]:
    """The shown and hidden Python blocks of a Markdown file, in order."""
    text = path.read_text(encoding="utf-8")
    out = []
    for match in _BLOCK.finditer(text):
        hidden = match.group("hidden") is not None
        code = match.group("hidden") if hidden else match.group("shown")
        line = text.count("\n", 0, match.start("hidden" if hidden else "shown")) + 1
        out.append(Block(code, line, hidden, match.group("file")))
    return out


def documented() -> list[str]:
    """Every Markdown file of the project with at least one shown Python block."""
    files = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    return [
        str(f.relative_to(ROOT)) for f in files if any(not b.hidden for b in blocks_of(f))
    ]


def script_of(path: Path) -> str:
    """One script of the file's blocks; each starts on the Markdown line it came from,
    so a traceback's line number points into the Markdown file."""
    lines: list[str] = []
    for block in blocks_of(path):
        if block.file is not None:
            continue
        while len(lines) < block.line - 1:
            lines.append("")
        lines.extend(block.code.splitlines())
    return "\n".join(lines) + "\n"


def test_the_harness_finds_hidden_and_shown_blocks(tmp_path: Path) -> None:
    doc = tmp_path / "x.md"
    doc.write_text(
        "t\n```python\nx = 1\n```\n<!-- docs-test\nassert x == 1\n-->\n"
        "<!-- docs-test-file w.py -->\n```python\ny = 2\n```\n"
    )
    got = blocks_of(doc)
    assert [(b.code, b.line, b.hidden, b.file) for b in got] == [
        ("x = 1\n", 3, False, None), ("assert x == 1\n", 6, True, None),
        ("y = 2\n", 10, False, "w.py"),
    ]
    assert script_of(doc).splitlines()[2] == "x = 1"
    assert script_of(doc).splitlines()[5] == "assert x == 1"


def test_every_documented_file_is_run() -> None:
    assert "README.md" in documented()
    assert set(documented()) <= set(_PARAMS)


_PARAMS = ["README.md", "docs/api.md", "docs/operations.md", "docs/runtime.md",
           "docs/spark.md"]


def run_here(script: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Run ``script`` in this process as ``__main__``, in its directory (for a file
    whose examples need the session's SparkSession: ``getOrCreate()`` returns it)."""
    monkeypatch.chdir(script.parent)
    monkeypatch.syspath_prepend(str(script.parent))
    for name in ("PYSPARK_PYTHON", "SPARK_LOCAL_IP"):  # the examples set them: restore
        monkeypatch.setenv(name, os.environ.get(name, ""))
    runpy.run_path(str(script), run_name="__main__")


@pytest.mark.parametrize("doc", [
    pytest.param(doc, marks=pytest.mark.xdist_group("spark-2")) if doc in _SPARK else doc
    for doc in _PARAMS
])
def test_examples_run_as_written(
    doc: str, real_s3: S3Server, real_bucket: str, tmp_path: Path,
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Each file's script runs in a process of its own, except docs/spark.md's: it runs
    in this one, on the session's SparkSession (one JVM for every Spark test), in the
    JVM's working directory, where Spark resolves the examples' relative paths."""
    path = ROOT / doc
    assert any(not b.hidden for b in blocks_of(path)), f"{doc} has no Python example"
    if doc in _SPARK:
        request.getfixturevalue("spark")
        tmp_path = request.getfixturevalue("spark_workdir")
    config: dict[str, Any] = config_dict(real_s3, real_bucket)
    for name in ("config.yaml", "pawnqueue.yaml"):
        (tmp_path / name).write_text(yaml.safe_dump(config))
    for block in blocks_of(path):
        if block.file is not None:
            (tmp_path / block.file).write_text(block.code)
    script = tmp_path / f"{path.stem}_examples.py"
    script.write_text(script_of(path))
    if doc in _SPARK:
        capsys.readouterr()
        run_here(script, monkeypatch)
        assert "DOCS-TEST OK" in capsys.readouterr().out, (
            f"{doc}: the final hidden check did not run")
        return
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PAWNQUEUE_", "AWS_"))}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), str(ROOT)])
    proc = subprocess.run(
        [sys.executable, script.name], cwd=tmp_path, env=env, capture_output=True,
        text=True, timeout=600,
    )
    assert proc.returncode == 0, (
        f"{doc}: examples failed (exit {proc.returncode}); line numbers are {doc}'s\n"
        f"--- stdout\n{proc.stdout[-4000:]}\n--- stderr\n{proc.stderr[-8000:]}"
    )
    assert "DOCS-TEST OK" in proc.stdout, f"{doc}: the final hidden check did not run"


def test_configuration_doc_lists_every_variable_as_the_code_describes_it() -> None:
    """docs/configuration.md's table holds every row :func:`dump_env_docs` makes, so a
    setting's description changed in the code cannot go stale in the docs."""
    from pawn_queue_sync.config import dump_env_docs

    doc = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    rows = [row for row in dump_env_docs().splitlines() if row.startswith("| `")]
    assert rows
    assert [row for row in rows if row not in doc] == []
