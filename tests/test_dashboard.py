"""``pawnq dashboard`` without a browser: the poller's bound on the bucket (virtual time),
the security model request by request (SeaweedFS), no secret in anything it serves, the
picked redrive and purge on plain and packed topics (SeaweedFS and the local store),
the command itself after ``pawnq demo``, and the page shipped as package data."""

from __future__ import annotations

import configparser
import fnmatch
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

import pawn_queue_sync
from pawn_queue_sync import PawnQueue
from pawn_queue_sync.clock import FakeClock
from pawn_queue_sync.dashboard import Dashboard, Poller
from pawn_queue_sync.dashboard.source import Reading, read_stats
from pawn_queue_sync.errors import InvalidArgument
from pawn_queue_sync.queue.deadletter_picks import purge_keys, redrive_keys
from tests.dashboard_helpers import post_action, request, running, seed
from tests.relay import Relay
from tests.servers import (
    LEAK_CHECK_ACCESS_KEY,
    LEAK_CHECK_SECRET_KEY,
    S3Server,
    config_dict,
)

ROOT = Path(__file__).resolve().parent.parent
PAWNQ = [sys.executable, "-m", "pawn_queue_sync"]

# -- the poller: one reading per interval, none while nobody looks -------------------------


def _counting_poller(clock: FakeClock, **options: Any) -> tuple[Poller, list[int]]:
    fetched: list[int] = []

    def fetch() -> Reading:
        fetched.append(1)
        return Reading([{"topic": "t", "pending": 10 - len(fetched), "in_flight": 0,
                         "dead_lettered": 0, "exact": True}], [], None)

    return Poller(fetch, 5.0, clock=clock, **options), fetched


def test_pages_read_the_last_poll_and_the_bucket_is_read_once_per_interval() -> None:
    clock = FakeClock()  # manual: time moves only here
    poller, fetched = _counting_poller(clock, idle_after=60.0)
    poller.start()
    try:
        assert poller.wait_for_polls(1)
        for _ in range(100):  # a hundred pages reading: no fetch
            assert poller.snapshot()["topics"][0]["pending"] == 9
        clock.advance(4.9)  # before the interval is up, nothing wakes the poller
        assert len(fetched) == 1
        clock.advance(0.1)  # the interval is up
        assert poller.wait_for_polls(2)
        state = poller.snapshot()  # the last page looks at t=5
        assert len(fetched) == 2 and state["topics"][0]["pending"] == 8
        # one message out in 5 s, net: the chart's point
        assert state["history"]["t"][-1][1] == pytest.approx(0.2)
        # a poll every 5 s while a page looked within 60 s: t=10, 15, ..., 65
        for n in range(3, 15):
            clock.advance(5.0)
            assert poller.wait_for_polls(n)
        for _ in range(40):  # then none, however long nobody looks
            clock.advance(30.0)
        assert len(fetched) == 14
        poller.snapshot()  # a page looks again: one poll at once
        assert poller.wait_for_polls(15)
    finally:
        poller.stop()
        clock.close()


@pytest.mark.parametrize("interval", [1.99, 0, -5, float("nan"), float("inf"), True, "5"])
def test_a_poll_interval_below_the_minimum_is_refused(interval: Any) -> None:
    with pytest.raises(InvalidArgument):
        Poller(lambda: Reading([], [], None), interval)


def test_dead_letters_are_fetched_once_for_every_page_that_asks_at_once() -> None:
    clock = FakeClock()
    started, release = threading.Event(), threading.Event()
    calls: list[str] = []

    def letters(topic: str) -> list[dict[str, Any]]:
        calls.append(topic)
        started.set()
        release.wait(60)
        return [{"key": f"{topic}/dead-letter/x.json"}]

    poller = Poller(lambda: Reading([], [], None), 5.0, letters=letters, clock=clock)
    results: list[Any] = []
    threads = [threading.Thread(target=lambda: results.append(poller.dead_letters("t")))
               for _ in range(10)]
    for t in threads:
        t.start()
    assert started.wait(60)
    release.set()
    for t in threads:
        t.join(60)
    assert calls == ["t"] and len(results) == 10
    clock.advance(5.0)  # the interval is up: read again
    poller.dead_letters("t")
    assert calls == ["t", "t"]
    clock.close()


# -- the security model, request by request ------------------------------------------------


