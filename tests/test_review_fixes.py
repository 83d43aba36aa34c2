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


@pytest.mark.parametrize("strategy", ["conditional_write", "csprng_verify"])
def test_a_poll_whose_claims_all_fail_raises_instead_of_looking_empty(strategy: str) -> None:
    """On a full disk every claim's lease write failed, and ``poll()`` returned [] as if
    the topic were empty (``pawnq consume`` exited 0 with messages pending)."""
    full = False

    def disk(op: str, key: str) -> None:
        if full and op == "put" and "/leases/" in key:
            raise StoreFull("put failed: disk full (ENOSPC)", key=key)

    config = {"concurrency": {"strategy": strategy,
                              "csprng_verify": {"jitter_min_ms": 5, "jitter_max_ms": 10}}}
    with PawnQueue(config, store=MemoryStore(hooks=disk)) as pq:
        assert pq.strategy == strategy
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
    from pawn_queue_sync.workers import WorkerPool

    with pytest.raises(ValueError, match="handler_timeout_secs"):
        WorkerPool({}, ["orders"], "tests.runtime_handlers:record",
                   listener_options={"handler_timeout_secs": 300})
    with pytest.raises(ValueError, match="max_workers"):  # the pool sets it: threads=
        WorkerPool({}, ["orders"], "tests.runtime_handlers:record",
                   listener_options={"max_workers": 3})
    pool = WorkerPool({}, ["orders"], "tests.runtime_handlers:record",
                      listener_options={"handler_timeout_seconds": 300, "idle_timeout_seconds": 1})
    assert pool is not None


@pytest.mark.parametrize("second", ["ack", "nack"])
def test_a_second_settle_during_a_failing_ack_waits_and_does_its_work(second: str) -> None:
    """An ``ack()`` or ``nack()`` called while another ack of the message was under way
    returned at once having done nothing; when the first ack then failed, the message
    stayed leased though the caller was told it was settled."""
    import threading

    from tests.threads import join, run_in_thread, wait_until

    first = {"blocked": True}
    entered, release = threading.Event(), threading.Event()

    def hook(op: str, key: str) -> None:
        if op.startswith("delete") and "/messages/" in key and first["blocked"]:
            first["blocked"] = False
            entered.set()
            assert release.wait(30)
            raise StorageError("the first ack's DELETE failed", key=key)

    with PawnQueue({}, store=MemoryStore(hooks=hook)) as pq:
        pq.create_topic("orders")
        pq.register_producer("p").publish("orders", {"n": 1})
        [msg] = pq.register_consumer("c", ["orders"]).poll()
        outcome: dict[str, object] = {}

        def first_ack() -> None:
            try:
                msg.ack()
            except StorageError as exc:
                outcome["first"] = exc

        a = run_in_thread(first_ack)
        assert entered.wait(30)
        b = run_in_thread(lambda: getattr(msg, second)())
        wait_until(lambda: not b.is_alive() or msg.settling, "the second call to start")
        assert b.is_alive(), "the second call returned while the first ack was under way"
        release.set()
        join(a)
        join(b)
        assert isinstance(outcome["first"], StorageError)
        assert msg.state == ("acked" if second == "ack" else "nacked")
        assert pq.topic_stats("orders") == {
            "pending": 0, "leased": 0, "dead_letter": 1 if second == "nack" else 0}


def test_a_server_that_sends_no_last_modified_still_serves_polls_and_registrations() -> None:
    """With ``LastModified`` missing (None, never the client clock), the registry's rank
    and re-registration subtracted None from a datetime: every poll that found messages
    with a peer registered raised TypeError, and drain() never returned."""
    import attrs

    from pawn_queue_sync.runtime import drain

    class NoLastModified(MemoryStore):
        def list(self, prefix: str, **kwargs: object):  # type: ignore[no-untyped-def]
            listing = super().list(prefix, **kwargs)  # type: ignore[arg-type]
            objects = [attrs.evolve(o, last_modified=None) for o in listing.objects]
            return attrs.evolve(listing, objects=objects)

        def get(self, key: str):  # type: ignore[no-untyped-def]
            return attrs.evolve(super().get(key), last_modified=None)

    with PawnQueue({}, store=NoLastModified()) as pq:
        pq.create_topic("orders")
        pq.register_producer("p").publish_batch("orders", [{"n": i} for i in range(5)])
        pq.register_consumer("peer", ["orders"])
        pq.register_consumer("c", ["orders"])
        consumer = pq.register_consumer("c", ["orders"])  # registering again
        result = drain(consumer, lambda msg: None, idle_timeout_seconds=0.3)
        assert result.processed == 5
        assert pq.topic_stats("orders") == {"pending": 0, "leased": 0, "dead_letter": 0}


