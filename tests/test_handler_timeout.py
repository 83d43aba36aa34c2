"""Handlers that never return, and settlements that fail in unexpected ways.

In-memory store on an auto-advancing FakeClock (pawn_queue_sync.testing): the
timeouts, leases and idle waits below are virtual seconds. Its hooks record which
thread wrote each lease and inject failures.
A lease can be judged stale once the store's clock sees it older than the visibility
timeout (3 s here, plus a 1 s grace): a lease no longer renewed is taken by another
consumer a few seconds later. Ordering is arranged with events; ``wait_until`` only
polls a condition (bounded by DEADLINE: fail, never hang).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator

import pytest

from pawn_queue_sync import Message, PawnQueue, testing
from pawn_queue_sync.errors import LeaseLostError
from pawn_queue_sync.runtime import DrainResult, Listener, drain
from tests.short_leases import POLLING as SHORT_LEASES
from tests.threads import join, run_in_thread, wait_until

TOPIC = "jobs"
#: Short leases (stale after 3 s + 1 s grace, renewed every second), polled often.
POLLING = {**SHORT_LEASES, "interval_seconds": 0.2}
#: No test waits longer than this for anything: fail, never hang.
DEADLINE = 60.0
#: How long a drain that works takes here at most (it returns within a second or two);
#: a drain still running after this never goes idle (the defect).
DRAIN_GUARD_S = 20.0
LISTEN_LOG = "pawn_queue_sync.runtime.listen"


def memory_queue(hooks: Callable[[str, str], None] | None = None) -> PawnQueue:
    return testing.memory_queue({"polling": POLLING}, topics=[TOPIC], hooks=hooks)


def publish(pq: PawnQueue, n: int) -> list[str]:
    return pq.register_producer("producer").publish_batch(TOPIC, [{"n": i} for i in range(n)])


def runtime_threads() -> list[str]:
    """Runtime threads alive (the queue's own claim/publish pools excluded)."""
    return [t.name for t in threading.enumerate() if t.name.startswith("pawnq-")
            and not t.name.startswith(("pawnq-claim", "pawnq-publish"))]


class LogWatch(logging.Handler):
    """Fires ``seen`` at the first record at WARNING or above containing ``text``."""

    def __init__(self, text: str) -> None:
        super().__init__(logging.WARNING)
        self.text = text
        self.seen = threading.Event()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if self.text in message:
            self.messages.append(message)
            self.seen.set()


@pytest.fixture
def timeout_warning() -> Iterator[LogWatch]:
    watch = LogWatch("handler_timeout_seconds")
    logger = logging.getLogger(LISTEN_LOG)
    logger.addHandler(watch)
    yield watch
    logger.removeHandler(watch)


class LeaseWrites:
    """Store hook: counts lease PUTs made by the refresher's threads, per key."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._renewals: dict[str, int] = {}

    def __call__(self, op: str, key: str) -> None:
        if op == "put" and key.endswith(".lease") and \
                threading.current_thread().name.startswith("pawnq-refresher"):
            with self._lock:
                self._renewals[key] = self._renewals.get(key, 0) + 1

    def renewals(self, key: str) -> int:
        with self._lock:
            return self._renewals.get(key, 0)


# -- 1. a handler that never returns -------------------------------------------------------


def test_a_handler_past_its_timeout_loses_its_lease_and_its_late_ack_is_refused(
    timeout_warning: LogWatch,
) -> None:
    """One worker thread, a handler blocked on an event. Within the timeout its lease is
    renewed; past it: a warning names the message and how long the handler has run,
    ``timed_out`` and ``stuck`` count it, the lease is no longer renewed, so another
    consumer takes the message once it is stale. Released at last, the stuck handler's
    ack raises LeaseLostError and deletes nothing: the other consumer acks it."""
    writes = LeaseWrites()
    pq = memory_queue(writes)
    release = threading.Event()
    try:
        [mid] = publish(pq, 1)
        entered = threading.Event()
        held: list[Message] = []
        late_ack: list[BaseException] = []

        def handler(msg: Message) -> None:
            held.append(msg)
            entered.set()
            release.wait(DEADLINE)
            try:
                msg.ack()
            except LeaseLostError as exc:
                late_ack.append(exc)
                raise

        listener = Listener(pq.register_consumer("stuck", [TOPIC]), handler, max_workers=1,
                            handler_timeout_seconds=2.0)
        runner = run_in_thread(listener.run)
        assert entered.wait(DEADLINE)
        [msg] = held
        assert timeout_warning.seen.wait(DEADLINE), "no warning about the stuck handler"
        [warning] = timeout_warning.messages
        assert mid in warning and "has run for" in warning
        assert listener.stats.timed_out == 1 and listener.stats.stuck == 1
        assert list(listener.stuck_handlers()) == [mid]
        renewed = writes.renewals(msg.lease_key)
        assert renewed >= 1  # renewed while within its time limit

        other = pq.register_consumer("other", [TOPIC])
        taken: list[Message] = []
        wait_until(lambda: bool(taken.extend(other.poll(1)) or taken),
                   "another consumer to take the abandoned message", clock=pq.context.clock)
        [again] = taken
        assert again.id == mid
        assert writes.renewals(msg.lease_key) == renewed  # not renewed since the timeout
        assert msg.state == "leased"  # the stuck thread does not know yet

        release.set()
        wait_until(lambda: bool(late_ack), "the stuck handler's late ack")
        assert isinstance(late_ack[0], LeaseLostError) and msg.state == "lost"
        assert pq.topic_stats(TOPIC) == {"pending": 1, "leased": 1, "dead_letter": 0}
        again.ack()  # the new holder's lease and message are intact
        assert pq.topic_stats(TOPIC) == {"pending": 0, "leased": 0, "dead_letter": 0}

        wait_until(lambda: listener.stats.stuck == 0, "the stuck handler to end")
        listener.stop()
        join(runner)
        s = listener.stats
        assert (s.timed_out, s.lost, s.processed, s.stuck) == (1, 1, 0, 0)
        assert listener.stuck_handlers() == {}
        wait_until(lambda: runtime_threads() == [], "every runtime thread to end")
    finally:
        release.set()
        pq.close()


def test_drain_goes_idle_past_a_stuck_handler_whose_late_ack_still_lands(
    timeout_warning: LogWatch,
) -> None:
    """A stuck handler no longer keeps drain() busy: once past its timeout, drain goes
    idle, returns without waiting for it, and says so (``timed_out``). Nobody else took
    the message, so when the handler returns at last its ack still succeeds."""
    pq = memory_queue()
    release = threading.Event()
    try:
        ids = publish(pq, 3)
        stuck_id: list[str] = []
        lock = threading.Lock()
        returned = threading.Event()

        def handler(msg: Message) -> None:
            with lock:
                first = not stuck_id
                if first:
                    stuck_id.append(msg.id)
            if first:
                release.wait(DEADLINE)
                returned.set()

        result: list[DrainResult] = []
        runner = run_in_thread(lambda: result.append(
            drain(pq.register_consumer("c", [TOPIC]), handler, threads=2,
                  idle_timeout_seconds=0.3, handler_timeout_seconds=1.0)))
        runner.join(DRAIN_GUARD_S)
        drained = not runner.is_alive()
        release.set()
        join(runner)
        assert drained, "drain() did not return while a handler was stuck"
        assert result == [DrainResult(processed=2, failed=0, dead_lettered=0, timed_out=1)]
        assert timeout_warning.seen.is_set() and stuck_id[0] in timeout_warning.messages[0]
        assert returned.wait(DEADLINE)
        wait_until(lambda: pq.topic_stats(TOPIC)["pending"] == 0, "the late ack")
        assert set(ids) >= set(stuck_id)
        wait_until(lambda: runtime_threads() == [], "the handler thread to end")
    finally:
        release.set()
        pq.close()


@pytest.mark.parametrize("bad", [0, -1.0, float("nan")])
def test_a_handler_timeout_must_be_positive(bad: float) -> None:
    """Listener, drain() and Consumer.listen (which forwards it) refuse a timeout that
    is not a positive number of seconds."""
    pq = memory_queue()
    try:
        consumer = pq.register_consumer("c", [TOPIC])
        with pytest.raises(ValueError, match="handler_timeout_seconds"):
            Listener(consumer, lambda m: None, handler_timeout_seconds=bad)
        with pytest.raises(ValueError, match="handler_timeout_seconds"):
            drain(consumer, lambda m: None, handler_timeout_seconds=bad)
        with pytest.raises(ValueError, match="handler_timeout_seconds"):
            consumer.listen(lambda m: None, handler_timeout_seconds=bad)
    finally:
        pq.close()


# -- 3. an ack that fails with an unexpected error -----------------------------------------


class DeleteRejected:
    """Store hook: every DELETE of a message raises TypeError, as a store wrapper did
    that rejected a keyword it did not know; ``disarm()`` stops it."""

    def __init__(self) -> None:
        self.armed = True
        self.calls = 0

    def __call__(self, op: str, key: str) -> None:
        if self.armed and op in ("delete", "delete_many") and "/messages/" in key:
            self.calls += 1
            raise TypeError("delete() got an unexpected keyword argument 'deadline'")

    def disarm(self) -> None:
        self.armed = False


def test_an_ack_failing_with_an_unexpected_error_is_not_retried_forever(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The ack raises TypeError (not a store error): it is logged with its traceback and
    given up at once, so drain() goes idle and returns. The message is not acked; it
    stays on the store, to be redelivered once its lease expires (handled once here)."""
    hook = DeleteRejected()
    pq = memory_queue(hook)
    try:
        [mid] = publish(pq, 1)
        seen: list[str] = []
        result: list[DrainResult] = []
        runner = run_in_thread(lambda: result.append(
            drain(pq.register_consumer("c", [TOPIC]), lambda m: seen.append(m.id),
                  idle_timeout_seconds=0.3)))
        runner.join(DRAIN_GUARD_S)
        drained = not runner.is_alive()
        hook.disarm()  # lets a drain that retries forever finish
        join(runner)
        assert drained, f"drain() retried the ack {hook.calls} times and never went idle"
        assert hook.calls == 1 and seen == [mid]
        assert result == [DrainResult(processed=0, failed=0, dead_lettered=0)]
        errors = [r for r in caplog.records if r.levelno >= logging.ERROR and r.exc_info]
        assert any(r.exc_info[0] is TypeError for r in errors), caplog.text
        assert "Traceback" in caplog.text and "unexpected keyword argument" in caplog.text
        assert pq.topic_stats(TOPIC)["pending"] == 1  # not lost: redelivered later
    finally:
        pq.close()


def test_an_unexpected_ack_error_counts_the_message_lost_and_leaves_it_unrenewed() -> None:
    """The listener's accounting of the same failure: one ack error, the message lost
    (it will be redelivered), nothing processed; its lease is no longer renewed, so
    another consumer takes it once stale and can ack it."""
    hook = DeleteRejected()
    pq = memory_queue(hook)
    try:
        [mid] = publish(pq, 1)
        listener = Listener(pq.register_consumer("c", [TOPIC]), lambda m: None,
                            max_workers=1, idle_timeout_seconds=0.3)
        runner = run_in_thread(listener.run)
        runner.join(DRAIN_GUARD_S)
        drained = not runner.is_alive()
        hook.disarm()
        listener.stop()
        join(runner)
        assert drained, "the listener retried the ack forever"
        s = listener.stats
        assert (s.ack_errors, s.lost, s.processed) == (1, 1, 0)
        other = pq.register_consumer("other", [TOPIC])
        taken: list[Message] = []
        wait_until(lambda: bool(taken.extend(other.poll(1)) or taken),
                   "the unacked message to be redelivered", clock=pq.context.clock)
        assert taken[0].id == mid
        taken[0].ack()
        assert pq.topic_stats(TOPIC) == {"pending": 0, "leased": 0, "dead_letter": 0}
    finally:
        pq.close()
