"""Scenario 1: many messages through a proxy that injects faults on every request kind.

3 processes x 8 threads; 5 % errors (500 InternalError, 503 SlowDown, connection
resets, read timeouts: a quarter each), 2 % answers dropped after the server applied
the request, 1 % stalls of 2 s (half on the request, half on the answer; always shorter
than the client's read timeout, else a stall is a timeout: 1 s with --quick, whose read
timeout is 1.5 s). Publishing runs under the same faults.
"""

from __future__ import annotations

from benchmarks.chaos.harness import ChaosRun, ChaosSettings, ScenarioResult
from tests.fault_proxy import FaultRule

NAME = "faults"
NUMBER = 1
FULL_MESSAGES, QUICK_MESSAGES = 10_000, 60
STALL_SECONDS = 2.0


def stall_seconds(settings: ChaosSettings) -> float:
    """A stall's length: STALL_SECONDS, but at most two thirds of the client's read
    timeout (a stall the client times out on would be a read timeout, not a stall)."""
    return min(STALL_SECONDS, settings.read_timeout * 2 / 3)


def rules(settings: ChaosSettings) -> list[FaultRule]:
    """The fault mix, per request."""
    hold = settings.read_timeout + 1.0  # past the client's read timeout
    return [
        FaultRule("error_500", 0.0125),
        FaultRule("slowdown_503", 0.0125),
        FaultRule("reset", 0.0125),
        FaultRule("read_timeout", 0.0125, delay_seconds=hold),
        FaultRule("drop_answer", 0.02),
        FaultRule("delay_request", 0.005, delay_seconds=stall_seconds(settings)),
        FaultRule("delay_answer", 0.005, delay_seconds=stall_seconds(settings)),
    ]


def run(settings: ChaosSettings) -> ScenarioResult:
    n = settings.messages or (QUICK_MESSAGES if settings.quick else FULL_MESSAGES)
    with ChaosRun(settings) as chaos:
        assert chaos.proxy is not None
        chaos.queue()  # probe before the faults (strategy auto)
        chaos.proxy.set_rules(rules(settings))
        chaos.start_pool()
        chaos.proxy.arm()
        ids = chaos.publish(n)
        handled = chaos.wait_handled(chaos.published_ids(ids))
        chaos.proxy.disarm()
        return chaos.finish(NAME, scenario=NUMBER, notes={
            "messages": n, "handled_before_stop": handled,
            "stalls": sum(1 for f in chaos.proxy.fault_log() if f.kind.startswith("delay_")),
        })
