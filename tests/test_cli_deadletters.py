"""``pawnq dead-letter list|redrive|purge``, ``pawnq peek`` and ``pawnq topics --delete``,
run as a user runs them, on the local store and SeaweedFS."""

from __future__ import annotations

import contextlib
import json
import os
import pty
import subprocess
import time
from pathlib import Path

import pytest

from pawn_queue_sync import cli, layout
from tests.test_cli_regressions import Store, store  # noqa: F401  (the fixture)

TOPIC = "orders"


def nacked(store: Store, n: int, reason: str = "broken order") -> list[str]:  # noqa: F811
    """Publish ``n`` messages and nack them all: their ids."""
    ids = store.publish(TOPIC, [{"n": i} for i in range(n)])
    with store.queue() as pq:
        consumer = pq.register_consumer("nacker", [TOPIC])
        done: set[str] = set()
        end = time.monotonic() + 60
        while not set(ids) <= done:  # (and whatever else was pending: nacked too)
            assert time.monotonic() < end, "the messages published never came"
            for msg in consumer.poll(max_messages=50):
                msg.nack(reason)
                done.add(msg.id)
    return ids


def listing(store: Store) -> dict[str, str]:  # noqa: F811
    with store.queue() as pq:
        return {o.key: o.etag for o in pq.store.list("").objects
                if not o.key.startswith("_registry/")}


def one_line_error(proc: subprocess.CompletedProcess[str], status: int, *words: str) -> None:
    """Failed with ``status`` and one line on stderr naming ``words``, no traceback."""
    assert proc.returncode == status, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert all(w in lines[0] for w in words), lines[0]


def test_list_shows_dead_letters_as_a_table_and_as_json(store: Store) -> None:  # noqa: F811
    ids = nacked(store, 3)
    shown = store.run("dead-letter", "list", TOPIC)
    assert shown.returncode == cli.EXIT_OK, shown.stderr
    assert all(i in shown.stdout for i in ids) and shown.stdout.count("broken order") == 3
    old_form = store.run("dead-letter", TOPIC)  # the form before actions: still a list
    assert old_form.stdout == shown.stdout
    as_json = store.run("dead-letter", "list", TOPIC, "--json", "--max", "2")
    rows = [json.loads(line) for line in as_json.stdout.splitlines()]
    assert len(rows) == 2 and {r["id"] for r in rows} <= set(ids)
    assert all(r["reason"] == "broken order" and r["delivery_count"] == 1 for r in rows)


def test_redrive_moves_them_back_and_each_is_consumed_once(store: Store) -> None:  # noqa: F811
    ids = nacked(store, 5)
    first = store.run("dead-letter", "redrive", TOPIC, "--max", "2", "--rate", "50", "--json")
    assert first.returncode == cli.EXIT_OK, first.stderr
    moved = json.loads(first.stdout)["moved"]
    assert len(moved) == 2
    rest = store.run("dead-letter", "redrive", TOPIC)
    assert rest.returncode == cli.EXIT_OK and f"{TOPIC}: 3 moved back" in rest.stdout
    consumed = store.run("consume", TOPIC, "--max", "100")
    got = [json.loads(line)["id"] for line in consumed.stdout.splitlines()]
    assert sorted(got) == sorted(ids)  # each once
    assert store.stats(TOPIC) == {"pending": 0, "leased": 0, "dead_letter": 0}


def test_purge_asks_first_and_refuses_without_a_terminal(store: Store) -> None:  # noqa: F811
    nacked(store, 4)
    before = listing(store)
    refused = store.run("dead-letter", "purge", TOPIC)  # stdin: /dev/null
    one_line_error(refused, cli.EXIT_USAGE, "--yes")
    assert listing(store) == before
    for answer, status, left in (("n\n", cli.EXIT_ERROR, 4), ("y\n", cli.EXIT_OK, 0)):
        main_fd, term_fd = pty.openpty()
        try:
            os.write(main_fd, answer.encode())
            asked = store.run("dead-letter", "purge", TOPIC, stdin_fd=term_fd)
        finally:
            os.close(main_fd)
            os.close(term_fd)
        assert asked.returncode == status, asked.stderr
        assert "delete the 4 dead letter(s) of orders?" in asked.stderr
        assert store.stats(TOPIC)["dead_letter"] == left
    nacked(store, 2)
    forced = store.run("dead-letter", "purge", TOPIC, "--yes", "--json")
    assert json.loads(forced.stdout) == {"deleted": 2}
    assert store.stats(TOPIC)["dead_letter"] == 0