def test_actions_are_refused_without_the_token_or_across_sites(
        real_s3_config: dict[str, Any]) -> None:
    with PawnQueue.from_config(real_s3_config) as pq:
        seed(pq)
        letters = {d.key: d.etag for d in pq.dead_letters("orders")}
        one = {"topic": "orders", "keys": [next(iter(letters))]}
        with running(pq) as ro:  # read-only: no token opens it
            status, doc = post_action(ro, "redrive", one, "x" * 43)
            assert status == 403 and "read-only" in doc["error"]
        with running(pq, actions=True) as dash:
            token = dash.token
            assert token and len(token) >= 40
            refused = [
                post_action(dash, "redrive", one, None),
                post_action(dash, "redrive", one, token[:-1] + "A" if token[-1] != "A" else "B"),
                post_action(dash, "purge", {"topic": "orders", "all": True}, ""),
                post_action(dash, "redrive", one, token, Origin="http://evil.example"),
                post_action(dash, "redrive", one, token, Origin="null"),
                post_action(dash, "redrive", one, token, Sec_Fetch_Site="cross-site"),
                post_action(dash, "redrive", one, token, Sec_Fetch_Site="same-site"),
                post_action(dash, "redrive", one, token, Host="evil.example"),
                post_action(dash, "redrive", one, token, Content_Type="text/plain"),
            ]
            assert [s for s, _ in refused] == [403] * 7 + [421, 415], refused
            status, _ = request(dash.url + "api/state", headers={"Host": "rebound.example"})
            assert status == 421  # a name rebound to 127.0.0.1 cannot read either
            status, _ = request(dash.url + "api/redrive", "OPTIONS",
                                headers={"Origin": "http://evil.example"})
            assert status == 405
            for bad in (["other/dead-letter/x.json"], ["orders/dead-letter/../x.json"],
                        ["orders/messages/x.json"], [], "orders/dead-letter/x.json"):
                status, doc = post_action(dash, "redrive", {"topic": "orders", "keys": bad},
                                          token)
                assert status == 400, (bad, doc)
            assert {d.key: d.etag for d in pq.dead_letters("orders")} == letters
            assert pq.topic_stats("orders")["pending"] == 2

            status, doc = post_action(dash, "redrive", one, token)  # the page's own request
            assert status == 200 and len(doc["moved"]) == 1
        assert pq.topic_stats("orders")["dead_letter"] == 2


def test_beyond_loopback_the_token_is_required_and_guards_reads(
        real_s3_config: dict[str, Any]) -> None:
    with PawnQueue.from_config(real_s3_config) as pq:
        seed(pq)
        with pytest.raises(InvalidArgument, match="beyond loopback"):
            Dashboard(pq, host="0.0.0.0", port=0, actions=True)
        token = "a-token-the-user-chose-0123456789"
        with running(pq, host="0.0.0.0", token=token) as dash:
            port = dash.httpd.server_address[1]
            base = f"http://127.0.0.1:{port}/"
            assert request(base)[0] == 200  # the page itself holds no data
            assert request(base + "api/state")[0] == 401
            assert request(base + "api/dead-letters?topic=orders")[0] == 401
            status, doc = request(base + "api/state", headers={"X-Pawnq-Token": token})
            assert status == 200 and {t["topic"] for t in doc["topics"]} == {"events", "orders"}
            assert doc["actions"] is False


# -- no secret reaches the page ----------------------------------------------------------

URL_SECRET = "pqDash-Url-Pa55word-LEAK"


def _everything_served(dash: Dashboard, token: str | None) -> list[str]:
    headers = {"X-Pawnq-Token": token} if token else {}
    texts = []
    for path in ("", "index.html", "dashboard.js", "dashboard.css", "api/state",
                 "api/dead-letters?topic=orders", "api/nothing", "nothing"):
        texts.append(str(request(dash.url + path, headers=headers)))
    texts.append(str(post_action(dash, "purge", {"topic": "orders", "letters": {}}, token)))
    texts.append(str(post_action(dash, "redrive", {"topic": "gone", "all": True}, token)))
    return texts


