"""The simulated S3 itself: timing, ordering and conditions, so the protocol tests built
on it prove something."""

from __future__ import annotations

import pytest

from pawn_queue_sync.encoding import md5_hex
from pawn_queue_sync.errors import ConditionFailed, ObjectNotFound
from pawn_queue_sync.protocol.effects import Delete, Get, Head, List, Now, Parallel, Put, Sleep
from tests.sim_s3 import ORIGIN, SimS3


def script(*effects, log=None):
    """A protocol that performs ``effects`` and records (virtual time, result or error)."""

    def gen(sim):
        out = []
        for effect in effects:
            try:
                res = yield effect
            except (ObjectNotFound, ConditionFailed) as exc:
                res = type(exc).__name__
            out.append((sim.now, res))
        return out

    return gen


def test_request_applied_at_arrival_and_answered_after_return_delay():
    sim = SimS3()
    a = sim.spawn("a", script(Put("k", b"x"))(sim), start=1.0, delays=[(0.25, 0.5)])
    sim.run()
    (t, res), = a.value
    assert t == pytest.approx(1.75)
    assert sim.objects["k"].written_at == pytest.approx(1.25)
    assert res.etag == md5_hex(b"x")
    assert a.requests == 1


def test_sleep_advances_only_that_actor():
    sim = SimS3()
    a = sim.spawn("a", script(Sleep(2.0), Put("k", b"a"))(sim), delays=0.0)
    b = sim.spawn("b", script(Put("k", b"b"))(sim), start=1.0, delays=0.0)
    sim.run()
    assert b.finished_at == pytest.approx(1.0)
    assert a.finished_at == pytest.approx(2.0)
    assert sim.objects["k"].body == b"a"  # last writer wins


def test_a_slow_request_lands_after_a_later_fast_one():
    sim = SimS3()
    sim.spawn("slow", script(Put("k", b"slow"))(sim), delays=[(3.0, 0.0)])
    sim.spawn("fast", script(Put("k", b"fast"))(sim), start=1.0, delays=0.0)
    sim.run()
    assert sim.objects["k"].body == b"slow"
    assert [e.actor for e in sim.log] == ["fast", "slow"]
    assert sim.log[1].before.writer == "fast"


def test_delay_list_last_item_repeats_and_function_sees_each_request():
    seen = []

    def delays(i, effect):
        seen.append((i, type(effect).__name__))
        return 0.1

    sim = SimS3()
    a = sim.spawn("a", script(Put("k", b"1"), Head("k"), Get("k"))(sim), delays=[0.5, 0.25])
    b = sim.spawn("b", script(Head("k"), Head("k"))(sim), start=5.0, delays=delays)
    sim.run()
    assert [t for t, _ in a.value] == pytest.approx([1.0, 1.5, 2.0])
    assert seen == [(0, "Head"), (1, "Head")]
    assert b.finished_at == pytest.approx(5.4)


@pytest.mark.parametrize("honoured", [True, False])
def test_if_none_match(honoured):
    sim = SimS3(if_none_match=honoured)
    sim.spawn("a", script(Put("k", b"a"), Put("k", b"a2", if_none_match=True))(sim))
    sim.run()
    out = sim.outcomes["a"].value
    assert (out[1][1] == "ConditionFailed") is honoured
    assert sim.objects["k"].body == (b"a" if honoured else b"a2")


@pytest.mark.parametrize("honoured", [True, False])
def test_if_match_on_put_and_delete(honoured):
    sim = SimS3(if_match=honoured)
    wrong = md5_hex(b"other")
    sim.spawn(
        "a",
        script(
            Put("k", b"a"),
            Put("k", b"b", if_match=wrong),
            Delete("k", if_match=wrong),
            Delete("gone", if_match=wrong),
        )(sim),
    )
    sim.run()
    results = [r for _, r in sim.outcomes["a"].value]
    if honoured:
        assert results[1:] == ["ConditionFailed"] * 3
        assert sim.objects["k"].body == b"a"
    else:
        assert results[2:] == [None, None]
        assert "k" not in sim.objects


