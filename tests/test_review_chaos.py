"""Review of the chaos suite (issue 15): defects found, each a strict xfail until fixed.

Each test says what the suite (or the pool fix it brought) gets wrong and how the
test shows it; see the review report for the mutation runs behind them.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import pytest

from benchmarks.chaos.accounting import Counts, count, explain_overlaps
from benchmarks.chaos.goals import judge
from benchmarks.chaos.harness import ChaosRun, ChaosSettings
from benchmarks.chaos.pool import child_pids
from pawn_queue_sync import PawnQueue
from pawn_queue_sync.workers import RET_START_FAILED
from tests.runtime_handlers import read_records
from tests.servers import S3Server, config_dict
from tests.test_workers_outage import start_recording_pool

REPO = Path(__file__).resolve().parents[1]
VT = 10.0


def _delivery(mid: str, start: float, end: float | None, *, pid: int,
              outcome: str = "ok") -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = [{"e": "start", "id": mid, "t": start, "pid": pid,
                                     "d": f"{mid}@{start}", "w": start}]
    if end is not None:
        events.append({"e": "end", "id": mid, "t": end, "pid": pid, "d": f"{mid}@{start}",
                       "w": start, "outcome": outcome})
    return events


# -- accounting and goals (no server) ------------------------------------------------------


def test_a_second_delivery_after_an_ok_handler_but_inside_its_lease_is_while_live() -> None:
    """A handler returned ok at t=1.02 (lease written at 1, live until 1 + 10 - 1.5);
    another consumer's handler starts at t=2. Nothing released the lease (an ok handler
    is acked, not released), so the second claim took a live lease: a definite
    duplicate under conditional_write. The rule ``min(end, w + vt - slack)`` calls it a
    plain redelivery, so a claim or reaper defect that re-delivers a message between
    its handler's end and its ack (the window where most of a 20 ms handler's lease
    lives) is never "twice while live". Mutation: ``is_stale`` at age > 1 s (leases
    reaped live) passes scenarios 1 and 2 quick with 0 twice while live."""
    events = [{"e": "pub", "id": "a", "t": 0.0}, *_delivery("a", 1.0, 1.02, pid=1),
              *_delivery("a", 2.0, 2.02, pid=2)]
    c = count(events, dead_letters=set(), swept=set(), remaining=0, visibility_timeout=VT)
    assert (c.delivered_twice, c.twice_while_live) == (1, 1)


@attrs.frozen
class _Fault:
    t: float
    kind: str
    key: str
    delay_seconds: float


def test_a_delay_on_another_segment_does_not_explain_a_packed_overlap() -> None:
    """A packed message's id (``msg.id``, the producer's) is in no key, so
    ``explain_overlaps`` accepts a delay on *any* key containing "segment" within 30 s:
    in scenario 1 (1 % two-second stalls on every request) every packed csprng_verify
    overlap is "explained" whatever caused it, and the csprng goal cannot fail there.
    Here the only delay is on another segment's lease."""
    overlap = {"id": "9f3c-message-id", "first_start": 100.0, "second_start": 101.0}
    unrelated = _Fault(95.0, "delay_request",
                       "chaos/segment-leases/0000-other-segment.lease", 2.0)
    got = explain_overlaps([overlap], [unrelated], jitter_min_ms=100)
    assert got["unexplained"] == ["9f3c-message-id"], got


def _counts(**kw: int) -> Counts:
    base = dict(published=0, unconfirmed=0, acked=0, dead_lettered=0, left=0, lost=0,
                delivered_twice=0, twice_while_live=0, remaining_after_sweep=0,
                wrong_dead_letters=0, poison_delivery_errors=0)
    return Counts(**{**base, **kw}, details={"lost": [], "overlaps": [],
                                             "wrong_dead_letters": [],
                                             "poison_delivery_errors": {},
                                             "poison_not_dead_lettered": []})


def test_a_row_whose_pool_handled_nothing_misses_its_goals() -> None:
    """Scenario 1 quick with a worker child that never runs its listener (mutant in
    workers/child.py) waits out ``wait_handled`` (180 s), stops the pool, and the
    harness's in-process sweep handles all 60: acked 0, left 60, "goals met". The full
    run's table shows the same shape (scenario 1 csprng_verify plain: left 2,139;
    scenario 5 csprng_verify plain: left 1,555) as met goals."""
    c = _counts(published=60, acked=0, left=60)
    misses = judge(c, events=[], strategy="conditional_write", poison=set(), explained={})
    assert misses, "a pool that consumed nothing met every goal"


