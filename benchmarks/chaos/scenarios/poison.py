"""Scenario 7: a poison set among normal messages.

Poison ids (the handler always raises on them) and payloads of the wrong shape (not a
dict with an "id": the handler raises too) are published among normal messages. Each
must be dead-lettered after exactly ``max_delivery_count`` deliveries, and nothing
else dead-lettered.
"""

from __future__ import annotations

from benchmarks.chaos.harness import ChaosRun, ChaosSettings, ScenarioResult

NAME = "poison"
NUMBER = 7
FULL_MESSAGES, QUICK_MESSAGES = 1000, 60
FULL_POISON, QUICK_POISON = 40, 4
FULL_SHAPES, QUICK_SHAPES = 10, 3


def run(settings: ChaosSettings) -> ScenarioResult:
    quick = settings.quick
    n = settings.messages or (QUICK_MESSAGES if quick else FULL_MESSAGES)
    poison = QUICK_POISON if quick else FULL_POISON
    shapes = QUICK_SHAPES if quick else FULL_SHAPES
    with ChaosRun(settings) as chaos:
        chaos.start_pool()
        ids = chaos.publish(n, poison=poison, shape=shapes)
        published = chaos.published_ids(ids)
        normal = published - chaos.poison_ids
        timeout = max(120.0, n * 0.1)
        handled = chaos.wait_handled(normal)
        dead = chaos.wait_dead_lettered(published & chaos.poison_ids, timeout=timeout)
        return chaos.finish(NAME, scenario=NUMBER, notes={
            "messages": n, "poison": poison, "wrong_shape": shapes,
            "max_delivery_count": settings.max_delivery_count,
            "handled_before_stop": handled, "poison_dead_before_stop": dead,
        })
