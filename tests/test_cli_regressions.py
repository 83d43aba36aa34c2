"""Regressions of ``pawnq``: output failures, partial publishes, exit codes, errors.

Every test runs the installed console entry point (the venv's ``pawnq``) in a
subprocess, as a user would, on the local store in a tmp dir (or on SeaweedFS where
the store's behaviour matters), and counts messages in the store afterwards.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pawn_queue_sync import cli, layout
from pawn_queue_sync.config import load_config
from pawn_queue_sync.errors import PublishError, StorageError
from pawn_queue_sync.queue import producer as producer_module
from pawn_queue_sync.queue.core import PawnQueue
from pawn_queue_sync.storage.memory import MemoryStore

PAWNQ = str(Path(sys.executable).with_name("pawnq"))
#: The documented statuses, spelled out so a test fails on a CLI that lacks them.
EXIT_BROKEN_PIPE = 128 + signal.SIGPIPE  # 141, as a shell reports a process killed by SIGPIPE
EXIT_HANDLER_IMPORT = 5


class Store:
    """Where a test's ``pawnq`` runs: the config file it is given and a way to count."""

    def __init__(self, tmp_path: Path, config: dict[str, Any]) -> None:
        self.tmp_path = tmp_path
        self.config = config
        self.config_file = tmp_path / "pawnq.yaml"
        self.config_file.write_text(json.dumps(config))  # JSON is YAML

    def env(self, *, buffered: bool = True) -> dict[str, str]:
        """The environment of a user's shell: no test variables; stdout buffered as
        Python buffers it by default (``PYTHONUNBUFFERED`` unset) unless asked."""
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("PAWNQUEUE_", "PYTHONUNBUFFERED"))}
        if not buffered:
            env["PYTHONUNBUFFERED"] = "1"
        return env

    def argv(self, *args: str) -> list[str]:
        return [PAWNQ, "--config", str(self.config_file), *args]

    def run(self, *args: str, stdin: str | None = None, stdin_fd: int | None = None,
            buffered: bool = True) -> subprocess.CompletedProcess[str]:
        """Run ``pawnq --config FILE ARGS``; stdin is ``stdin`` text, or the file
        descriptor ``stdin_fd``, or nothing (``/dev/null``)."""
        source: Any = {"input": stdin} if stdin is not None else {
            "stdin": subprocess.DEVNULL if stdin_fd is None else stdin_fd}
        return subprocess.run(self.argv(*args), capture_output=True, text=True,
                              env=self.env(buffered=buffered), cwd=self.tmp_path,
                              timeout=300, **source)

    def queue(self) -> PawnQueue:
        return PawnQueue(load_config(self.config))

    def stats(self, topic: str) -> dict[str, int]:
        with self.queue() as pq:
            return pq.topic_stats(topic)

    def pending_ids(self, topic: str) -> set[str]:
        with self.queue() as pq:
            keys = pq.store.list(layout.messages_prefix(topic)).objects
            return {json.loads(pq.store.get(info.key).body)["id"] for info in keys}

    def publish(self, topic: str, payloads: list[Any]) -> list[str]:
        with self.queue() as pq:
            pq.create_topic(topic)
            return pq.register_producer("test").publish_batch(topic, payloads)


@pytest.fixture
def local(tmp_path: Path) -> Store:
    return Store(tmp_path, {"local": {"path": str(tmp_path / "store")}})