def test_drain_returns_when_the_store_stays_down_for_its_idle_timeout() -> None:
    """``drain(idle_timeout_s=...)`` (and ``listen(idle_timeout=...)``) never returned
    while every poll failed: the error branch skipped the idle check."""
    from pawn_queue_sync import StoreUnavailable
    from pawn_queue_sync.runtime.listen import Listener
    from tests.threads import join, run_in_thread

    down = {"on": False}

    def hook(op: str, key: str) -> None:
        if down["on"] and op == "list":
            raise StoreUnavailable("the server went away")

    with PawnQueue({}, store=MemoryStore(hooks=hook)) as pq:
        pq.create_topic("orders")
        consumer = pq.register_consumer("c", ["orders"])
        down["on"] = True
        listener = Listener(consumer, lambda msg: None, idle_timeout_seconds=0.5)
        join(run_in_thread(listener.run), timeout=30)
        assert listener.stats.poll_errors >= 1 and listener.stats.processed == 0


@pytest.mark.parametrize(
    "password", ["S3CRETpw#1", "S3CRETpw?1", "S3CRETpw/1", "S3CRET pw", "S3CRET\tpw", "x:S3CRETpw"]
)
def test_an_endpoint_password_with_url_delimiters_is_refused_unshown(password: str) -> None:
    """A raw '#', '?' or '/' in the endpoint's password ended the masked part early: the
    password showed in ``repr(config)`` and errors (or became an untyped ValueError)."""
    from pawn_queue_sync import ConfigError, load_config

    url = f"http://user:{password}@127.0.0.1:9000"
    if password.startswith("x:"):  # a ':' is fine: the whole userinfo is masked
        config = load_config({"s3": {"endpoint_url": url, "bucket_name": "my-queue"}})
        assert "S3CRETpw" not in repr(config)
        return
    with pytest.raises(ConfigError, match="percent-encode") as info:  # and not shown
        load_config({"s3": {"endpoint_url": url, "bucket_name": "my-queue"}})
    assert "S3CRETpw" not in str(info.value)


def test_a_lease_about_to_reach_its_fence_does_not_fail_its_whole_ack_batch() -> None:
    """An ack batch is sent before the fence of its oldest lease; one lease with 10 ms
    of fence left among 50 fresh ones made the whole batch miss that deadline."""
    import time

    def slow_deletes(op: str, key: str) -> None:
        if op.startswith("delete"):
            time.sleep(0.02)

    with PawnQueue({}, store=MemoryStore(hooks=slow_deletes)) as pq:
        pq.create_topic("orders")
        pq.register_producer("p").publish_batch("orders", [{"n": i} for i in range(51)])
        consumer = pq.register_consumer("c", ["orders"])
        msgs = consumer.poll(51)
        assert len(msgs) == 51
        ctx = consumer.context
        window = ctx.visibility - ctx.fence_margin()
        msgs[0].lease_written_at = ctx.clock.monotonic() - window + 0.01
        consumer.ack_many(msgs)
        assert all(m.state == "acked" for m in msgs)
        assert pq.topic_stats("orders") == {"pending": 0, "leased": 0, "dead_letter": 0}