class _StubLedger:
    def __init__(self, events: list[dict[str, Any]]) -> None:
        self._events = events

    def events(self) -> list[dict[str, Any]]:
        return self._events


class _StubProxy:
    requests = 0

    def __init__(self, faults: list[_Fault]) -> None:
        self._faults = faults

    def disarm(self) -> None:
        pass

    def fault_log(self) -> list[_Fault]:
        return self._faults


def test_finish_judges_every_csprng_overlap_not_only_the_first_twenty() -> None:
    """``finish`` passes ``counts.details["overlaps"]`` (capped at 20 for the report) to
    ``explain_overlaps``, so under csprng_verify only the first 20 overlaps are matched
    with delays. Here 20 overlaps have a 2 s delay on their lease and 5 later ones
    none: the row meets its goals. (Mutation: csprng claims never verified, scenario 2
    quick plain: 33 twice while live, "20 overlaps ... unexplained": only 20 looked at.)"""
    events: list[dict[str, Any]] = []
    faults: list[_Fault] = []
    for n in range(25):
        mid, t = f"id-{n:02d}", 100.0 + 10 * n
        events += [{"e": "pub", "id": mid, "t": 0.0}, *_delivery(mid, t, t + 5, pid=1),
                   *_delivery(mid, t + 1, t + 2, pid=2)]
        if n < 20:
            faults.append(_Fault(t - 1, "delay_request", f"chaos/leases/{mid}.lease", 2.0))
    run = ChaosRun.__new__(ChaosRun)
    run.settings = ChaosSettings(kind="plain", strategy="csprng_verify", messages=0)
    run.pools, run.notes, run.poison_ids, run._started = [], {}, set(), time.monotonic()
    run.proxy = _StubProxy(faults)  # type: ignore[assignment]
    run.ledger = _StubLedger(events)  # type: ignore[assignment]
    run.sweep = lambda timeout=None: set()  # type: ignore[method-assign]
    run.dead_letter_ids = lambda: set()  # type: ignore[method-assign]
    run.remaining = lambda: 0  # type: ignore[method-assign]
    result = run.finish("faults", scenario=1)
    assert result.counts.twice_while_live == 25
    assert not result.goals_met, "5 overlaps with no delay were never judged"


def test_the_quick_rows_check_late_acks_on_plain_topics_too() -> None:
    """Mutation: plain acks with no fence (``_ack_fenced`` treats every lease as fresh,
    ``_delete_acked`` sends no deadline), so a consumer frozen past its visibility
    timeout deletes messages other workers hold. ``--quick --only 4 --kinds plain``
    catches it (late acks "ok", 3 messages removed under their new holders), but the
    whole of tests/test_chaos.py passes (11 passed): its scenario 4 row is packed /
    csprng_verify, and no other row's counts move (the new holders' handlers still end
    ok, so the ids count as acked, never lost)."""
    from benchmarks.chaos.suite import quick_plan as quick_rows

    kinds = {r.kind for r in quick_rows() if r.scenario == 4}
    assert kinds == {"plain", "packed"}, kinds


# -- the worker pool fix (RET_CONNECT restarted forever) ----------------------------------