def test_no_secret_of_the_configuration_reaches_the_page(
        real_s3: S3Server, real_bucket: str) -> None:
    relay = Relay(real_s3.endpoint_url)
    netloc = relay.endpoint_url.removeprefix("http://")
    config = config_dict(real_s3, real_bucket, s3={
        "endpoint_url": f"http://pq-user:{URL_SECRET}@{netloc}",
        "aws_access_key_id": LEAK_CHECK_ACCESS_KEY,
        "aws_secret_access_key": LEAK_CHECK_SECRET_KEY,
        "max_attempts": 1, "connect_timeout_seconds": 0.5})
    try:
        with PawnQueue.from_config(config) as pq:
            seed(pq)
            with running(pq, actions=True) as dash:
                texts = _everything_served(dash, dash.token)
                assert netloc in texts[4] and "orders" in texts[4]
                relay.stop()  # the store goes away: the poll's error is shown
                dash.poller.refresh()
                status, state = request(dash.url + "api/state")
                assert status == 200 and state["error"] and state["topics"]
                texts += [str(state), *_everything_served(dash, dash.token)]
    finally:
        relay.stop()
    for text in texts:
        for secret in (LEAK_CHECK_SECRET_KEY, URL_SECRET, LEAK_CHECK_SECRET_KEY[:12]):
            assert secret not in text


# -- picked redrive and purge: plain and packed, SeaweedFS and the local store --------------


@pytest.fixture(params=["seaweedfs", "local"])
def any_store(request: pytest.FixtureRequest, tmp_path: Path) -> dict[str, Any]:
    if request.param == "local":
        return {"local": {"path": str(tmp_path / "store")}}
    return request.getfixturevalue("real_s3_config")


@pytest.mark.parametrize("packed", [False, True], ids=["plain", "packed"])
def test_picked_letters_are_redriven_and_purged_and_none_is_lost(
        any_store: dict[str, Any], packed: bool) -> None:
    with PawnQueue.from_config(any_store) as pq:
        pq.create_topic("t", packed=packed)
        ids = pq.register_producer("p").publish_batch("t", [{"n": i} for i in range(6)])
        consumer = pq.register_consumer("c", ["t"])
        seen: list[str] = []
        while len(seen) < 6:
            batch = consumer.poll(6)
            assert batch
            for m in batch:
                seen.append(m.id)
                m.nack("failed")
        consumer.close()
        letters = {d.id: d for d in pq.dead_letters("t")}
        assert sorted(letters) == sorted(ids)
        back, gone, stale = ids[:3], ids[3:5], ids[5]
        result = redrive_keys(pq.context, "t", [letters[i].key for i in back] * 2)
        assert sorted(result.moved) == sorted(back) and not result.failed
        deleted, kept = purge_keys(pq.context, "t", {letters[i].key: letters[i].etag
                                                     for i in gone})
        assert (deleted, kept) == (2, [])
        if pq.context.caps.if_match:  # a letter written again since it was shown stays
            key = letters[stale].key
            pq.store.put(key, pq.store.get(key).body + b" ")
            assert purge_keys(pq.context, "t", {key: letters[stale].etag}) == (0, [key])
        assert [d.id for d in pq.dead_letters("t")] == [stale]
        again = pq.register_consumer("c2", ["t"])
        delivered: list[str] = []
        while batch := again.poll(6):
            for m in batch:
                delivered.append(m.id)
                m.ack()
        assert sorted(delivered) == sorted(back)  # each once, none lost
        with pytest.raises(InvalidArgument):
            redrive_keys(pq.context, "t", ["t/dead-letter/a/b.json"])


# -- the command ---------------------------------------------------------------------------


