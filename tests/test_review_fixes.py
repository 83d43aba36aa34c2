"""Defects a newcomer's review found after the correctness fixes, each reproduced here."""

from __future__ import annotations

from pathlib import Path

import pytest

from pawn_queue_sync import PawnQueue, StorageError, StoreFull, cli
from pawn_queue_sync.queue.consumer import Consumer
from pawn_queue_sync.storage.memory import MemoryStore


def test_ctrl_c_in_a_consume_poll_gives_back_what_it_claimed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Ctrl-C while ``pawnq consume`` polled once left the poll's claims leased: invisible
    for a visibility timeout, then counted as abandoned deliveries."""
    config = tmp_path / "c.yaml"
    config.write_text(f"local:\n  path: {tmp_path / 'store'}\n")
    with PawnQueue(config) as pq:
        pq.create_topic("orders")
        pq.register_producer("p").publish_batch("orders", [{"n": i} for i in range(30)])
    real_poll = Consumer.poll
    polls = []

    def poll_then_interrupt(self: Consumer, max_messages: int | None = None) -> list:
        got = real_poll(self, max_messages)
        polls.append(len(got))
        raise KeyboardInterrupt  # the poll claimed, then Ctrl-C arrives
        return got

    monkeypatch.setattr(Consumer, "poll", poll_then_interrupt)
    status = cli.main(["-c", str(config), "consume", "orders", "--max", "30"])
    monkeypatch.undo()
    printed = [line for line in capsys.readouterr().out.splitlines() if line]
    assert status == cli.EXIT_INTERRUPTED
    assert polls == [30] and printed == []
    with PawnQueue(config) as pq:
        assert pq.topic_stats("orders") == {
            "pending": 30 - len(printed), "leased": 0, "dead_letter": 0}
        again = pq.register_consumer("pawnq-cli", ["orders"]).poll(30)
        assert len(again) == 30 - len(printed)
        assert all(m.delivery_count == 1 for m in again)  # nothing counted as abandoned


def test_a_poll_whose_claims_all_fail_raises_instead_of_looking_empty() -> None:
    """On a full disk every claim's lease write failed, and ``poll()`` returned [] as if
    the topic were empty (``pawnq consume`` exited 0 with messages pending)."""
    full = False

    def disk(op: str, key: str) -> None:
        if full and op == "put" and "/leases/" in key:
            raise StoreFull("put failed: disk full (ENOSPC)", key=key)

    with PawnQueue({}, store=MemoryStore(hooks=disk)) as pq:
        pq.create_topic("orders")
        pq.register_producer("p").publish_batch("orders", [{"n": i} for i in range(3)])
        consumer = pq.register_consumer("c", ["orders"])
        full = True
        with pytest.raises(StorageError, match="disk full"):
            consumer.poll()
        full = False
        assert len(consumer.poll()) == 3


def test_debug_tracebacks_never_show_the_endpoints_password() -> None:
    """``pawnq -vv`` printed botocore's DEBUG traceback of a connection error, which
    quotes the endpoint URL with its userinfo: the message was masked, the traceback not."""
    import io
    import logging

    from pawn_queue_sync import StoreUnavailable
    from tests.servers import closed_port

    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(logging.Formatter("%(name)s %(levelname)s %(message)s"))
    root = logging.getLogger()
    old_level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    try:
        config = {"s3": {
            "endpoint_url": f"http://alice:TOPSECRETPW@127.0.0.1:{closed_port()}",
            "bucket_name": "my-queue", "aws_access_key_id": "AKIAREVIEWTEST000001",
            "aws_secret_access_key": "SECRETKEY0", "connect_timeout_seconds": 0.5,
            "max_attempts": 1, "fast_path": False,
        }}
        with pytest.raises(StoreUnavailable) as info:
            PawnQueue(config).setup()
    finally:
        root.removeHandler(handler)
        root.setLevel(old_level)
    logged = out.getvalue()
    assert "Traceback" in logged and "127.0.0.1" in logged  # botocore logged its traceback
    assert "TOPSECRETPW" not in logged and "SECRETKEY0" not in logged
    assert "TOPSECRETPW" not in str(info.value)


def test_config_after_the_command_and_demo_honours_the_local_path_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``pawnq consume orders --config c.yaml`` was a usage error (only ``worker`` took
    it after the command), and ``pawnq demo`` ignored ``PAWNQUEUE_LOCAL_PATH``."""
    config = tmp_path / "c.yaml"
    config.write_text(f"local:\n  path: {tmp_path / 'store'}\n")
    assert cli.main(["topics", "--create", "orders", "-c", str(config)]) == cli.EXIT_OK
    assert cli.main(["publish", "orders", '{"a": 1}', "--config", str(config)]) == 0
    capsys.readouterr()
    assert cli.main(["consume", "orders", "-c", str(config), "-v"]) == cli.EXIT_OK
    assert '"payload": {"a": 1}' in capsys.readouterr().out
    monkeypatch.setenv("PAWNQUEUE_LOCAL_PATH", str(tmp_path / "from-env"))
    monkeypatch.chdir(tmp_path)
    assert cli.main(["demo", "-n", "3"]) == cli.EXIT_OK
    assert f"local:{tmp_path / 'from-env'}" in capsys.readouterr().out
    assert not (tmp_path / ".pawnqueue").exists()


def test_a_misspelled_listener_option_is_refused_before_any_worker_starts() -> None:
    """``WorkerPool(listener_options={"handler_timeout_secs": 300})`` was accepted, and
    every child then died of a TypeError until the pool gave up."""
    from pawn_queue_sync.runtime.workers import WorkerPool

    with pytest.raises(ValueError, match="handler_timeout_secs"):
        WorkerPool({}, ["orders"], "tests.runtime_handlers:record",
                   listener_options={"handler_timeout_secs": 300})
    with pytest.raises(ValueError, match="max_workers"):  # the pool sets it: threads=
        WorkerPool({}, ["orders"], "tests.runtime_handlers:record",
                   listener_options={"max_workers": 3})
    pool = WorkerPool({}, ["orders"], "tests.runtime_handlers:record",
                      listener_options={"handler_timeout_seconds": 300, "idle_timeout": 1})
    assert pool is not None