def _wait(predicate: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@pytest.mark.slow
def test_a_pool_gives_up_when_its_bucket_is_gone_for_good(
    real_s3: S3Server, real_bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """(Fixed in 07bfe7e: ``StorageError.transient``; a child refused for good exits
    RET_CONNECT and counts, one meeting an outage exits RET_STORE_DOWN and does not.)
    Since d5e8912 a child exiting RET_CONNECT never counts toward
    ``max_start_failures``, on the ground that the parent reached the store. But any
    StorageError in the child's setup exits RET_CONNECT: a bucket deleted (or
    credentials revoked, or a ProbeError) after the pool started is permanent, and the
    pool now restarts its children forever instead of returning RET_START_FAILED.
    Here: the bucket is removed while the pool runs, its child is killed, and the pool
    is given 45 s (max_start_failures=3, back-off 0.05-0.2 s) to give up."""
    monkeypatch.setenv("PAWNQ_TEST_RECORD_DIR", str(tmp_path))
    cfg = config_dict(real_s3, real_bucket, polling={"interval_seconds": 0.2})
    with PawnQueue.from_config(cfg) as pq:
        pq.create_topic("jobs")
        first = pq.register_producer("p").publish("jobs", {"n": 0})
    pool, statuses, runner = start_recording_pool(cfg, "jobs")
    try:
        assert _wait(lambda: any(mid == first for events in
                                 read_records(str(tmp_path)).values()
                                 for _, mid in events), 60), "the first message handled"
        real_s3.remove_bucket(real_bucket)  # gone for good
        [pid] = pool.worker_pids().values()
        os.kill(pid, signal.SIGKILL)
        runner.join(45)
        assert not runner.is_alive(), (
            f"the pool still restarts its children {pool.restarts} restart(s) later")
        assert statuses == [RET_START_FAILED]
    finally:
        pool.stop()
        runner.join(30)


# -- the CLI leaves processes behind --------------------------------------------------------


def _descendants(pid: int) -> set[int]:
    found: set[int] = set()
    todo = [pid]
    while todo:
        p = todo.pop()
        for children in Path(f"/proc/{p}/task").glob("*/children"):
            with contextlib.suppress(OSError):
                for c in children.read_text().split():
                    if int(c) not in found:
                        found.add(int(c))
                        todo.append(int(c))
    return found


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _start_cli(tmp_path: Path) -> subprocess.Popen[bytes]:
    """The quick scenario 7 row through the CLI, its temp files in ``tmp_path``."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "TMPDIR": str(tmp_path)}
    return subprocess.Popen(
        [sys.executable, "-m", "benchmarks.chaos", "--quick", "--only", "7", "--kinds",
         "plain", "--strategies", "conditional_write"],
        cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )


@pytest.mark.slow
def test_sigterm_of_the_chaos_cli_leaves_no_worker_pool_behind(tmp_path: Path) -> None:
    """The CLI has no SIGTERM handler, so ``ChaosRun.close()`` never runs; the pool
    subprocess was started with ``start_new_session=True`` and nothing ties it to the
    CLI (the weed server has PR_SET_PDEATHSIG, the pool has not), so it keeps polling
    a proxy that is gone, with its children, until someone kills it."""
    # its run and server directories, left behind too, land in tmp_path
    cli = _start_cli(tmp_path)
    pools: set[int] = set()
    try:
        def pool_started() -> bool:
            pools.update(p for p in _descendants(cli.pid)
                         if b"benchmarks.chaos.pool" in _cmdline(p))
            return bool(pools) and any(child_pids(p) for p in pools)

        assert _wait(pool_started, 120), "the CLI started no worker pool"
        cli.send_signal(signal.SIGTERM)
        cli.wait(60)
        assert _wait(lambda: not any(_alive(p) for p in pools), 30), (
            f"worker pool {sorted(pools)} still running after the CLI was terminated")
        # (weed mini's own log files land in TMPDIR too, run or not: not ours)
        assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == [], (
            "temp dirs left behind")
    finally:
        if cli.poll() is None:
            cli.kill()
            cli.wait()
        for p in pools:  # ours: the pool this test's CLI started
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p, signal.SIGKILL)


@pytest.mark.slow
def test_kill_9_of_the_chaos_cli_leaves_no_process_behind(tmp_path: Path) -> None:
    """A kill -9 runs no cleanup at all: the pool, its worker children and SeaweedFS
    must still go, through the parent-death signal (the pool's children follow their
    parent). Before the fix the pool (own session, no parent-death signal) and its
    children kept running."""
    cli = _start_cli(tmp_path)
    started: set[int] = set()
    try:
        def pool_children_running() -> bool:
            started.update(_descendants(cli.pid))
            return any(b"benchmarks.chaos.pool" in _cmdline(p) and child_pids(p)
                       for p in started)

        assert _wait(pool_children_running, 120), "the CLI started no worker pool"
        started.update(_descendants(cli.pid))
        cli.kill()
        cli.wait(30)
        assert _wait(lambda: not any(_alive(p) for p in started), 60), (
            f"{[(p, _cmdline(p)[:60]) for p in started if _alive(p)]} still running after "
            "kill -9 of the CLI")
    finally:
        if cli.poll() is None:
            cli.kill()
            cli.wait()
        for p in started:  # ours: what this test's CLI started
            if _alive(p):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(p, signal.SIGKILL)
