"""Test suite for pawn_queue_sync (a package so tests can import ``tests.servers``)."""
