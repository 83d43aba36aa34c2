"""``python -m benchmarks.chaos [--quick] [--only 1,3] [--kinds plain,packed]
[--strategies conditional_write,csprng_verify] [--seed N] [--doc/--no-doc] [--out F]``

Runs every asked (scenario, strategy, topic kind), prints one row each as it ends, and
exits 0 iff every goal held. ``--quick`` alone runs the rows tests/test_chaos.py runs
(small counts, three rows at a time, about 2 minutes on 2 cores); with ``--only``,
``--kinds`` or ``--strategies`` it runs those rows, small, one at a time. ``--doc``
(default only for the whole full run: no ``--quick`` and no filter) writes the table
into docs/guarantees.md between the chaos markers; ``--out`` writes every row's counts
and notes as JSON.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import signal
import sys
import tempfile
from pathlib import Path

from benchmarks.chaos.harness import ScenarioResult
from benchmarks.chaos.report import HEADER, load_results, render_table, rewrite_doc, row_line
from benchmarks.chaos.scenarios import SCENARIOS
from benchmarks.chaos.suite import (
    KINDS,
    QUICK_WORKERS,
    STRATEGIES,
    plan,
    quick_plan,
    quick_seed,
    run_row,
    run_rows,
)
from tests.seaweedfs import RestartableSeaweedFS


def _list(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.chaos", description=__doc__)
    p.add_argument("--quick", action="store_true",
                   help="small counts; alone, the test suite's rows (about 2 minutes)")
    p.add_argument("--only", type=lambda s: [int(x) for x in _list(s)], default=None,
                   help="scenario numbers, e.g. 1,3")
    p.add_argument("--kinds", type=_list, default=None, help="plain,packed (default: both)")
    p.add_argument("--strategies", type=_list, default=None,
                   help="conditional_write,csprng_verify (default: both)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--doc", action=argparse.BooleanOptionalAction, default=None,
                   help="rewrite the table in docs/guarantees.md (default: full run only)")
    p.add_argument("--out", type=Path, default=None, help="results as JSON")
    p.add_argument("--from-json", type=Path, nargs="+", default=None, metavar="FILE",
                   help="run nothing: show (and with --doc write) the rows saved by --out")
    args = p.parse_args(argv)
    args.filtered = not (args.only is None and args.kinds is None and args.strategies is None)
    args.kinds = args.kinds or list(KINDS)
    args.strategies = args.strategies or list(STRATEGIES)
    if args.only is not None and not args.only:
        p.error("--only: no scenario number given")
    for number in args.only or ():
        if number not in SCENARIOS:
            p.error(f"no chaos scenario {number} (known: {sorted(SCENARIOS)})")
    for path in args.from_json or ():
        if not path.is_file():
            p.error(f"--from-json: no such file {str(path)!r}")
    for kind in args.kinds:
        if kind not in KINDS:
            p.error(f"unknown kind {kind!r} (plain, packed)")
    for strategy in args.strategies:
        if strategy not in (*STRATEGIES, "auto"):
            p.error(f"unknown strategy {strategy!r}")
    return args


class Terminated(KeyboardInterrupt):
    """SIGTERM: unwinds like Ctrl-C, so every run's cleanup runs (pool, producers, frozen
    consumer, proxy, SeaweedFS, temp dirs)."""


def _on_sigterm(signum: int, frame: object) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second one must not cut cleanup short
    raise Terminated


def main(argv: list[str] | None = None) -> int:
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        return _main(argv)
    except Terminated:
        print("terminated (SIGTERM): stopped and cleaned up", file=sys.stderr)
        return 128 + signal.SIGTERM
    finally:
        signal.signal(signal.SIGTERM, previous)


def _main(argv: list[str] | None) -> int:
    args = parse(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    if args.from_json:
        order = {"plain": 0, "packed": 1}
        results = sorted(load_results(args.from_json),
                         key=lambda r: (r.scenario, order.get(r.kind, 2), r.strategy))
        print(HEADER)
        for result in results:
            print(row_line(result))
        return _conclude(args, results)
    rows = plan(only=args.only, kinds=args.kinds, strategies=args.strategies)
    print(HEADER, flush=True)
    results = []
    with contextlib.ExitStack() as stack:
        shared = None
        if args.quick:  # one SeaweedFS for every row, in turn: a start instead of one each
            workdir = stack.enter_context(tempfile.TemporaryDirectory(prefix="chaos-quick-"))
            shared = stack.enter_context(RestartableSeaweedFS(Path(workdir)))
        if args.quick and not args.filtered:  # the test suite's rows, as it runs them
            done = run_rows(quick_plan(), quick=True, seed=quick_seed, shared_server=shared,
                            workers=QUICK_WORKERS)
            for result in done.values():
                results.append(result)
                print(row_line(result), flush=True)
            rows = []
            _save(args, results)
        for row in rows:
            result = run_row(row, quick=args.quick, seed=args.seed, shared_server=shared)
            results.append(result)
            print(row_line(result), flush=True)
            _save(args, results)  # after each row: an interrupted run keeps its rows
    return _conclude(args, results)


def _save(args: argparse.Namespace, results: list[ScenarioResult]) -> None:
    if args.out is not None:
        args.out.write_text(json.dumps([r.as_dict() for r in results], indent=1, default=str))


def _conclude(args: argparse.Namespace, results: list[ScenarioResult]) -> int:
    """Write the doc table if asked, say each miss; the exit status."""
    whole_full_run = not (args.quick or args.from_json or args.filtered)
    if args.doc if args.doc is not None else whole_full_run:
        source = ", ".join(str(path) for path in args.from_json) if args.from_json else None
        rewrite_doc(render_table(results, quick=args.quick, seed=args.seed, source=source))
    failed = [r for r in results if not r.goals_met]
    for r in failed:
        print(f"MISSED {r.scenario} {r.name} {r.strategy} {r.kind}: {'; '.join(r.misses)}",
              file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
