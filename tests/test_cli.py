"""The pawnq CLI on the embedded local store, run as a user would run it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pawn_queue_sync.cli import main


def _pawnq(
    tmp_path: Path, *args: str, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PAWNQUEUE_", "AWS_"))}
    env["PAWNQUEUE_LOCAL_PATH"] = str(tmp_path / "store")
    return subprocess.run(
        [sys.executable, "-m", "pawn_queue_sync", *args],
        input=stdin,
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
    )


def test_demo_publishes_and_consumes_everything_once(tmp_path: Path) -> None:
    proc = _pawnq(tmp_path, "demo", "--messages", "200", "--path", str(tmp_path / "demo"))
    assert proc.returncode == 0, proc.stderr
    summary = proc.stdout.strip().splitlines()
    line = next(s for s in summary if "duplicates" in s)
    assert "published 200" in line
    assert "consumed 200" in line
    assert "duplicates 0" in line
    assert "missing 0" in line
    assert "'pending': 0" in proc.stdout


def test_publish_consume_round_trip_through_the_cli(tmp_path: Path) -> None:
    created = _pawnq(tmp_path, "topics", "--create", "orders")
    assert created.returncode == 0, created.stderr
    assert "orders: created" in created.stdout
    pub = _pawnq(tmp_path, "publish", "orders", stdin='{"n": 1}\n{"n": 2}\n"three"\n')
    assert pub.returncode == 0, pub.stderr
    ids = pub.stdout.split()
    assert len(ids) == 3
    listed = _pawnq(tmp_path, "topics", "--stats")
    assert "orders\tpending=3\tleased=0\tdead_letter=0" in listed.stdout
    peek = _pawnq(tmp_path, "consume", "orders", "--max", "5", "--no-ack")
    assert [json.loads(x)["id"] for x in peek.stdout.splitlines()] == ids
    con = _pawnq(tmp_path, "consume", "orders", "--max", "5")
    got = [json.loads(x) for x in con.stdout.splitlines()]
    assert [g["payload"] for g in got] == [{"n": 1}, {"n": 2}, "three"]
    again = _pawnq(tmp_path, "consume", "orders", "--max", "5")
    assert again.stdout == ""


def test_bad_input_gives_a_clear_error_and_exit_status(tmp_path: Path) -> None:
    ghost = _pawnq(tmp_path, "publish", "ghost", '{"a": 1}')
    assert ghost.returncode == 1
    assert "TopicNotFoundError" in ghost.stderr and "ghost" in ghost.stderr
    bad_topic = _pawnq(tmp_path, "publish", "a/b", '{"a": 1}', "--create")
    assert bad_topic.returncode == 1
    assert "InvalidTopicName" in bad_topic.stderr
    not_json = _pawnq(tmp_path, "publish", "orders", "{nope")
    assert not_json.returncode == 2
    assert "not JSON" in not_json.stderr


def test_info_masks_secrets(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"local:\n  path: {tmp_path / 'store'}\n")
    assert main(["--config", str(cfg), "info"]) == 0
    out = capsys.readouterr().out
    assert "strategy: conditional_write" in out
    assert "if_match: True" in out


def test_help_lists_the_commands() -> None:
    proc = subprocess.run([sys.executable, "-m", "pawn_queue_sync", "--help"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0
    for command in ("demo", "topics", "publish", "consume", "dead-letter", "info"):
        assert command in proc.stdout


def test_python_m_runs_the_same_cli_as_the_pawnq_script(tmp_path: Path) -> None:
    """``python -m pawn_queue_sync ARGS`` is ``pawnq ARGS``: same output, same status."""
    pawnq = Path(sys.executable).with_name("pawnq")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PAWNQUEUE_", "AWS_"))}
    runs = {}
    for name, command in (("script", [str(pawnq)]),
                          ("-m", [sys.executable, "-m", "pawn_queue_sync"])):
        env["PAWNQUEUE_LOCAL_PATH"] = str(tmp_path / f"store-{name}")  # each its own
        runs[name] = [
            subprocess.run([*command, *args], capture_output=True, text=True, env=env,
                           cwd=tmp_path, timeout=300)
            for args in (["--help"], ["worker", "--help"], ["topics", "--create", "t"],
                         ["topics"], ["publish", "ghost", "{}"], ["consume"])
        ]
    assert [r.returncode for r in runs["-m"]] == [0, 0, 0, 0, 1, 2]
    for script, module in zip(runs["script"], runs["-m"], strict=True):
        assert (module.returncode, module.stdout, module.stderr) == (
            script.returncode, script.stdout, script.stderr)
    assert runs["-m"][0].stdout.startswith("usage: pawnq ")
    assert runs["-m"][2].stdout == "t: created\n" and runs["-m"][3].stdout == "t\n"


def test_the_standalone_worker_command_runs_without_a_warning() -> None:
    """``python -m pawn_queue_sync.cli.worker`` (the worker command without ``pawnq``)
    is not imported by the package before it runs (runpy's RuntimeWarning)."""
    proc = subprocess.run([sys.executable, "-m", "pawn_queue_sync.cli.worker", "--help"],
                          capture_output=True, text=True, timeout=60)
    assert (proc.returncode, proc.stderr) == (0, "")
    assert proc.stdout.startswith("usage: pawnq-worker ")


def test_the_worker_pool_never_imports_the_cli() -> None:
    """The CLI imports the worker pool; no module of the pool imports the CLI back."""
    code = (
        "import importlib, pkgutil, sys\n"
        "import pawn_queue_sync.workers as w\n"
        "for m in pkgutil.iter_modules(w.__path__):\n"
        "    importlib.import_module(f'pawn_queue_sync.workers.{m.name}')\n"
        "print(sorted(n for n in sys.modules if n.startswith('pawn_queue_sync.cli')))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert (proc.returncode, proc.stdout) == (0, "[]\n"), proc.stderr


@pytest.mark.parametrize(
    "argv",
    [
        ["-v", "info"], ["info", "-v"], ["-v", "worker", "m:h", "--topic", "t"],
        ["worker", "m:h", "--topic", "t", "-v"], ["worker", "m:h", "-v", "--topic", "t", "-v"],
    ],
)
def test_verbose_is_taken_before_and_after_every_command(argv: list[str]) -> None:
    """``pawnq worker ... --verbose`` was a usage error while every other command took
    ``-v`` after it; counts given before and after add up."""
    from pawn_queue_sync.cli.parser import build_parser

    args = build_parser().parse_args(argv)
    assert args.verbose + getattr(args, "verbose_after", 0) == argv.count("-v")
