"""Scenario 6: a server whose conditional writes race, under ``strategy: auto``.

The proxy runs with ``racing_cas``: while two requests for one key overlap it drops
their If-None-Match / If-Match (signing them again), as a SeaweedFS release did (issue
8800); a lone conditional request keeps them, so a sequential check sees a perfect
server. The capability probe races its creates and updates, so it must notice and fall
back to ``csprng_verify`` with a warning naming the server. The harness's queue and
every pool child probe through the proxy; then a short workload runs on it (the proxy
still racing) and is counted as the other scenarios are. Goal: every probe chose
csprng_verify, plus the usual ones.
"""

from __future__ import annotations

import logging

from benchmarks.chaos.harness import ChaosRun, ChaosSettings, ScenarioResult

NAME = "racing_cas"
NUMBER = 6
FULL_MESSAGES, QUICK_MESSAGES = 1000, 100
#: What the pool children's fallback warning says (logged at WARNING in the pool log).
FALLBACK_WORDS = ("csprng_verify",)


class _Warnings(logging.Handler):
    """The library's warnings in this process while the probe runs."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def run(settings: ChaosSettings) -> ScenarioResult:
    n = settings.messages or (QUICK_MESSAGES if settings.quick else FULL_MESSAGES)
    misses: list[str] = []
    with ChaosRun(settings) as chaos:
        assert chaos.proxy is not None
        chaos.proxy.racing_cas = True
        warnings = _Warnings()
        logger = logging.getLogger("pawn_queue_sync")
        logger.addHandler(warnings)
        try:
            chosen = chaos.queue().strategy  # the probe, through the racing proxy
        finally:
            logger.removeHandler(warnings)
        stripped_by_probe = chaos.proxy.stripped
        fallback = [m for m in warnings.messages if "csprng_verify" in m]
        if chosen != "csprng_verify":
            misses.append(f"the probe chose {chosen} on a server with a racing CAS")
        if not fallback:
            misses.append("no warning said the probe fell back to csprng_verify")
        pool = chaos.start_pool()
        ids = chaos.publish(n)
        handled = chaos.wait_handled(chaos.published_ids(ids))
        children = [line for log in sorted(chaos.run_dir.glob("pool-*.log"))
                    for line in log.read_text(errors="replace").splitlines()
                    if "WARNING" in line and all(w in line for w in FALLBACK_WORDS)]
        processes = settings.processes if pool.alive() else 0
        if len(children) < processes:
            misses.append(f"{len(children)} fallback warnings from {processes} pool children")
        return chaos.finish(NAME, scenario=NUMBER, extra_misses=misses, notes={
            "messages": n, "probe_chose": chosen,
            "probe_warning": fallback[0][:300] if fallback else None,
            "pool_fallback_warnings": len(children),
            "stripped_by_probe": stripped_by_probe, "stripped": chaos.proxy.stripped,
            "overlapped": chaos.proxy.overlapped, "handled_before_stop": handled,
            "note_probe": ("fallback warned" if fallback else "NO fallback warning")
                          + f" (+{len(children)} in the pool); "
                          + f"{chaos.proxy.stripped} requests' conditions stripped "
                          + f"({1 + len(children)} probes race 20 each)",
        })
