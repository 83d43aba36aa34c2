"""Draw docs/dashboard.png: ``python -m tests.dashboard_screenshot [docs/dashboard.png]``.

A local store in a temporary directory with the browser tests' topics (tests/
dashboard_helpers.seed), a producer and a consumer at work for about 30 seconds (so the
throughput chart has points), the dashboard polling every 2 s with actions allowed, the
dead letters of ``orders`` opened, then a screenshot in headless Chromium.
"""

from __future__ import annotations

import sys
import tempfile
import threading
import time
from pathlib import Path

from pawn_queue_sync import PawnQueue
from tests.browser import Browser
from tests.dashboard_helpers import running, seed


def main(out: Path) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        config = {"local": {"path": f"{tmp}/store"}, "polling": {"interval_seconds": 0.2}}
        with PawnQueue.from_config(config) as pq:
            seed(pq)
            pq.create_topic("emails")
            stop = threading.Event()

            def work() -> None:  # publishing in bursts, consuming at a steady pace
                producer = pq.register_producer("mailer")
                consumer = pq.register_consumer("sender", ["emails"])
                n = 0
                while not stop.is_set():
                    if n % 6 == 0:
                        producer.publish_batch("emails", [{"to": f"u{i}"} for i in range(40)])
                    for m in consumer.poll(4):
                        m.ack()
                    n += 1
                    stop.wait(1.0)
                consumer.close()

            worker = threading.Thread(target=work)
            worker.start()
            try:
                with running(pq, interval=2.0, actions=True) as dash, \
                        Browser(Path(tmp) / "profile", width=1280, height=900) as b:
                    b.goto(f"{dash.url}#token={dash.token}")
                    time.sleep(30)  # polls for the chart
                    b.click('button[data-open="orders"]')
                    b.wait_for("document.querySelectorAll('tr[data-key]').length === 3")
                    b.screenshot(out)
            finally:
                stop.set()
                worker.join()
    print(f"wrote {out}")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "docs/dashboard.png"))
