"""benchmarks.ops_costs (issue 16's ``ops`` step) on SeaweedFS: every row handles all its
messages, and the requests it counts are what docs/operations.md states a delayed or a
deduplicated message costs (so the table in docs/performance.md measures what it says)."""

from __future__ import annotations

import types
from typing import Any

import pytest

from benchmarks import ops_costs

pytestmark = pytest.mark.slow

N, PACKED_N = 6, 48


def test_the_ops_step_counts_what_the_docs_state(
    real_s3_config: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ops_costs, "ops_sizes", lambda quick: {"plain": N, "packed": PACKED_N})
    monkeypatch.setattr(ops_costs, "DELAY", 1.0)
    bench = types.SimpleNamespace(
        args=types.SimpleNamespace(quick=True),
        config=lambda *args, **kwargs: real_s3_config,
        topic=lambda name: name,
    )
    rows = {r["scenario"]: r for r in ops_costs.run_ops(bench)}
    assert list(rows) == ops_costs.ORDER
    for row in rows.values():
        assert "error" not in row, row
        assert row["handled"] == row["messages"]
    ops = {name: row["requests"] for name, row in rows.items()}
    # a delayed publish is one PUT, as a plain one
    assert ops["publish_delay"] == {"PutObject": N}
    # dedup: the marker created, the message, the marker marked written
    assert ops["publish_dedup"].get("PutObject") == 3 * N
    # a repeat writes nothing: every PUT is the refused create, then a GET of the marker
    assert ops["publish_dedup_repeat"] == {"PutObject": N, "!PutObject 412": N,
                                           "GetObject": N}
    # consuming a delayed message adds its promotion: a COPY and a DELETE each
    assert ops["consume_delayed"].get("CopyObject") == N
    assert ops["consume_delayed"].get("DeleteObject", 0) >= N
    assert "CopyObject" not in ops["consume"]
    # a packed topic's dedup: 2 marker PUTs a message on top of the segments
    extra = ops["packed_dedup16"]["PutObject"] - ops["packed_publish16"]["PutObject"]
    assert 2 * PACKED_N <= extra <= 2 * PACKED_N + PACKED_N // 2
    report = ops_costs.ops_report(list(rows.values()), None)
    by_name = {r["scenario"]: r for r in report}
    assert by_name["publish_dedup"]["extra_requests_per_msg"] == pytest.approx(2.0, abs=0.2)
    table = ops_costs.ops_markdown(report)
    assert all(f"| {name} |" in table for name in ops_costs.ORDER)