def test_peek_shows_without_consuming(store: Store) -> None:  # noqa: F811
    ids = store.publish(TOPIC, [{"n": i} for i in range(4)])
    before = listing(store)
    table = store.run("peek", TOPIC, "-n", "3")
    assert table.returncode == cli.EXIT_OK, table.stderr
    assert [i in table.stdout for i in ids] == [True, True, True, False]
    rows = [json.loads(line) for line in store.run("peek", TOPIC, "--json").stdout.splitlines()]
    assert [r["id"] for r in rows] == ids and [r["payload"] for r in rows] == [
        {"n": i} for i in range(4)]
    assert all(r["attempts"] == 0 and not r["leased"] for r in rows)
    assert listing(store) == before  # nothing written, nothing leased
    empty = store.run("peek", TOPIC, "--dead-letter", "--json")
    assert empty.returncode == cli.EXIT_OK and empty.stdout == ""


def test_topics_delete_refuses_a_topic_in_use_unless_forced(store: Store) -> None:  # noqa: F811
    store.publish(TOPIC, [{"n": 1}])
    store.publish("empty", [])
    before = listing(store)
    refused = store.run("topics", "--delete", TOPIC)
    one_line_error(refused, cli.EXIT_ERROR, "TopicNotEmptyError", TOPIC, "messages")
    assert listing(store) == before
    gone = store.run("topics", "--delete", "empty")
    assert gone.returncode == cli.EXIT_OK and "empty: deleted" in gone.stdout
    forced = store.run("topics", "--delete", TOPIC, "--force")
    assert forced.returncode == cli.EXIT_OK, forced.stderr
    assert store.run("topics").stdout == ""
    assert [k for k in listing(store) if k.startswith((f"{TOPIC}/", "empty/"))] == []


@pytest.mark.parametrize("args", [
    ["dead-letter", "redrive", TOPIC, "--rate", "0"],
    ["dead-letter", "redrive", TOPIC, "--max", "0"],
    ["dead-letter", "list", TOPIC, "--rate", "5"],
    ["dead-letter", "bogus", TOPIC],
    ["dead-letter", "redrive", TOPIC, "extra"],
    ["peek", TOPIC, "-n", "0"],
    ["topics", "--force"],
], ids=lambda a: " ".join(a))
def test_bad_arguments_are_usage_errors_that_change_nothing(
    store: Store, args: list[str],  # noqa: F811
) -> None:
    nacked(store, 1)
    before = listing(store)
    proc = store.run(*args)
    assert proc.returncode == cli.EXIT_USAGE, proc.stderr
    assert "Traceback" not in proc.stderr
    assert listing(store) == before


@pytest.mark.parametrize("args", [
    ["dead-letter", "redrive", "ghost"], ["dead-letter", "purge", "ghost", "--yes"],
    ["dead-letter", "list", "ghost"], ["peek", "ghost"],
], ids=lambda a: " ".join(a))
def test_a_missing_topic_is_one_line(store: Store, args: list[str]) -> None:  # noqa: F811
    store.publish(TOPIC, [])
    proc = store.run(*args)
    one_line_error(proc, cli.EXIT_ERROR, "TopicNotFoundError", "ghost")


def test_redrive_of_a_packed_topic(store: Store) -> None:  # noqa: F811
    with store.queue() as pq:
        pq.create_topic(TOPIC, packed=True)
    ids = nacked(store, 3)
    with store.queue() as pq:
        assert all(d.original_key and layout.parse_segment_key(TOPIC, d.original_key)
                   for d in pq.dead_letters(TOPIC))
    assert store.run("dead-letter", "redrive", TOPIC).returncode == cli.EXIT_OK
    consumed = store.run("consume", TOPIC, "--max", "100")
    assert sorted(json.loads(x)["id"] for x in consumed.stdout.splitlines()) == sorted(ids)



def test_a_progress_bar_on_a_terminal_only(tmp_path: Path) -> None:
    """redrive draws its bar on stderr when stderr is a terminal, and nothing when not."""
    local = Store(tmp_path, {"local": {"path": str(tmp_path / "store")}})
    nacked(local, 2)
    main_fd, term_fd = pty.openpty()
    try:
        proc = subprocess.run(local.argv("dead-letter", "redrive", TOPIC), stdin=term_fd,
                              stderr=term_fd, stdout=subprocess.PIPE, text=True,
                              env=local.env(), cwd=tmp_path, timeout=300)
        os.close(term_fd)
        drawn = b""
        with contextlib.suppress(OSError):  # EIO once the terminal's other end is closed
            while chunk := os.read(main_fd, 4096):
                drawn += chunk
    finally:
        os.close(main_fd)
    assert proc.returncode == cli.EXIT_OK and "2 moved back" in proc.stdout
    assert b"redrive" in drawn and b"2/2" in drawn
    nacked(local, 1)  # the 2 moved back are dead-lettered again too
    quiet = local.run("dead-letter", "redrive", TOPIC)
    assert quiet.returncode == cli.EXIT_OK and "3 moved back" in quiet.stdout
    assert quiet.stderr == ""
