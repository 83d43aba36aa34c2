"""Side-by-side benchmark of pawn-queue-sync and pawn-queue 0.1.3 on one S3 server.

    python -m benchmarks.run            # full run: ~10 min on 2 cores, plus ~15 min
                                        # to publish and poll the 100,000 backlog
    python -m benchmarks.run --backlogs 1000,10000   # full run without the 100,000
    python -m benchmarks.run --quick    # smoke run (< 2 min on a quiet machine)
    python -m benchmarks.run --endpoint http://127.0.0.1:8333   # an existing server
    python -m benchmarks.run --nice -10 # on a machine shared with other work
    python -m benchmarks.run --only packed,redis,spark   # issue 14's packed topics,
                                        # redis-message-queue and Spark rows only
    python -m benchmarks.run --only ops # issue 16: delayed and deduplicated messages

Without ``--endpoint`` a SeaweedFS of its own is started on loopback and stopped at
the end. Every measured client runs in a subprocess (ours in this venv, pawn-queue in
a venv of its own, see :mod:`benchmarks.pqenv`) and counts its S3 requests with a
botocore hook; the runner starts them together, stops consumers once every published
message id has been acked, and counts each id (duplicates, losses). Results go to
``benchmarks/results/latest.json`` (``quick.json`` with ``--quick``) and a markdown
table; a full run also rewrites the tables of ``docs/performance.md``. With
``--endpoint`` the objects of the run's topics are deleted at the end.
"""

# The run is split by job: benchmarks.settings (sizes, the configuration given to both
# libraries), benchmarks.drivers (driver processes), benchmarks.scenarios (what is
# measured), benchmarks.rows (result rows), benchmarks.machine (machine facts) and
# benchmarks.report (JSON, tables); this module parses the arguments and runs them.

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # `python benchmarks/run.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    __package__ = "benchmarks"

from benchmarks import report
from benchmarks.machine import core_fingerprint, machine
from benchmarks.pqenv import pawnqueue_python
from benchmarks.scenarios import Bench
from benchmarks.server import SeaweedServer
from benchmarks.settings import OURS, RESULTS, ROOT

log = logging.getLogger("benchmarks")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="smoke run: small counts (< 2 min)")
    p.add_argument("--endpoint", help="use this S3 endpoint instead of starting SeaweedFS")
    p.add_argument("--out", type=Path, help="JSON results (default "
                   "benchmarks/results/latest.json, or quick.json with --quick)")
    p.add_argument("--doc", action=argparse.BooleanOptionalAction, default=None,
                   help="rewrite docs/performance.md with this run's tables (default: on "
                   "for a full run, off with --quick)")
    p.add_argument("--backlogs", help="comma-separated backlog sizes for the scaling run "
                   "(default 1000 with --quick, else 1000,10000,100000)")
    p.add_argument("--only", help="comma-separated steps: publish_seq,publish_batch,"
                   "consume_cw,consume_cs,e2e,idle,packed,redis,spark,ops,scaling")
    p.add_argument("--spark", action="store_true", help="run the Spark step (issue 14: "
                   "publish_dataframe and process_topic, packed vs plain) also with "
                   "--quick or --only; a full run always does")
    p.add_argument("--merge", action="store_true", help="keep the rows of --out that this "
                   "run does not measure again (e.g. with --only scaling)")
    p.add_argument("--nice", type=int, default=None, help="run the benchmark (server, "
                   "drivers) at this niceness, e.g. -10 on a machine shared with other work "
                   "(negative values need root); recorded in the results")
    p.add_argument("--keep", action="store_true", help="keep the drivers' work files")
    p.add_argument("-v", "--verbose", action="store_true")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.out is None:
        args.out = RESULTS / ("quick.json" if args.quick else "latest.json")
    if args.doc is None:
        args.doc = not args.quick
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    for noisy in ("botocore", "boto3", "urllib3", "pawn_queue_sync"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    started = time.monotonic()
    signal.signal(signal.SIGTERM, _interrupt)  # stop cleanly: drivers, server, partial JSON
    if args.nice is not None:  # inherited by the server and every driver started below
        os.setpriority(os.PRIO_PROCESS, 0, args.nice)
    pq_python = pawnqueue_python()
    workdir = Path(tempfile.mkdtemp(prefix="pqs-bench-"))
    with contextlib.ExitStack() as stack:
        server = None
        if args.endpoint:
            endpoint = args.endpoint
        else:
            server = stack.enter_context(SeaweedServer())
            endpoint = server.endpoint
        log.info("endpoint %s; pawn-queue python %s", endpoint, pq_python)
        info = machine(pq_python, server)
        bench = Bench(endpoint, server, args, pq_python, workdir)
        if args.backlogs:
            bench.size["backlogs"] = [int(x) for x in args.backlogs.split(",") if x]
        _make_buckets(bench)
        previous = None
        if args.merge and args.out.exists():
            previous = json.loads(args.out.read_text())

        def checkpoint() -> dict[str, Any]:
            info["loadavg_end"] = os.getloadavg()
            info["core_fingerprint_end"] = core_fingerprint()
            info["duration_s"] = round(time.monotonic() - started, 1)
            doc = report.build(bench, info, quick=args.quick, previous=previous)
            args.out.parent.mkdir(parents=True, exist_ok=True)
            tmp = args.out.with_suffix(".json.tmp")
            tmp.write_text(json.dumps(doc, indent=2, default=_json_default) + "\n")
            tmp.replace(args.out)
            return doc

        try:
            bench.run_all(checkpoint)
            if args.endpoint:
                bench.cleanup()
        finally:
            bench.close()
            doc = checkpoint()
            md = report.markdown(doc)
            print(md)
            log.info("wrote %s", args.out)
            if args.doc:
                report.write_doc(doc, ROOT / "docs" / "performance.md")
                log.info("wrote docs/performance.md")
            if not args.keep:
                shutil.rmtree(workdir, ignore_errors=True)
    return 0


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _make_buckets(bench: Bench) -> None:
    from pawn_queue_sync.config import load_config
    from pawn_queue_sync.storage.s3 import S3Store

    for bucket in (*bench.bucket.values(), "pqs-bench-scale"):
        cfg = load_config(bench.config(OURS, "conditional_write", 10, bucket=bucket))
        assert cfg.s3 is not None
        store = S3Store(cfg.s3)
        try:
            store.ensure_bucket(create=True)
        finally:
            store.close()


def _json_default(obj: Any) -> Any:
    if isinstance(obj, tuple):
        return list(obj)
    return str(obj)


if __name__ == "__main__":
    sys.exit(main())
