"""What the dashboard tests share: topics with dead letters on a real store, a running
dashboard, HTTP requests to it as a browser (or an attacker) would send them."""

from __future__ import annotations

import contextlib
import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

from pawn_queue_sync import PawnQueue
from pawn_queue_sync.dashboard import Dashboard

#: A payload that runs script if the page ever put bucket data in as HTML.
XSS = "<img src=x onerror=\"document.body.dataset.xss='ran'\"><script>window.xss=1</script>"


def seed(pq: PawnQueue) -> dict[str, Any]:
    """Topic ``orders`` (plain): 5 published, 3 of them nacked (one with the XSS payload),
    2 pending; topic ``events`` (packed): 4 published, 1 acked, 3 pending; consumers
    ``billing`` and ``audit`` registered. What the page must show."""
    pq.create_topic("orders")
    pq.create_topic("events", packed=True)
    producer = pq.register_producer("shop")
    producer.publish_batch("orders", [{"order": i} for i in range(4)] + [{"note": XSS}])
    billing = pq.register_consumer("billing", ["orders"])
    taken = []
    while len(taken) < 5:
        got = billing.poll(5)
        assert got, "the 5 messages of orders could not all be claimed"
        taken += got
    nacked = [m for m in taken if m.payload.get("order") in (0, 1) or "note" in m.payload]
    nacked_ids = {m.id for m in nacked}
    for m in taken:
        if m.id in nacked_ids:
            m.nack("no such customer" if "note" not in m.payload else "bad note")
        else:
            m.release()
    producer.publish_batch("events", [{"event": i} for i in range(4)])
    audit = pq.register_consumer("audit", ["events"])
    first = audit.poll(1)
    assert len(first) == 1
    first[0].ack()
    audit.close()
    return {"orders": {"pending": 2, "in_flight": 0, "dead_lettered": 3, "delayed": 0},
            "events": {"pending": 3, "in_flight": 0, "dead_lettered": 0, "delayed": 0},
            "nacked": sorted(m.id for m in nacked)}


@contextlib.contextmanager
def running(pq: PawnQueue, **options: Any) -> Iterator[Dashboard]:
    """A started dashboard on a free loopback port, its first poll done."""
    options.setdefault("port", 0)
    with Dashboard(pq, **options) as dash:
        assert dash.poller.wait_for_polls(1), "the dashboard's first poll did not end"
        yield dash


def request(url: str, method: str = "GET", body: Any = None,
            headers: dict[str, str] | None = None) -> tuple[int, Any]:
    """(status, JSON answer) of one request; ``body`` is sent as JSON unless bytes."""
    data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=60) as answer:
            raw = answer.read()
            status = answer.status
    except urllib.error.HTTPError as exc:
        raw, status = exc.read(), exc.code
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw.decode("utf-8", "replace")


def post_action(dash: Dashboard, action: str, body: Any, token: str | None,
                **headers: str) -> tuple[int, Any]:
    """A POST as the page sends it (JSON, the token header, its own Origin)."""
    sent = {"Content-Type": "application/json", "Origin": dash.url.rstrip("/")}
    if token is not None:
        sent["X-Pawnq-Token"] = token
    sent.update({k.replace("_", "-"): v for k, v in headers.items()})
    return request(dash.url + "api/" + action, "POST", body, sent)