@pytest.fixture(params=["local", "seaweedfs"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """The local store, then SeaweedFS (where releasing a lease is a conditional DELETE)."""
    if request.param == "local":
        yield Store(tmp_path, {"local": {"path": str(tmp_path / "store")}})
    else:
        yield Store(tmp_path, request.getfixturevalue("real_s3_config"))


def _ids(stdout: str) -> list[str]:
    return [json.loads(line)["id"] for line in stdout.splitlines()]


# -- 1. consume writes, flushes and checks its output before acking -----------------------


@pytest.mark.parametrize("buffered", [True, False], ids=["buffered", "unbuffered"])
def test_consume_to_a_full_disk_acks_nothing_and_releases_the_batch(
    store: Store, buffered: bool
) -> None:
    published = store.publish("t", [{"n": n} for n in range(10)])
    with open("/dev/full", "w") as full:
        proc = subprocess.run(store.argv("consume", "t", "--max", "10"), stdout=full,
                              stderr=subprocess.PIPE, text=True, env=store.env(buffered=buffered),
                              cwd=store.tmp_path, timeout=300)
    assert proc.returncode == cli.EXIT_ERROR, proc.stderr
    assert "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("pawnq:")]
    assert len(errors) == 1, proc.stderr
    assert "No space left on device" in errors[0] and "10 message(s)" in errors[0]
    # Nothing acked, nothing left leased: delivered again at once, all of them.
    assert store.stats("t") == {"pending": 10, "leased": 0, "dead_letter": 0}
    again = store.run("consume", "t", "--max", "100")
    assert again.returncode == cli.EXIT_OK, again.stderr
    assert sorted(_ids(again.stdout)) == sorted(published)
    assert store.stats("t")["pending"] == 0


def test_consume_into_a_pipe_closed_early_loses_nothing(store: Store) -> None:
    """The reader takes one line and goes away. Each message is larger than a pipe's
    buffer, so pawnq is still writing when the pipe closes; whatever it acked must
    have been read, and the rest must be pending and unleased."""
    big = "x" * 100_000
    published = store.publish("t", [{"n": n, "pad": big} for n in range(5)])
    proc = subprocess.Popen(store.argv("consume", "t", "--max", "5"), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=store.env(),
                            cwd=store.tmp_path)
    assert proc.stdout is not None and proc.stderr is not None
    first = json.loads(proc.stdout.readline())
    proc.stdout.close()
    stderr = proc.stderr.read()
    assert proc.wait(timeout=300) == EXIT_BROKEN_PIPE
    assert stderr == ""  # quiet, as Unix tools are: no traceback, no message
    pending = store.pending_ids("t")
    acked = set(published) - pending
    assert acked <= {first["id"]}  # only what the reader got may be gone
    assert store.stats("t") == {"pending": len(pending), "leased": 0, "dead_letter": 0}
    assert len(pending) == len(published) - len(acked) >= 4
    again = store.run("consume", "t", "--max", "100")
    assert sorted(_ids(again.stdout)) == sorted(pending)


# -- 4. a closed pipe is handled once, for every command ------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ["info"],
        ["topics"],
        ["topics", "--stats"],
        ["topics", "--create", "other"],
        ["dead-letter", "t"],
        ["consume", "t", "--max", "3"],
        ["consume", "t", "--max", "3", "--no-ack"],
        ["publish", "t", '{"a": 1}'],
        ["demo", "-n", "3", "--timeout", "60"],
        ["--help"],
    ],
    ids=lambda a: " ".join(a),
)
def test_every_command_into_a_closed_pipe_exits_quietly(local: Store, args: list[str]) -> None:
    local.publish("t", [{"n": n} for n in range(4)])
    with local.queue() as pq:  # one dead letter, for dead-letter to print
        (msg,) = pq.register_consumer("test", ["t"]).poll(max_messages=1)
        msg.nack("for the test")
    proc = subprocess.Popen(local.argv(*args), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=local.env(), cwd=local.tmp_path)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # no reader at all: the first write fails with EPIPE
    stderr = proc.stderr.read()
    assert proc.wait(timeout=300) == EXIT_BROKEN_PIPE, stderr
    assert stderr == ""
    if args[0] == "consume":  # nothing written, so nothing acked and nothing left leased
        assert local.stats("t") == {"pending": 3, "leased": 0, "dead_letter": 1}


def test_demo_with_zero_messages_returns_at_once(local: Store) -> None:
    # With the bug the demo waited for messages that never came until --timeout, then
    # reported failure (exit 1); the exit status tells the two apart, no clock needed.
    proc = local.run("demo", "-n", "0", "--timeout", "5", "--path", str(local.tmp_path / "d"))
    assert proc.returncode == cli.EXIT_OK, proc.stdout + proc.stderr
    assert "published 0" in proc.stdout and "consumed 0" in proc.stdout
    negative = local.run("demo", "-n", "-1", "--timeout", "5")
    assert negative.returncode == cli.EXIT_USAGE
    assert "must be >= 0" in negative.stderr


# -- 2. a partly failed publish prints what it published ------------------------------------


def _limit_file_size() -> None:
    """In the child: files may not grow past 8 KiB (writes beyond fail with EFBIG;
    Python ignores SIGXFSZ), so large messages fail to publish and small ones don't."""
    resource.setrlimit(resource.RLIMIT_FSIZE, (8192, 8192))


def test_partly_failed_publish_prints_the_published_ids(local: Store) -> None:
    local.publish("t", [])
    small, big = "s", "b" * 10_000
    payloads = [{"n": n, "pad": big if n % 3 == 1 else small} for n in range(60)]
    stdin = "".join(json.dumps(p) + "\n" for p in payloads)
    proc = subprocess.run(local.argv("publish", "t"), input=stdin, capture_output=True,
                          text=True, env=local.env(), cwd=local.tmp_path, timeout=300,
                          preexec_fn=_limit_file_size)
    assert proc.returncode == cli.EXIT_ERROR
    printed = proc.stdout.split()
    # the ids printed are exactly the messages in the store, in input order
    assert len(printed) == 40 and set(printed) == local.pending_ids("t")
    with local.queue() as pq:
        by_id = {}
        for info in pq.store.list(layout.messages_prefix("t")).objects:
            doc = json.loads(pq.store.get(info.key).body)
            by_id[doc["id"]] = doc["payload"]["n"]
    assert [by_id[i] for i in printed] == [n for n in range(60) if n % 3 != 1]
    errors = proc.stderr.strip().splitlines()
    assert len(errors) == 1 and "Traceback" not in proc.stderr
    assert "20 of 60" in errors[0] and "not published" in errors[0]
    assert "#1, #4, #7" in errors[0]  # which payloads (0-based, input order) to re-send


# -- 3. the partial-failure report is linear ----------------------------------------------


