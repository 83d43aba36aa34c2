"""``pawnq stats [TOPIC] [--watch [SECONDS]] [--json]``, and ``--json`` with one-line
errors on every read command (``peek``, ``dead-letter list``, ``topics``, ``stats``),
run as a user runs them, on the local store and SeaweedFS."""

from __future__ import annotations

import json
import os
import pty
import select
import signal
import subprocess
import time
from typing import Any

import pytest

from pawn_queue_sync import cli
from tests.servers import deep_merge
from tests.test_cli_deadletters import nacked, one_line_error
from tests.test_cli_regressions import Store, local, store  # noqa: F401  (the fixtures)


def _shell_sigint() -> None:
    """In the child before exec: SIGINT unblocked and at its default, as a user's shell
    starts a command. An ignored SIGINT survives exec: a runner started in the
    background (``nohup .ci/run &``) gives pytest, its workers and their children SIGINT
    ignored, and the watch then refreshed on after its Ctrl-C (conftest's
    pytest_configure restores it in the workers too)."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    signal.signal(signal.SIGINT, signal.SIG_DFL)

TOPIC = "orders"
DEADLINE = 60.0


def held_by_a_consumer(store: Store, n: int) -> list[str]:  # noqa: F811
    """Publish 10 messages to TOPIC, hold ``n`` of them under live leases (a consumer
    that polls and keeps them); their ids. The leases outlive the test: ``store`` has
    :func:`long_leases`."""
    store.publish(TOPIC, [{"n": i} for i in range(10)])
    with store.queue() as pq:
        consumer = pq.register_consumer("holder", [TOPIC])
        got: list[str] = []
        end = time.monotonic() + DEADLINE
        while len(got) < n:
            assert time.monotonic() < end
            got += [m.id for m in consumer.poll(max_messages=n - len(got))]
    return got


def long_leases(store: Store) -> Store:  # noqa: F811
    """``store`` with 10-minute leases (its config file rewritten): a slow run under
    load does not see a held message's lease go stale, and its message pending again."""
    return Store(store.tmp_path, deep_merge(store.config,
                                            {"polling": {"visibility_timeout_seconds": 600}}))


def test_stats_shows_each_topic_and_consumer(store: Store) -> None:  # noqa: F811
    store = long_leases(store)
    nacked(store, 2)  # orders: 2 dead letters
    held_by_a_consumer(store, 3)  # and 10 more, 3 of them held
    store.publish("other", [1, 2])
    shown = store.run("stats")
    assert shown.returncode == cli.EXIT_OK, shown.stderr
    rows = {line.split()[0]: line.split() for line in shown.stdout.splitlines()
            if line.strip().startswith((TOPIC, "other"))}
    assert rows[TOPIC][:6] == [TOPIC, "plain", "7", "3", "0", "2"]
    assert rows["other"][:6] == ["other", "plain", "2", "0", "0", "0"]
    assert "holder" in shown.stdout and "nacker" in shown.stdout
    assert "consumers (2 alive of 2)" in shown.stdout

    one = store.run("stats", TOPIC, "--json")
    doc = json.loads(one.stdout)
    assert (doc["pending"], doc["in_flight"], doc["dead_lettered"], doc["delayed"]) == (7, 3, 2, 0)
    assert sorted(c["name"] for c in doc["consumers"]) == ["holder", "nacker"]
    every = json.loads(store.run("stats", "--json").stdout)
    assert [(d["topic"], d["pending"]) for d in every] == [("orders", 7), ("other", 2)]


def test_watch_prints_a_json_line_per_refresh_until_ctrl_c(store: Store) -> None:  # noqa: F811
    store.publish(TOPIC, [{"n": i} for i in range(4)])
    proc = subprocess.Popen(store.argv("stats", "--watch", "1", TOPIC, "--json"),
                            preexec_fn=_shell_sigint,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=store.env(), cwd=store.tmp_path)
    try:
        assert proc.stdout is not None
        assert json.loads(proc.stdout.readline())["pending"] == 4
        store.publish(TOPIC, [5, 6])
        end = time.monotonic() + DEADLINE
        while json.loads(proc.stdout.readline())["pending"] != 6:  # a later refresh
            assert time.monotonic() < end
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == cli.EXIT_OK and err == ""


def test_watch_appends_a_table_per_refresh_into_a_pipe(local: Store) -> None:  # noqa: F811
    local.publish(TOPIC, [1, 2, 3])
    proc = subprocess.Popen(local.argv("stats", "--watch", "1"), preexec_fn=_shell_sigint,
                            stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=local.env(buffered=False),
                            cwd=local.tmp_path)
    try:
        assert proc.stdout is not None
        tables = 0
        while tables < 2:  # two refreshes, one after the other
            line = proc.stdout.readline()
            assert line, "the watch ended by itself"
            if line.split()[:3] == [TOPIC, "plain", "3"]:
                tables += 1
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == cli.EXIT_OK and err == ""
    assert "\x1b" not in out  # no terminal codes into a pipe


