"""``pawn_queue_sync.testing`` and the virtual clock it runs on.

``FakeClock(auto=True)`` moves time on by itself only when every thread that waits on
it is waiting again; these tests pin that down (waits end in deadline order, a woken
thread's work is never jumped over, manual mode moves only when told), and that a
handler's unit test runs its retries and dead-letters in virtual time.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import threading
import time

import pytest

import pawn_queue_sync
from pawn_queue_sync.clock import SYSTEM_CLOCK, FakeClock, wait_for
from pawn_queue_sync.testing import memory_queue, run_handler
from tests.threads import join, run_in_thread, wait_until

DEADLINE = 60.0


def test_an_auto_clock_ends_waits_in_deadline_order_and_jumps_to_each() -> None:
    clock = FakeClock(auto=True)
    ended: list[tuple[float, float]] = []
    lock = threading.Lock()

    entering = [threading.Event() for _ in range(3)]

    go = threading.Event()

    def sleeper(seconds: float, entered: threading.Event) -> None:
        go.wait(DEADLINE)
        entered.set()
        clock.sleep(seconds)
        with lock:
            ended.append((seconds, clock.monotonic()))

    # Held until all three are asleep (a busy loop of clock calls kept it from moving
    # only as long as the OS did not preempt that loop for a few ms: a loaded CI saw the
    # clock at 5 here): none can wake before the others sleep.
    with clock.held():
        threads = [run_in_thread(lambda s=s, e=e: sleeper(s, e))
                   for s, e in zip((30.0, 5.0, 12.5), entering, strict=True)]
        go.set()
        for entered in entering:
            assert entered.wait(DEADLINE)
        wait_until(lambda: clock.waiting() == 3, what="all three asleep")
        assert clock.monotonic() == 0.0
    for thread in threads:
        join(thread, DEADLINE)
    clock.close()
    assert ended == [(5.0, 5.0), (12.5, 12.5), (30.0, 30.0)]


def test_a_woken_thread_finishes_its_work_before_time_moves_on() -> None:
    """A waiter woken at t=1 does 'work' (real time, no clock call) and then records
    the clock: it still reads 1, although another thread waits until t=2."""
    clock = FakeClock(auto=True)
    seen: list[float] = []

    def worker() -> None:
        clock.sleep(1.0)
        total = sum(range(200_000))  # busy, without calling the clock
        assert total > 0
        seen.append(clock.monotonic())

    other = run_in_thread(lambda: clock.sleep(2.0))
    join(run_in_thread(worker), DEADLINE)
    join(other, DEADLINE)
    clock.close()
    assert seen == [1.0]


def test_a_notify_ends_a_clock_wait_early_and_wait_for_honours_its_timeout() -> None:
    clock = FakeClock(auto=True)
    cond = threading.Condition()
    flag: list[bool] = []

    def setter() -> None:
        clock.sleep(3.0)
        with cond:
            flag.append(True)
            cond.notify_all()

    runner = run_in_thread(setter)
    with cond:
        assert wait_for(clock, cond, lambda: bool(flag), 10.0)
        assert clock.monotonic() == 3.0
        assert not wait_for(clock, cond, lambda: False, 4.0)  # times out at t=7
        assert clock.monotonic() == pytest.approx(7.0)
    join(runner, DEADLINE)
    clock.close()


def test_a_manual_clock_moves_only_when_advanced() -> None:
    clock = FakeClock()
    cond = threading.Condition()
    result: list[bool] = []

    def waiter() -> None:
        with cond:
            result.append(clock.wait(cond, 5.0))

    runner = run_in_thread(waiter)
    time.sleep(0.05)  # real time passes: the virtual clock does not
    assert result == [] and clock.monotonic() == 0.0
    clock.advance(4.0)
    time.sleep(0.05)
    assert result == []
    clock.advance(1.0)
    join(runner, DEADLINE)
    assert result == [False]
    clock.sleep(2.0)  # manual mode: sleeping advances
    assert clock.monotonic() == 7.0


def test_the_system_clock_waits_in_real_time() -> None:
    cond = threading.Condition()
    started = time.monotonic()
    with cond:
        assert SYSTEM_CLOCK.wait(cond, 0.05) is False
    assert time.monotonic() - started >= 0.04


def test_memory_queue_runs_retries_and_dead_letters_in_virtual_time() -> None:
    """Backoffs of 1, 2, 4 s and a 5 s idle timeout: seconds of virtual time, every
    message delivered and settled exactly as on S3, counted per id."""
    deliveries: dict[int, list[int]] = {}
    lock = threading.Lock()

    def handle(msg: pawn_queue_sync.Message) -> None:
        with lock:
            deliveries.setdefault(msg.payload["n"], []).append(msg.delivery_count)
        if msg.payload["n"] < 0:
            raise ValueError("negative")

    with memory_queue({"polling": {"max_delivery_count": 4}}, topics=["orders"]) as pq:
        pq.register_producer("shop").publish_batch(
            "orders", [{"n": n} for n in (1, 2, -1, 3)])
        result = run_handler(pq, "orders", handle, threads=2)
        assert (result.processed, result.failed, result.dead_lettered) == (3, 3, 1)
        assert deliveries == {1: [1], 2: [1], 3: [1], -1: [1, 2, 3, 4]}
        assert pq.topic_stats("orders") == {"pending": 0, "leased": 0, "dead_letter": 1}
        assert pq.context.clock.monotonic() > 7.0  # the backoffs passed, virtually


def test_the_package_root_exports_the_runtime_and_imports_the_pool_lazily() -> None:
    assert {"Listener", "ListenOptions", "drain", "DrainResult", "WorkerPool"} <= set(
        pawn_queue_sync.__all__)
    code = ("import sys, pawn_queue_sync as p; assert 'pawn_queue_sync.workers' not in "
            "sys.modules; from pawn_queue_sync import WorkerPool; "
            "assert WorkerPool.__module__ == 'pawn_queue_sync.workers.pool'")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=DEADLINE)
    with pytest.raises(AttributeError):
        pawn_queue_sync.NoSuchThing  # noqa: B018


def test_a_timeout_below_the_clocks_resolution_still_waits_for_time_to_move() -> None:
    """At t = 12.3 a wait of 1e-16 s cannot move the clock (12.3 + 1e-16 == 12.3 in
    floating point). It used to return at once, so a listener's poll loop, left with
    such a remainder of its idle timeout, polled in a loop (calling the clock, so
    time never moved): drain() never returned. It must wait for the next instant."""
    clock = FakeClock()
    clock.advance(12.3)
    cond = threading.Condition()
    result: list[bool] = []

    def waiter() -> None:
        with cond:
            result.append(clock.wait(cond, 1e-16))

    runner = run_in_thread(waiter)
    time.sleep(0.05)
    assert result == []  # waiting, not returned at once
    clock.advance(1e-9)
    join(runner, DEADLINE)
    assert result == [False]


def test_a_runtime_loop_on_a_manual_clock_waits_for_the_test_to_move_it() -> None:
    """drain() on a manual ``FakeClock()`` (``memory_queue(clock=FakeClock())``, or
    ``PawnQueue(..., clock=FakeClock())``): its idle timeout elapses only as the test
    advances the clock. It used to wait silently forever; a wait that only advance()
    can end is now logged as a warning naming the way out, and the drain finishes
    once the clock is moved on. The deadline is real time: fail, never hang."""
    stalled = threading.Event()
    messages: list[str] = []

    class Catch(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            messages.append(record.getMessage())
            stalled.set()

    catch = Catch(logging.WARNING)
    clock_log = logging.getLogger("pawn_queue_sync.clock")
    clock_log.addHandler(catch)
    clock = FakeClock(stall_warning_seconds=0.05)
    try:
        with memory_queue(topics=["t"], clock=clock) as pq:
            pq.register_producer("p").publish_batch("t", [{"n": i} for i in range(3)])
            results: list[pawn_queue_sync.DrainResult] = []
            runner = run_in_thread(lambda: results.append(
                run_handler(pq, "t", lambda m: None, idle_timeout_seconds=5.0)))
            assert stalled.wait(DEADLINE), "no warning for a wait only advance() can end"
            assert "advance()" in messages[0] and "auto=True" in messages[0]
            assert runner.is_alive() and results == []  # virtual time stood still
            assert clock.monotonic() == 0.0
            deadline = time.monotonic() + DEADLINE
            while runner.is_alive():
                assert time.monotonic() < deadline, "drain() did not end as time moved"
                clock.advance(1.0)
                runner.join(0.01)
            assert [r.processed for r in results] == [3]
            assert clock.monotonic() >= 5.0
    finally:
        clock_log.removeHandler(catch)
        clock.close()


def test_memory_queue_leaves_no_thread_running_after_close() -> None:
    """The auto clock memory_queue() makes is closed with the queue (its ``fake-clock``
    thread was left running); a clock the caller passed is the caller's to close."""
    before = set(threading.enumerate())
    with memory_queue(topics=["t"]) as pq:
        pq.register_producer("p").publish("t", {"n": 1})
        assert run_handler(pq, "t", lambda m: None).processed == 1
    assert [t.name for t in threading.enumerate() if t not in before] == []
    with FakeClock(auto=True) as mine:
        with memory_queue(topics=["t"], clock=mine) as pq:
            pq.register_producer("p").publish("t", {"n": 1})
        mine.sleep(1.0)  # still moves: memory_queue() did not close it
        assert mine.monotonic() == 1.0


def test_the_old_import_path_of_the_worker_pool_still_works_and_warns() -> None:
    """``from pawn_queue_sync.runtime.workers import WorkerPool`` was documented; it
    raised ModuleNotFoundError once the pool moved to ``pawn_queue_sync.workers``."""
    import importlib

    from pawn_queue_sync import workers

    sys.modules.pop("pawn_queue_sync.runtime.workers", None)
    with pytest.warns(DeprecationWarning, match="pawn_queue_sync.workers"):
        old = importlib.import_module("pawn_queue_sync.runtime.workers")
    assert old.WorkerPool is workers.WorkerPool
    assert set(old.__all__) == set(workers.__all__)
    assert all(getattr(old, name) is getattr(workers, name) for name in workers.__all__)