def test_missing_key_and_time_resolution():
    sim = SimS3(time_resolution=1.0)
    sim.spawn("a", script(Head("k"), Sleep(2.7), Put("k", b"v"), Sleep(1.0), Get("k"))(sim))
    sim.run()
    res = sim.outcomes["a"].value
    assert res[0][1] == "ObjectNotFound"
    got = res[4][1]
    assert got.last_modified == sim.wall(2.0) == ORIGIN.replace(second=2)
    assert got.server_time == ORIGIN.replace(second=3)  # 3.7 floored


def test_an_exception_raised_by_the_protocol_is_its_outcome():
    def gen():
        yield Head("missing")

    sim = SimS3()
    out = sim.spawn("a", gen())
    sim.run()
    assert isinstance(out.error, ObjectNotFound)
    assert out.done


def test_list_answers_the_keys_under_the_prefix_as_they_stand_at_arrival():
    sim = SimS3(time_resolution=1.0)
    sim.spawn("w", script(Put("p/b", b"b"), Put("p/a", b"a"), Put("q/c", b"c"))(sim))
    lister = sim.spawn("l", script(List("p/"))(sim), start=1.5, delays=[(0.5, 3.0)])
    late = sim.spawn("late", script(Put("p/z", b"z"))(sim), start=2.5)
    sim.run()
    ((t, listing),) = lister.value
    assert t == pytest.approx(5.0)
    assert [(o.key, o.etag) for o in listing.objects] == [
        ("p/a", md5_hex(b"a")), ("p/b", md5_hex(b"b"))
    ]  # p/z was written after the LIST arrived (2.0), before its answer came back
    assert listing.server_time == ORIGIN.replace(second=2)
    assert late.done and lister.requests == 1


def test_now_is_the_virtual_time_and_costs_no_request():
    sim = SimS3()
    a = sim.spawn("a", script(Now(), Sleep(1.25), Now())(sim), start=2.0, delays=9.0)
    sim.run()
    assert [r for _, r in a.value] == [2.0, None, 3.25]
    assert a.requests == 0


def test_parallel_branches_are_concurrent_requests_with_their_own_delays():
    """Three PUTs at once: each branch draws the actor's next delay as it sends, the
    writes land by their own delays, the actor resumes after the slowest answer, and
    the log names the actor."""
    sim = SimS3()
    branches = (script(Put("k", b"0")), script(Put("k", b"1")), script(Head("k"), Put("j", b"2")))
    a = sim.spawn(
        "a", script(Parallel(tuple(b(sim) for b in branches)), Now())(sim),
        delays=[(0.3, 0.0), (0.1, 0.5), (0.2, 0.0), 0.05],
    )
    sim.run()
    (t_par, results), (_, now) = a.value
    assert [(e.key, e.after.body, round(e.at, 3)) for e in sim.log] == [
        ("k", b"1", 0.1), ("j", b"2", 0.25), ("k", b"0", 0.3)
    ]
    assert {e.actor for e in sim.log} == {"a"}
    assert t_par == now == pytest.approx(0.6)  # branch 1's answer: 0.1 + 0.5
    assert results[2][0][1].etag == md5_hex(b"1")  # the HEAD (0.2) saw branch 1's PUT
    assert a.requests == 4


def test_parallel_raises_the_first_error_after_every_branch_ended():
    def caught(sim, effect):
        try:
            yield effect
        except ObjectNotFound as exc:
            return (sim.now, exc)

    def missing():
        yield Head("x")

    sim = SimS3()
    a = sim.spawn("a", caught(sim, Parallel((missing(),
                                            script(Sleep(2.0), Put("k", b"v"))(sim)))))
    sim.run()
    t, exc = a.value
    assert isinstance(exc, ObjectNotFound) and t == pytest.approx(2.0)
    assert "k" in sim.objects
