"""``pawnq dashboard``: one web page to watch topics and handle dead letters.

:mod:`.server` (``Dashboard``: the standard library's HTTP server and the routes),
:mod:`.poller` (the one poller behind every open page: the bucket's cost), :mod:`.source`
(what a poll reads: ``pq.stats_all`` or its adapter, and the dead letters shown),
:mod:`.security` (read-only by default, the token, the Origin and Host checks), and the
page itself under ``static/`` (package data: no build step, no CDN). Process level,
beside the CLI: it imports the queue, nothing imports it.
"""

from __future__ import annotations

from .poller import MIN_INTERVAL, Poller
from .security import TOKEN_HEADER, is_loopback, new_token
from .server import Dashboard

__all__ = ["MIN_INTERVAL", "TOKEN_HEADER", "Dashboard", "Poller", "is_loopback", "new_token"]
