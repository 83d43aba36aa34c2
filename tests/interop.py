"""Drive pawn-queue 0.1.3 (the async peer library) from tests, in a venv of its own.

pawn-queue pins botocore 1.40.61 (through aioboto3/aiobotocore), so it must never be
installed into the project's environment. :func:`pawnqueue_python` builds, once per
machine, a venv cached outside the repository at ``$PAWNQ_INTEROP_VENV`` (default
``~/.cache/pawn-queue-sync/pawn-queue-0.1.3-venv``); :func:`run_pawnqueue` runs a script
there in a subprocess. The build is serialized between processes with an ``fcntl`` lock
and marked complete by a sentinel file written last, so a half-built venv is never used.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

from tests.servers import deep_merge

PAWNQUEUE_VERSION = "0.1.3"
PAWNQUEUE_REQUIREMENT = f"pawn-queue=={PAWNQUEUE_VERSION}"
VENV_ENV_VAR = "PAWNQ_INTEROP_VENV"
DEFAULT_VENV = Path("~/.cache/pawn-queue-sync") / f"pawn-queue-{PAWNQUEUE_VERSION}-venv"
SENTINEL_NAME = ".pawnq-interop-complete"
#: Seconds allowed for each venv/pip step (downloads included).
INSTALL_TIMEOUT = 900.0

_CHECK_SCRIPT = f"""
import importlib.metadata as md
import json
import pawn_queue  # imports aioboto3, pydantic, yaml: fails if the install is partial
assert md.version("pawn-queue") == {PAWNQUEUE_VERSION!r}, md.version("pawn-queue")
print(json.dumps({{d: md.version(d) for d in ("pawn-queue", "aioboto3", "botocore")}}))
"""

#: Prepended to every script run by :func:`run_pawnqueue`.
PRELUDE = """\
import json as _json
import sys as _sys

_INPUT = _json.loads(_sys.stdin.read())
CONFIG = _INPUT["config"]
ARGS = _INPUT["args"]


def emit(result):
    \"\"\"Print *result* as the JSON line run_pawnqueue() returns (must come last).\"\"\"
    print(_json.dumps(result), flush=True)

# ---- script ----
"""

_PUBLISH_SCRIPT = """
import asyncio

from pawn_queue import PawnQueue


async def main():
    pq = await PawnQueue.from_config(CONFIG)
    await pq.setup()
    try:
        await pq.create_topic(ARGS["topic"])
        producer = await pq.register_producer(ARGS["producer"])
        ids = [await producer.publish(ARGS["topic"], p) for p in ARGS["payloads"]]
        return {"ids": ids, "producer_id": producer.id}
    finally:
        await pq.teardown()


emit(asyncio.run(main()))
"""

_CONSUME_SCRIPT = """
import asyncio

from pawn_queue import PawnQueue


async def main():
    pq = await PawnQueue.from_config(CONFIG)
    await pq.setup()
    wanted = ARGS["max_messages"]
    got = []
    empty = 0
    try:
        consumer = await pq.register_consumer(ARGS["consumer"], topics=[ARGS["topic"]])
        while len(got) < wanted and empty < ARGS["empty_polls"]:
            # poll() claims up to max_messages_per_poll: never claim more than still wanted.
            consumer._config.polling.max_messages_per_poll = wanted - len(got)
            messages = await consumer.poll()
            if not messages:
                empty += 1
                if empty < ARGS["empty_polls"]:
                    await asyncio.sleep(ARGS["poll_interval"])
                continue
            empty = 0
            for m in messages:
                if ARGS["ack"]:
                    await m.ack()
                got.append(
                    {
                        "id": m.id,
                        "payload": m.payload,
                        "producer_id": m.producer_id,
                        "created_at": m.created_at,
                    }
                )
        return {"messages": got, "consumer_id": consumer.id}
    finally:
        await pq.teardown()


emit(asyncio.run(main()))
"""


class InteropError(RuntimeError):
    """Building the pawn-queue venv or running a script in it failed."""


def interop_venv_dir() -> Path:
    """Return where the pawn-queue venv lives (``$PAWNQ_INTEROP_VENV`` or the default)."""
    configured = os.environ.get(VENV_ENV_VAR)
    return Path(configured or DEFAULT_VENV).expanduser().absolute()


def _venv_python(venv: Path) -> Path:
    """Return the interpreter of *venv*."""
    return venv / "bin" / "python"


def _clean_env() -> dict[str, str]:
    """Return an environment for child processes without the caller's Python, AWS and
    pawn-queue settings (pawn-queue overlays ``PAWNQUEUE_*`` variables on its config)."""
    drop = ("PAWNQUEUE_", "AWS_", "PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PIP_USER")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env["AWS_CONFIG_FILE"] = os.devnull
    env["AWS_SHARED_CREDENTIALS_FILE"] = os.devnull
    env["AWS_EC2_METADATA_DISABLED"] = "true"
    return env


def _spawn(cmd: list[str], timeout: float, **kw: Any) -> subprocess.CompletedProcess[str]:
    """Run *cmd* in :func:`_clean_env`, its output captured as text; the exit status is
    the caller's to judge (``check=False``). *kw* goes to :func:`subprocess.run`."""
    return subprocess.run(
        cmd, capture_output=True, text=True, timeout=timeout, env=_clean_env(), check=False,
        **kw,
    )