def test_half_failing_large_batch_reports_exactly_and_linearly(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """20 000 messages, every other write fails. The error must list exactly the
    failed indices and the published ids in input order; and building the report
    must touch each index a bounded number of times (it used to rebuild
    ``set(failed)`` for every id: 10 000 x 20 000 element copies)."""
    n = 20_000
    failing: set[str] = set()

    def fail_odd_payloads(op: str, key: str) -> None:
        if op == "put" and key in failing:
            raise StorageError("injected failure", key=key)

    copied = 0
    real_set = set

    def counting_set(items: Any = ()) -> set[Any]:
        nonlocal copied
        built = real_set(items)
        copied += len(built)
        return built

    with PawnQueue(load_config({}), store=MemoryStore(hooks=fail_odd_payloads)) as pq:
        pq.create_topic("t")
        producer = pq.register_producer("p")
        real_encode = producer._encode

        def encode(topic: str, payload: Any, *args: Any) -> tuple[str, bytes, str]:
            key, body, mid = real_encode(topic, payload, *args)
            if payload % 2:
                failing.add(key)
            return key, body, mid

        monkeypatch.setattr(producer, "_encode", encode)
        monkeypatch.setattr(producer_module, "set", counting_set, raising=False)
        with pytest.raises(PublishError) as info:
            producer.publish_batch("t", list(range(n)))
        monkeypatch.undo()
        err = info.value
        assert err.failed_indices == list(range(1, n, 2))  # type: ignore[attr-defined]
        stored = {
            json.loads(pq.store.get(o.key).body)["id"]: json.loads(pq.store.get(o.key).body)
            for o in pq.store.list(layout.messages_prefix("t")).objects
        }
        published = err.published_ids  # type: ignore[attr-defined]
        assert len(published) == len(stored) == n // 2
        assert [stored[m]["payload"] for m in published] == list(range(0, n, 2))
        assert f"{n // 2} of {n} messages" in str(err)
    assert copied <= n  # linear; the quadratic report copied 10 000 x 10 000 indices


# -- 5. exit codes --------------------------------------------------------------------------


def test_worker_handler_import_failure_has_its_own_exit_code(local: Store) -> None:
    local.publish("t", [])
    proc = local.run("worker", "no_such_module_xyz:handle", "--topic", "t", "--processes", "1")
    assert proc.returncode == EXIT_HANDLER_IMPORT
    assert "no_such_module_xyz" in proc.stderr and "Traceback" not in proc.stderr
    usage = local.run("worker", "--topic", "t")  # no handler: argparse's usage error
    assert usage.returncode == cli.EXIT_USAGE
    # the pool's other statuses pass through unchanged, as documented
    from pawn_queue_sync import workers

    assert (cli.EXIT_OK, cli.EXIT_ERROR, cli.EXIT_STORE_UNREACHABLE, cli.EXIT_CONFIG,
            cli.EXIT_HANDLER_IMPORT) == (
        workers.RET_OK, workers.RET_KILLED, workers.RET_CONNECT, workers.RET_CONFIG,
        workers.RET_IMPORT)
    assert cli.EXIT_USAGE not in {workers.RET_OK, workers.RET_KILLED, workers.RET_IMPORT,
                                  workers.RET_CONNECT, workers.RET_CONFIG}


def test_exit_codes_are_documented() -> None:
    """Every EXIT_* constant appears, with its number, in the CLI's documentation."""
    doc = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    section = doc[doc.index("## The CLI"):doc.index("## Errors")]
    codes = {name: value for name, value in vars(cli).items() if name.startswith("EXIT_")}
    assert codes["EXIT_BROKEN_PIPE"] == EXIT_BROKEN_PIPE
    assert codes["EXIT_HANDLER_IMPORT"] == EXIT_HANDLER_IMPORT
    assert len(set(codes.values())) == len(codes)  # one meaning per number
    for name, value in codes.items():
        assert f"| {value} |" in section and name in section, name


# -- 6. errors: one line, a traceback only with --verbose -----------------------------------


def test_errors_are_one_line_unless_verbose(local: Store) -> None:
    # stdin open for writing only (`pawnq publish t 0>file`): reading it is an OSError,
    # not a PawnQueueError, and it used to end in a traceback
    local.publish("t", [])
    fd = os.open(local.tmp_path / "write-only", os.O_WRONLY | os.O_CREAT)
    try:
        quiet = local.run("publish", "t", stdin=None, stdin_fd=fd)
        verbose = local.run("--verbose", "publish", "t", stdin=None, stdin_fd=fd)
    finally:
        os.close(fd)
    assert quiet.returncode == cli.EXIT_ERROR
    assert quiet.stderr.count("\n") == 1 and quiet.stderr.startswith("pawnq: ")
    assert "Bad file descriptor" in quiet.stderr and "Traceback" not in quiet.stderr
    assert verbose.returncode == cli.EXIT_ERROR
    assert "Traceback" in verbose.stderr and "Bad file descriptor" in verbose.stderr
    ghost = local.run("--verbose", "publish", "ghost", "{}")
    assert ghost.returncode == cli.EXIT_ERROR
    assert "TopicNotFoundError" in ghost.stderr and "Traceback" in ghost.stderr
