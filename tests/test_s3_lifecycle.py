"""Regressions of the S3 store's life, against the recording server of
:mod:`tests.s3_recorder`: a closed store stays closed; a deadline bounds a request,
retries included; a fork while another thread is inside the store does not deadlock
the child."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from pawn_queue_sync import errors
from pawn_queue_sync.errors import StorageError
from pawn_queue_sync.storage.memory import MemoryStore
from pawn_queue_sync.storage.s3 import S3Store
from pawn_queue_sync.storage.s3.secrets import SECRET_FILTER

from .forking import in_child
from .s3_recorder import (
    PATHS,
    Recorder,
    Reply,
    Seen,
    default_reply,
    recording,
    store_at,
)

recorder = pytest.fixture(recording, name="recorder")


# --------------------------------------------------------------- 5. a closed store


@PATHS
def test_a_closed_store_stays_closed(recorder: Recorder, fast: bool) -> None:
    store = store_at(recorder.endpoint(), fast=fast)
    store.put("t/k", b"{}")
    store.close()
    sent = len(recorder.seen)
    calls: list[Callable[[], Any]] = [
        lambda: store.put("t/k", b"{}"), lambda: store.get("t/k"), lambda: store.head("t/k"),
        lambda: store.delete("t/k"), lambda: store.delete_many(["t/k"]),
        lambda: store.list("t/"), lambda: store.server_time(), lambda: store.copy("t/k", "t/j"),
    ]
    for call in calls:
        with pytest.raises(StorageError) as info:
            call()
        assert isinstance(info.value, errors.StoreClosed)
        assert isinstance(info.value, errors.NotStartedError)
        assert "closed" in str(info.value)
    assert len(recorder.seen) == sent  # nothing more was sent
    store.close()  # still idempotent
    assert "bkt" in store.describe()


# ------------------------------------------------------------------- 6. deadlines


def _run_bounded(call: Callable[[], Any], limit: float = 30.0) -> BaseException | None:
    """Run ``call`` on a thread; the exception it raised. Fails (instead of hanging)
    when it has not returned within ``limit`` seconds."""
    box: list[BaseException | None] = [None]

    def target() -> None:
        try:
            call()
        except BaseException as exc:
            box[0] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(limit)
    assert not thread.is_alive(), "the call outlived its deadline by far"
    return box[0]


def _deadline_calls(store: S3Store) -> dict[str, Callable[[float], Any]]:
    return {
        "delete": lambda d: store.delete("t/k", if_match="abc", deadline=d),
        "delete_many": lambda d: store.delete_many(["t/k", "t/j"], deadline=d),
        "put": lambda d: store.put("t/k", b"{}", if_match="abc", deadline=d),
    }


@PATHS
@pytest.mark.parametrize("op", ["delete", "delete_many", "put"])
def test_a_deadline_caps_the_wait_for_an_answer(recorder: Recorder, fast: bool, op: str) -> None:
    """A server that never answers, a read timeout of an hour and many attempts: the call
    gives up at the deadline, with DeadlineExceeded, and nothing was sent after it."""
    recorder.reply = recorder.hold
    store = store_at(recorder.endpoint(), fast=fast, read_timeout_seconds=3600.0,
                     max_attempts=5)
    deadline = time.monotonic() + 0.5
    exc = _run_bounded(lambda: _deadline_calls(store)[op](deadline))
    assert isinstance(exc, errors.DeadlineExceeded), repr(exc)
    assert isinstance(exc, StorageError) and "deadline" in str(exc)
    assert recorder.seen and all(seen.arrived < deadline for seen in recorder.seen)


@PATHS
@pytest.mark.parametrize("op", ["delete", "delete_many", "put"])
def test_no_attempt_is_sent_after_the_deadline(recorder: Recorder, fast: bool, op: str) -> None:
    """A server that answers 503 SlowDown at once, every time: botocore's standard retries
    would go on for a long while; with a deadline, the retries stop there."""
    recorder.reply = lambda seen: (
        503, {"Content-Type": "application/xml"},
        b"<Error><Code>SlowDown</Code><Message>later</Message></Error>",
    )
    store = store_at(recorder.endpoint(), fast=fast, max_attempts=10)
    deadline = time.monotonic() + 0.3
    exc = _run_bounded(lambda: _deadline_calls(store)[op](deadline))
    assert isinstance(exc, errors.DeadlineExceeded), repr(exc)
    assert recorder.seen and all(seen.arrived < deadline for seen in recorder.seen)
    # a deadline already past sends nothing at all
    recorder.seen.clear()
    exc = _run_bounded(lambda: _deadline_calls(store)[op](time.monotonic() - 1))
    assert isinstance(exc, errors.DeadlineExceeded)
    assert recorder.seen == []


@PATHS
def test_a_deadline_far_off_changes_nothing(recorder: Recorder, fast: bool) -> None:
    store = store_at(recorder.endpoint(), fast=fast)
    far = time.monotonic() + 60
    for call in _deadline_calls(store).values():
        call(far)
    assert [seen.method for seen in recorder.seen] == ["DELETE", "POST", "PUT"]


def _retry_by_calls(store: S3Store) -> dict[str, Callable[[float], Any]]:
    return {
        "delete": lambda t: store.delete("t/k", retry_by=t),
        "put": lambda t: store.put("t/k", b"{}", retry_by=t),
    }


def _slow_down(seen: Seen) -> Reply:
    return (503, {"Content-Type": "application/xml"},
            b"<Error><Code>SlowDown</Code><Message>later</Message></Error>")


@PATHS
@pytest.mark.parametrize("op", ["delete", "put"])
def test_retry_by_bounds_the_retries_not_the_first_attempt(
    recorder: Recorder, fast: bool, op: str
) -> None:
    """``retry_by`` (a csprng claim's lease write): the first attempt goes whatever the
    time; no retry leaves after it (a server answering 503 every time)."""
    recorder.reply = _slow_down
    store = store_at(recorder.endpoint(), fast=fast, max_attempts=10)
    by = time.monotonic() + 0.3
    exc = _run_bounded(lambda: _retry_by_calls(store)[op](by))
    assert isinstance(exc, errors.DeadlineExceeded), repr(exc)
    assert exc.transient
    assert len(recorder.seen) >= 1 and all(seen.arrived < by for seen in recorder.seen)
    recorder.seen.clear()  # already past: the first attempt, and no retry
    exc = _run_bounded(lambda: _retry_by_calls(store)[op](time.monotonic() - 1))
    assert isinstance(exc, errors.DeadlineExceeded), repr(exc)
    assert len(recorder.seen) == 1
    recorder.reply = None  # a server that answers: done, even past retry_by
    _retry_by_calls(store)[op](time.monotonic() - 1)
    assert len(recorder.seen) == 2


@PATHS
@pytest.mark.parametrize("op", ["delete", "put"])
def test_retry_by_does_not_cut_the_wait_for_an_answer(
    recorder: Recorder, fast: bool, op: str
) -> None:
    """An attempt sent in time waits for its answer as long as it would without
    ``retry_by`` (unlike a deadline): the answer, not a timeout and a retry."""
    answered = threading.Event()

    def slow(seen: Seen) -> Reply:
        answered.wait(0.4)  # the answer comes 0.4 s later, long past retry_by
        return default_reply(seen)

    recorder.reply = slow
    store = store_at(recorder.endpoint(), fast=fast, max_attempts=5)
    assert _run_bounded(lambda: _retry_by_calls(store)[op](time.monotonic() + 0.05)) is None
    assert len(recorder.seen) == 1


def test_memory_and_local_stores_take_a_deadline(tmp_path: Any) -> None:
    from pawn_queue_sync.storage.local import LocalStore

    for store in (MemoryStore(), LocalStore(tmp_path)):
        store.put("t/k", b"{}", deadline=time.monotonic() + 60)
        store.delete("t/k", deadline=time.monotonic() + 60)
        assert store.delete_many(["t/k"], deadline=time.monotonic() + 60) == []
        store.put("t/k", b"{}")
        past = time.monotonic() - 1
        with pytest.raises(errors.DeadlineExceeded):
            store.delete("t/k", deadline=past)
        with pytest.raises(errors.DeadlineExceeded):
            store.delete_many(["t/k"], deadline=past)
        with pytest.raises(errors.DeadlineExceeded):
            store.put("t/k", b"[]", deadline=past)
        assert store.get("t/k").body == b"{}"  # nothing happened past the deadline
        store.put("t/k", b"[]", retry_by=past)  # one attempt: nothing to retry
        store.delete("t/k", retry_by=past)


# ----------------------------------------------------------------------- 7. fork


@PATHS
def test_fork_while_another_thread_builds_the_client(recorder: Recorder, fast: bool) -> None:
    """A thread is building the store's client (holding its lock) when the process forks:
    the child builds its own client instead of waiting forever for that lock."""
    store = store_at(recorder.endpoint(), fast=fast, build=False)
    inside, release = threading.Event(), threading.Event()
    build = store._build_client

    def slow_build() -> Any:
        if os.getpid() == parent:
            inside.set()
            release.wait(30)
        return build()

    parent = os.getpid()
    store._build_client = slow_build  # type: ignore[method-assign]
    worker = threading.Thread(target=store.put, args=("t/parent", b"{}"))
    worker.start()
    try:
        assert inside.wait(30)
        code = in_child(lambda: store.put("t/child", b"{}"))
    finally:
        release.set()
        worker.join(30)
    assert code == 0
    assert {s.path.rsplit("/", 1)[-1] for s in recorder.seen if s.method == "PUT"} == {
        "child", "parent"}


def test_fork_while_another_thread_registers_secrets(recorder: Recorder) -> None:
    """The log filter's lock (taken when any store builds a client) held by another
    thread at the fork: a store built in the child still works."""
    held, release = threading.Event(), threading.Event()

    def hold_the_filter() -> None:
        with SECRET_FILTER._lock:
            held.set()
            release.wait(30)

    holder = threading.Thread(target=hold_the_filter)
    holder.start()
    try:
        assert held.wait(30)
        code = in_child(lambda: store_at(recorder.endpoint()).put("t/child", b"{}"))
    finally:
        release.set()
        holder.join(30)
    assert code == 0


def test_fork_while_another_thread_waits_for_an_answer(recorder: Recorder) -> None:
    """A request in flight on the parent's pool at the fork: the child's requests go
    through a pool of its own."""
    arrived = threading.Event()

    def reply(seen: Seen) -> Reply:
        if seen.path.endswith("/t/parent"):
            arrived.set()
            recorder.released.wait(60)
        return default_reply(seen)

    recorder.reply = reply
    store = store_at(recorder.endpoint())
    store.put("t/first", b"{}")  # the client exists before the fork
    worker = threading.Thread(target=lambda: _run_bounded(lambda: store.get("t/parent")))
    worker.start()
    try:
        assert arrived.wait(30)
        code = in_child(lambda: store.put("t/child", b"{}"))
    finally:
        recorder.released.set()
        worker.join(30)
    assert code == 0