def _run(cmd: list[str], what: str, timeout: float = INSTALL_TIMEOUT) -> str:
    """Run *cmd*; return its stdout or raise :class:`InteropError` with its output."""
    try:
        proc = _spawn(cmd, timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as exc:
        raise InteropError(f"{what}: timed out after {timeout:.0f} s: {cmd}") from exc
    if proc.returncode != 0:
        raise InteropError(
            f"{what}: exit {proc.returncode}: {cmd}\n"
            f"--- stdout ---\n{proc.stdout[-4000:]}\n--- stderr ---\n{proc.stderr[-4000:]}"
        )
    return proc.stdout


def _check_venv(venv: Path) -> dict[str, str] | None:
    """Return the installed versions if *venv* runs pawn-queue, else None."""
    python = _venv_python(venv)
    if not python.exists():
        return None
    try:
        out = _run([str(python), "-I", "-c", _CHECK_SCRIPT], "check", timeout=120)
        versions: dict[str, str] = json.loads(out.strip().splitlines()[-1])
    except (InteropError, OSError, ValueError, IndexError):
        return None
    return versions


def _interpreter_runs(venv: Path) -> bool:
    """Return whether *venv*'s Python starts (its base interpreter may have gone)."""
    try:
        _run([str(_venv_python(venv)), "-I", "-c", "pass"], "check interpreter", timeout=60)
    except (InteropError, OSError):
        return False
    return True


def _write_sentinel(venv: Path, versions: dict[str, str]) -> None:
    """Mark *venv* complete (atomically: write a temporary file, then rename)."""
    record = {"requirement": PAWNQUEUE_REQUIREMENT, "versions": versions}
    tmp = venv / f"{SENTINEL_NAME}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(record, indent=1) + "\n")
    os.replace(tmp, venv / SENTINEL_NAME)


def _sentinel_ok(venv: Path) -> bool:
    """Return whether *venv* carries a sentinel for the current requirement."""
    try:
        record = json.loads((venv / SENTINEL_NAME).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(record, dict) and record.get("requirement") == PAWNQUEUE_REQUIREMENT


def _build_venv(venv: Path) -> dict[str, str]:
    """(Re)create *venv* with pawn-queue installed; return the installed versions."""
    (venv / SENTINEL_NAME).unlink(missing_ok=True)
    if venv.exists():
        shutil.rmtree(venv)
    _run([sys.executable, "-m", "venv", str(venv)], "create venv")
    python = str(_venv_python(venv))
    pip = [python, "-m", "pip", "--disable-pip-version-check", "--no-input"]
    install = [*pip, "install", PAWNQUEUE_REQUIREMENT]
    try:
        _run(install, "pip install")
    except InteropError:
        # An old bundled pip may not handle today's index or wheels: upgrade, retry once.
        _run([*pip, "install", "-U", "pip"], "upgrade pip")
        _run(install, "pip install (after upgrading pip)")
    versions = _check_venv(venv)
    if versions is None:
        raise InteropError(f"pawn-queue venv at {venv} installed but does not import pawn_queue")
    return versions


_process_cache: dict[Path, Path] = {}
_process_lock = threading.Lock()


def pawnqueue_python() -> Path:
    """Return the Python of the pawn-queue venv, building it first if needed.

    Safe to call from parallel processes: one builds while the others wait on the lock.
    A venv found without a sentinel (another tool made it, or a build was interrupted)
    is adopted if pawn-queue imports there at the pinned version, else rebuilt.
    """
    venv = interop_venv_dir()
    with _process_lock:
        if venv in _process_cache:
            return _process_cache[venv]
        # Fast path, no lock: a builder removes the sentinel before it touches anything.
        # Only check that the interpreter still runs (importing pawn-queue costs 1-4 s).
        if _sentinel_ok(venv) and _interpreter_runs(venv):
            _process_cache[venv] = _venv_python(venv)
            return _process_cache[venv]
        venv.parent.mkdir(parents=True, exist_ok=True)
        lock_path = venv.with_name(venv.name + ".lock")
        with lock_path.open("a") as lock:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
            try:
                versions = _check_venv(venv)
                if versions is None:
                    versions = _build_venv(venv)
                if not _sentinel_ok(venv):
                    _write_sentinel(venv, versions)
            finally:
                fcntl.flock(lock.fileno(), fcntl.LOCK_UN)
        python = _venv_python(venv)
        _process_cache[venv] = python
        return python


def run_pawnqueue(
    script: str,
    config: dict[str, Any],
    *,
    args: dict[str, Any] | None = None,
    timeout: float = 120.0,
) -> dict[str, Any]:
    """Run *script* with pawn-queue's Python and return the JSON it emits last.

    The script runs after :data:`PRELUDE`, which provides ``CONFIG`` (*config*),
    ``ARGS`` (*args*, default ``{}``) and ``emit(result)``; both arrive as JSON on
    stdin. The last non-empty stdout line must be a JSON object.
    """
    python = pawnqueue_python()
    payload = json.dumps({"config": config, "args": args or {}})
    with tempfile.TemporaryDirectory(prefix="pawnq-interop-") as tmp:
        path = Path(tmp) / "script.py"
        path.write_text(PRELUDE + script)
        cmd = [str(python), "-I", str(path)]
        try:
            proc = _spawn(cmd, timeout, input=payload, cwd=tmp)
        except subprocess.TimeoutExpired as exc:
            raise InteropError(
                f"pawn-queue script timed out after {timeout:.0f} s\n"
                f"--- stdout ---\n{_text(exc.stdout)[-4000:]}\n"
                f"--- stderr ---\n{_text(exc.stderr)[-4000:]}"
            ) from exc
    if proc.returncode != 0:
        raise InteropError(
            f"pawn-queue script failed with exit {proc.returncode}\n"
            f"--- stdout ---\n{proc.stdout[-4000:]}\n--- stderr ---\n{proc.stderr[-8000:]}"
        )
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    try:
        result = json.loads(lines[-1])
    except (IndexError, ValueError) as exc:
        raise InteropError(
            "pawn-queue script did not end with a JSON line\n"
            f"--- stdout ---\n{proc.stdout[-4000:]}\n--- stderr ---\n{proc.stderr[-4000:]}"
        ) from exc
    if not isinstance(result, dict):
        raise InteropError(f"pawn-queue script emitted {type(result).__name__}, not an object")
    return result


def _text(data: str | bytes | None) -> str:
    """Return subprocess output as text whatever form it came in."""
    if data is None:
        return ""
    if isinstance(data, bytes):
        return data.decode(errors="replace")
    return data


def pawnqueue_config(config: dict[str, Any], strategy: str | None) -> dict[str, Any]:
    """Return *config* for pawn-queue: with *strategy* forced unless None.

    ``conditional_write`` avoids csprng_verify's jitter sleeps and auto's probe writes.
    """
    if strategy is None:
        return deep_merge(config, {})
    return deep_merge(config, {"concurrency": {"strategy": strategy}})


def pawnqueue_publish(
    config: dict[str, Any],
    topic: str,
    payloads: list[dict[str, Any]],
    *,
    producer: str = "interop-producer",
    strategy: str | None = "conditional_write",
    timeout: float = 120.0,
) -> list[str]:
    """Publish *payloads* to *topic* with pawn-queue (creating the topic); return the ids."""
    result = run_pawnqueue(
        _PUBLISH_SCRIPT,
        pawnqueue_config(config, strategy),
        args={"topic": topic, "payloads": payloads, "producer": producer},
        timeout=timeout,
    )
    ids: list[str] = result["ids"]
    return ids


def pawnqueue_consume(
    config: dict[str, Any],
    topic: str,
    max_messages: int,
    ack: bool = True,
    *,
    consumer: str = "interop-consumer",
    empty_polls: int = 3,
    poll_interval: float = 0.2,
    strategy: str | None = "conditional_write",
    timeout: float = 120.0,
) -> list[dict[str, Any]]:
    """Consume up to *max_messages* from *topic* with pawn-queue.

    Polls until *max_messages* arrived or *empty_polls* polls in a row found nothing
    (*poll_interval* s apart). Returns ``{id, payload, producer_id, created_at}`` dicts
    in the order received; acks each message first if *ack*.
    """
    if max_messages < 1 or empty_polls < 1:
        raise ValueError("max_messages and empty_polls must be >= 1")
    result = run_pawnqueue(
        _CONSUME_SCRIPT,
        pawnqueue_config(config, strategy),
        args={
            "topic": topic,
            "max_messages": max_messages,
            "ack": ack,
            "consumer": consumer,
            "empty_polls": empty_polls,
            "poll_interval": poll_interval,
        },
        timeout=timeout,
    )
    messages: list[dict[str, Any]] = result["messages"]
    return messages
