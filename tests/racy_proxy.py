"""A loopback HTTP proxy in front of an S3 server that can make conditional writes race,
for the capability probe's tests (test_probe_race.py): :class:`tests.fault_proxy.FaultProxy`
with ``racing_cas`` and no faults, which also remembers every request's path."""

from __future__ import annotations

from tests.fault_proxy import FaultProxy
from tests.servers import ACCESS_KEY, REGION, SECRET_KEY


class RacyProxy(FaultProxy):
    """A loopback HTTP proxy in front of an S3 server, for the capability probe's tests.

    Honest (``strip_overlapping=False``) it forwards every request as it came. Racy, it
    models a server whose conditional writes break under concurrency (SeaweedFS issue
    8800): a PUT or DELETE carrying If-None-Match / If-Match waits up to
    ``overlap_wait`` seconds for another request on the same key to be in flight (an
    event, not a sleep: it goes on as soon as one arrives), and while two overlap it
    drops their condition headers and signs them again (the server checks
    signatures), so both succeed. A lone conditional request keeps its headers.

    ``paths`` lists ``(method, path)`` of every request received; ``stripped``
    counts requests whose conditions were dropped; ``overlapped`` counts requests that
    arrived while another one on the same key was in flight (honest or not).
    """

    _track_overlap = True

    def __init__(
        self,
        upstream: str,
        *,
        strip_overlapping: bool,
        access_key: str = ACCESS_KEY,
        secret_key: str = SECRET_KEY,
        region: str = REGION,
        overlap_wait: float = 0.5,
    ) -> None:
        super().__init__(
            upstream, racing_cas=strip_overlapping, overlap_wait=overlap_wait,
            access_key=access_key, secret_key=secret_key, region=region,
        )
        self.paths: list[tuple[str, str]] = []

    def _seen(self, method: str, path: str) -> None:
        with self._lock:
            self.paths.append((method, path))

    def count(self, path_prefix: str = "", method: str | None = None) -> int:
        """How many requests had a path starting with ``path_prefix`` (and ``method``)."""
        with self._lock:
            return sum(
                1 for m, p in self.paths
                if p.startswith(path_prefix) and (method is None or m == method)
            )