def test_watch_redraws_in_place_on_a_terminal(local: Store) -> None:  # noqa: F811
    local.publish(TOPIC, [1])
    leader, follower = pty.openpty()
    proc = subprocess.Popen(local.argv("stats", "--watch", "1"), preexec_fn=_shell_sigint,
                            stdin=follower,
                            stdout=follower, stderr=follower, env=local.env(),
                            cwd=local.tmp_path)
    os.close(follower)
    out = b""
    try:
        end = time.monotonic() + DEADLINE
        while out.count(b"requests") < 3:
            assert time.monotonic() < end, out
            if select.select([leader], [], [], 1.0)[0]:
                out += os.read(leader, 65536)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == cli.EXIT_OK
    finally:
        proc.kill()
        os.close(leader)
    assert b"\x1b[1A" in out  # the cursor went back up: drawn again in place
    assert b"orders" in out and b"Traceback" not in out


def test_watch_takes_the_word_after_it_as_the_topic(local: Store) -> None:  # noqa: F811
    """``--watch`` takes an optional number: ``pawnq stats --watch orders`` watches
    orders (every 5 s), and a bad interval is a usage error."""
    local.publish(TOPIC, [1, 2])
    proc = subprocess.Popen(local.argv("stats", "--watch", TOPIC, "--json"),
                            preexec_fn=_shell_sigint,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=local.env(), cwd=local.tmp_path)
    try:
        assert proc.stdout is not None
        assert json.loads(proc.stdout.readline())["topic"] == TOPIC
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == cli.EXIT_OK
    for bad in ("0", "-1", "nan", "inf", "abc"):
        got = local.run("stats", TOPIC, "--watch", bad)
        assert got.returncode == cli.EXIT_USAGE, (bad, got.stderr)
        assert got.stdout == "" and "--watch" in got.stderr
    assert local.run("stats", "--max-keys", "0").returncode == cli.EXIT_USAGE


def test_topics_json(store: Store) -> None:  # noqa: F811
    created = store.run("topics", "--create", "a", "b", "--json")
    assert [json.loads(x) for x in created.stdout.splitlines()] == [
        {"topic": "a", "created": True, "switched": False},
        {"topic": "b", "created": True, "switched": False}]
    store.publish("a", [1, 2, 3])
    listed = store.run("topics", "--json")
    assert [json.loads(x) for x in listed.stdout.splitlines()] == [{"topic": "a"},
                                                                   {"topic": "b"}]
    counted = store.run("topics", "--stats", "--json")
    assert json.loads(counted.stdout.splitlines()[0]) == {
        "topic": "a", "pending": 3, "leased": 0, "dead_letter": 0}
    deleted = store.run("topics", "--delete", "b", "--json")
    assert json.loads(deleted.stdout) == {"topic": "b", "deleted": 1}


READ_COMMANDS: list[list[str]] = [
    ["peek", "ghost", "--json"],
    ["peek", "ghost", "--dead-letter", "--json"],
    ["dead-letter", "list", "ghost", "--json"],
    ["stats", "ghost", "--json"],
    ["stats", "ghost", "--watch", "1", "--json"],
    ["topics", "--delete", "ghost", "--json"],
]


@pytest.mark.parametrize("args", READ_COMMANDS, ids=lambda a: " ".join(a))
def test_read_commands_fail_in_one_line_unless_verbose(
    local: Store, args: list[str]  # noqa: F811
) -> None:
    local.publish(TOPIC, [])
    quiet = local.run(*args)
    one_line_error(quiet, cli.EXIT_ERROR, "TopicNotFoundError", "ghost")
    assert quiet.stdout == ""
    verbose = local.run(*args, "--verbose")
    assert verbose.returncode == cli.EXIT_ERROR and "Traceback" in verbose.stderr


def test_read_commands_on_an_unreachable_store_fail_in_one_line(local: Store) -> None:  # noqa: F811
    config: dict[str, Any] = {"s3": {"endpoint_url": "http://127.0.0.1:9", "bucket_name": "bucket",
                                     "aws_access_key_id": "x", "aws_secret_access_key": "y",
                                     "max_attempts": 1, "connect_timeout_seconds": 1}}
    gone = Store(local.tmp_path, config)
    for args in (["stats", "--json"], ["topics", "--json"], ["peek", TOPIC, "--json"],
                 ["dead-letter", "list", TOPIC, "--json"]):
        one_line_error(gone.run(*args), cli.EXIT_ERROR, "StoreUnavailable")