def _start(args: list[str], cwd: Path, env: dict[str, str]) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen([*PAWNQ, "dashboard", *args], cwd=cwd, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None
    first = proc.stdout.readline()
    return proc, first


def test_pawnq_dashboard_after_the_demo_shows_its_topic(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PAWNQ")}
    env["PYTHONPATH"] = str(ROOT)
    demo = subprocess.run([*PAWNQ, "demo", "-n", "20"], cwd=tmp_path, env=env, text=True,
                          capture_output=True, timeout=300)
    assert demo.returncode == 0, demo.stderr
    proc, first = _start(["--port", "0"], tmp_path, env)
    try:
        assert "read-only" in first, (first, proc.stderr.read() if proc.poll() else "")
        url = first.split(": ", 1)[1].split(" ", 1)[0]
        status, state = request(url + "api/state")
        assert status == 200 and [t["topic"] for t in state["topics"]] == ["demo"]
        assert state["topics"][0]["pending"] == 0
        assert [c["name"] for c in state["consumers"]] == ["pawnq-demo-consumer"]
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "stopped" in out


def test_pawnq_dashboard_acts_only_with_the_users_token(tmp_path: Path) -> None:
    """--allow-actions with --token-file: that token works and is never printed; a POST
    without it is refused; a malformed one is a usage error, not a crash."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PAWNQ")}
    env["PYTHONPATH"] = str(ROOT)
    token = "users-own-token-0123456789abcdef"
    (tmp_path / "token").write_text(token + "\n")
    subprocess.run([*PAWNQ, "topics", "--create", "orders"], cwd=tmp_path, env=env,
                   check=True, capture_output=True, timeout=120)
    proc, first = _start(["--port", "0", "--allow-actions", "--token-file", "token"],
                         tmp_path, env)
    try:
        assert "actions allowed" in first
        url = first.split(": ", 1)[1].split(" ", 1)[0]
        origin = {"Origin": url.rstrip("/"), "Content-Type": "application/json"}
        assert request(url + "api/state")[0] == 200
        body = {"topic": "orders", "all": True}
        assert request(url + "api/redrive", "POST", body, origin)[0] == 403
        assert request(url + "api/redrive", "POST", b"{", {**origin, "X-Pawnq-Token": token,
                                                           "Content-Length": "x"})[0] == 400
        status, doc = request(url + "api/redrive", "POST", body,
                              {**origin, "X-Pawnq-Token": token})
        poll = doc.pop("poll")  # the poll count at which the page sees the action
        assert status == 200 and doc == {"moved": [], "skipped": {}, "failed": {}}
        assert isinstance(poll, int) and poll >= 2
        status, doc = request(url + "api/purge", "POST", {"topic": "nope", "all": True},
                              {**origin, "X-Pawnq-Token": token})
        assert status == 404 and "TopicNotFoundError" in doc["error"]
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert token not in first + out + err


@pytest.mark.parametrize("args,env,said", [
    (["--interval", "1"], {}, "at least 2"),
    (["--host", "0.0.0.0"], {}, "beyond loopback"),
    (["--host", "0.0.0.0"], {"PAWNQ_DASHBOARD_TOKEN": "short"}, "at least 16"),
    (["--port", "70000"], {}, "0-65535"),
])
def test_pawnq_dashboard_refuses_bad_arguments(tmp_path: Path, args: list[str],
                                               env: dict[str, str], said: str) -> None:
    full = {k: v for k, v in os.environ.items() if not k.startswith("PAWNQ")}
    full.update(env, PYTHONPATH=str(ROOT))
    done = subprocess.run([*PAWNQ, "dashboard", *args], cwd=tmp_path, env=full, text=True,
                          capture_output=True, timeout=120)
    assert done.returncode == 2 and said in done.stderr, done.stderr
    assert not (tmp_path / ".pawnqueue").exists()  # refused before the store was opened


def test_the_page_ships_in_the_wheel() -> None:
    """setup.cfg's package data names every file of the page, so the wheel carries it."""
    setup = configparser.ConfigParser()
    setup.read(ROOT / "setup.cfg")
    patterns = [p.strip() for p in
                setup["options.package_data"]["pawn_queue_sync.dashboard"].split(",")]
    static = Path(pawn_queue_sync.__file__).parent / "dashboard" / "static"
    files = sorted(p.name for p in static.iterdir())
    assert {"index.html", "dashboard.js", "dashboard.css"} <= set(files)
    for name in files:
        assert any(fnmatch.fnmatch(f"static/{name}", p) for p in patterns), name


def test_a_poll_shows_what_stats_all_counts(real_s3_config: dict[str, Any]) -> None:
    """The page's rows are ``pq.stats_all()``'s, the consumers listed once."""
    with PawnQueue.from_config(real_s3_config) as pq:
        expected = seed(pq)
        reading = read_stats(pq)
        stats = {s.topic: s for s in pq.stats_all()}
    rows = {r["topic"]: r for r in reading.topics}
    fields = ("pending", "in_flight", "dead_lettered", "delayed", "packed", "exact")
    for topic in ("orders", "events"):
        assert {k: rows[topic][k] for k in expected[topic]} == expected[topic]
        assert {k: rows[topic][k] for k in fields} == {
            k: getattr(stats[topic], k) for k in fields}
        assert rows[topic]["requests"] >= 1 and "consumers" not in rows[topic]
    assert sorted((c["name"], c["alive"]) for c in reading.consumers) == [
        ("audit", True), ("billing", True)]
