"""A csprng_verify claim whose lease PUT is retried by the S3 layer (a reset, a 503,
a timeout): found by the chaos suite (scenario 1, csprng_verify, plain: 2 of 10,000
delivered twice while live, with no proxy delay on their keys), reproduced here, fixed.

Consumer B claims through a proxy that resets its first lease PUT; while B's S3 layer
backs off to retry, consumer A lists the key free, writes its lease, verifies it and
wins. Before the fix B's retry then overwrote A's lease and B's verification found its
own nonce: both held the message (about 1 round in 4). Now a lease write is not
retried later than ``jitter_min_ms`` after the check that found the key free
(``retry_by``, docs/guarantees.md): B's retry is not sent and B reads the key to see
whether its first attempt landed (a reset one never does): nothing there, and B's poll
raises the write's DeadlineExceeded (transient: its one lease write failed), or A's
lease, and B polls nothing. Either way only A holds the message.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

from pawn_queue_sync import PawnQueue
from pawn_queue_sync.clock import Clock
from pawn_queue_sync.errors import DeadlineExceeded
from tests.fault_proxy import FaultProxy, FaultRule
from tests.servers import S3Server, config_dict

#: Rounds tried: the race needs A's claim inside B's retry backoff (about 3 in 8 rounds
#: before the fix; 40 misses in a row would be ~1e-5).
ROUNDS = 40


@contextlib.contextmanager
def queues_a_and_b(
    real_s3: S3Server, real_bucket: str, b_clock: Clock | None = None
) -> Iterator[tuple[FaultProxy, PawnQueue, PawnQueue]]:
    """(the proxy, queue A straight on SeaweedFS, queue B through the proxy, on
    ``b_clock`` if given), both csprng_verify with 30 s leases."""
    cfg = config_dict(real_s3, real_bucket, concurrency={"strategy": "csprng_verify"},
                      polling={"visibility_timeout_seconds": 30})
    with FaultProxy(real_s3.endpoint_url) as proxy, PawnQueue.from_config(cfg) as qa:
        bcfg = config_dict(real_s3, real_bucket, concurrency={"strategy": "csprng_verify"},
                           polling={"visibility_timeout_seconds": 30})
        bcfg["s3"]["endpoint_url"] = proxy.endpoint_url
        qb = PawnQueue(bcfg, clock=b_clock) if b_clock else PawnQueue.from_config(bcfg)
        with qb:
            yield proxy, qa, qb


def race_rounds(
    real_s3: S3Server, real_bucket: str, b_clock: Clock | None = None, name: str = "race"
) -> None:
    """ROUNDS rounds of: B polls while its lease PUT is reset, A polls meanwhile; never
    both hold the message, one of them always does, B's poll never hangs and raises
    nothing but its failed write's transient DeadlineExceeded."""
    with queues_a_and_b(real_s3, real_bucket, b_clock) as (proxy, qa, qb):
        producer = qa.register_producer(f"{name}-p")
        for r in range(ROUNDS):
            topic = f"{name}{r}"
            qa.create_topic(topic)
            a = qa.register_consumer(f"{name}-a{r}", [topic])
            b = qb.register_consumer(f"{name}-b{r}", [topic])
            producer.publish(topic, {"n": r})
            proxy.set_rules([FaultRule("reset", 1.0, methods=frozenset({"PUT"}),
                                       prefix=f"{topic}/leases/")])
            before = len(proxy.fault_log())
            proxy.arm()
            got: dict[str, Any] = {}

            def poll_b(g: dict[str, Any] = got, c: Any = b) -> None:
                try:
                    g["b"] = c.poll(1)
                except Exception as exc:  # judged below
                    g["b"], g["b_error"] = [], exc

            tb = threading.Thread(target=poll_b)
            tb.start()
            assert proxy.wait_for(lambda n=before: len(proxy.fault_log()) > n, 10)
            proxy.disarm()
            got["a"] = a.poll(1)
            tb.join(60)
            assert not tb.is_alive(), f"round {r}: B's poll hangs"
            error = got.get("b_error")
            assert error is None or (isinstance(error, DeadlineExceeded)
                                     and error.transient), f"round {r}: B raised {error!r}"
            assert not (got["a"] and got["b"]), f"round {r}: both consumers hold the message"
            assert got["a"] or got["b"], f"round {r}: neither consumer got the message"


def test_a_retried_csprng_lease_put_never_takes_a_verified_lease(
    real_s3: S3Server, real_bucket: str
) -> None:
    race_rounds(real_s3, real_bucket)