def test_a_nack_in_a_child_forked_during_an_ack_does_not_hang() -> None:
    """A fork while an ack was deleting the message's lease: the child's copy of the
    message was acked but still marked as being settled, and ``nack()`` there waited
    forever for an ack that does not exist in the child."""
    import os
    import signal
    import threading

    from tests.threads import join, run_in_thread

    in_lease_delete, go_on = threading.Event(), threading.Event()

    def hook(op: str, key: str) -> None:
        if op.startswith("delete") and "/leases/" in key:
            in_lease_delete.set()
            assert go_on.wait(30)

    with PawnQueue({}, store=MemoryStore(hooks=hook)) as pq:
        pq.create_topic("orders")
        pq.register_producer("p").publish("orders", {"n": 1})
        [msg] = pq.register_consumer("c", ["orders"]).poll()
        acking = run_in_thread(msg.ack)
        assert in_lease_delete.wait(30)
        pid = os.fork()
        if pid == 0:  # the child: only this thread exists
            signal.alarm(10)
            try:
                msg.nack("in the child")
                os._exit(0 if msg.state == "acked" else 3)
            except BaseException:
                os._exit(4)
        go_on.set()
        join(acking)
        _, status = os.waitpid(pid, 0)
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status


def test_a_passing_poll_failure_does_not_end_a_drain_that_found_nothing_yet() -> None:
    """Counting failing polls toward idleness made ``drain(idle_timeout_s=0)`` give up
    after one transient error, with every message still pending."""
    from pawn_queue_sync import StoreUnavailable
    from pawn_queue_sync.runtime import drain

    blips = {"left": 1}

    def hook(op: str, key: str) -> None:
        if op == "list" and "/messages/" in key and blips["left"]:
            blips["left"] -= 1
            raise StoreUnavailable("503 SlowDown, once")

    with PawnQueue({}, store=MemoryStore(hooks=hook)) as pq:
        pq.create_topic("orders")
        pq.register_producer("p").publish_batch("orders", [{"n": i} for i in range(20)])
        result = drain(pq.register_consumer("c", ["orders"]), lambda m: None,
                       idle_timeout_seconds=0)
        assert (result.processed, result.poll_errors) == (20, 1)
        assert pq.topic_stats("orders")["pending"] == 0


def test_ctrl_c_during_a_csprng_batch_claim_gives_back_its_leases() -> None:
    """With csprng_verify a poll's batch claim runs on the caller's thread: Ctrl-C during
    its verification left every lease it wrote, so the messages stayed invisible for a
    visibility timeout and then counted an abandoned delivery each."""
    interrupt = {"armed": False, "wrote": False}

    def hook(op: str, key: str) -> None:
        if not interrupt["armed"] or "/leases/" not in key:
            return
        if op == "put":
            interrupt["wrote"] = True
        elif op == "list" and interrupt["wrote"]:  # a verification round
            interrupt["armed"] = False
            raise KeyboardInterrupt  # as a signal would, in the polling thread

    config = {"concurrency": {"strategy": "csprng_verify",
                              "csprng_verify": {"jitter_min_ms": 5, "jitter_max_ms": 10}}}
    with PawnQueue(config, store=MemoryStore(hooks=hook)) as pq:
        pq.create_topic("orders")
        pq.register_producer("p").publish_batch("orders", [{"n": i} for i in range(10)])
        consumer = pq.register_consumer("c", ["orders"])
        consumer.poll(1)[0].release()  # the first poll lists leases before it claims
        interrupt["armed"] = True
        with pytest.raises(KeyboardInterrupt):
            consumer.poll(10)
        assert not interrupt["armed"], "the verification listing never ran"
        assert pq.topic_stats("orders") == {"pending": 10, "leased": 0, "dead_letter": 0}
        again = consumer.poll(10)
        assert len(again) == 10 and all(m.delivery_count == 1 for m in again)


def test_verbose_before_and_after_the_command_add_up() -> None:
    args = cli.build_parser().parse_args(["-vv", "consume", "orders", "-v"])
    assert args.verbose + args.verbose_after == 3


def test_demo_into_a_pipe_prints_no_empty_lines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The progress bar is shown on a terminal only, but its line ends were printed
    everywhere: two empty lines in a file or a pipe."""
    monkeypatch.chdir(tmp_path)
    assert cli.main(["demo", "-n", "3"]) == cli.EXIT_OK
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3 and "" not in lines, lines
