"""Benchmarks of pawn-queue-sync against pawn-queue 0.1.3 on one S3 server.

Run ``python -m benchmarks.run`` (``--quick`` for a smoke run, ``--endpoint URL`` to
use a server that is already running). Never part of the test suite: tests assert
behaviour, these measure it. See docs/performance.md.
"""
