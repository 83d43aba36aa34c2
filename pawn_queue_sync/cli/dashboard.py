"""``pawnq dashboard``: serve the dashboard page until Ctrl-C (or SIGTERM).

Read-only unless ``--allow-actions``; then a token is printed at start (or the one set in
``PAWNQ_DASHBOARD_TOKEN`` / ``--token-file`` is used) and every action must carry it.
Binding beyond loopback needs a token set by the user. Ctrl-C (or SIGTERM) stops it at
once, even while a poll hangs on the bucket: that poll is abandoned, not waited for. See
docs/operations.md, "The dashboard".
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from ..dashboard import MIN_INTERVAL, Dashboard, is_loopback
from ..dashboard.security import MIN_TOKEN_CHARS, check_token
from ..errors import InvalidArgument
from .exits import EXIT_OK, EXIT_USAGE
from .shared import CliError, emit, open_queue

#: The environment variable that sets the dashboard's token.
TOKEN_ENV = "PAWNQ_DASHBOARD_TOKEN"
#: Seconds the command waits for the first poll before it prints the address anyway.
FIRST_POLL_WAIT = 30.0


def _token(args: argparse.Namespace) -> str | None:
    """The user's token (``--token-file``'s first line, else ``PAWNQ_DASHBOARD_TOKEN``),
    or None; CliError for one unreadable, ValueError for one too short or not visible
    ASCII (the page could never send it)."""
    if args.token_file is not None:
        try:
            text = Path(args.token_file).read_text().splitlines()
        except OSError as exc:
            raise CliError(f"cannot read the token file: {exc.strerror}") from None
        token = text[0].strip() if text else ""
    else:
        token = os.environ.get(TOKEN_ENV, "").strip()
        if not token:
            return None
    if len(token) < MIN_TOKEN_CHARS:
        raise ValueError(f"the token must be at least {MIN_TOKEN_CHARS} characters")
    try:
        return check_token(token)
    except InvalidArgument as exc:
        raise ValueError(str(exc)) from None


def cmd_dashboard(args: argparse.Namespace) -> int:
    try:
        token = _token(args)
    except ValueError as exc:
        print(f"pawnq dashboard: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if not is_loopback(args.host) and token is None:
        print(f"pawnq dashboard: binding to {args.host} (beyond loopback) needs a token you "
              f"set: {TOKEN_ENV}=... or --token-file FILE (every request must then carry "
              "it)", file=sys.stderr)
        return EXIT_USAGE
    with open_queue(args) as pq:
        try:
            dash = Dashboard(pq, host=args.host, port=args.port, interval=args.interval,
                             actions=args.allow_actions, token=token,
                             allowed_hosts=args.allowed_host, private=args.private)
        except OSError as exc:
            raise CliError(f"cannot listen on {args.host}:{args.port}: {exc.strerror}") from None
        # SIGTERM ends it as Ctrl-C does, from the first-poll wait on; leaving ``with
        # dash`` stops the server and the poller without waiting for a poll under way
        previous = signal.signal(signal.SIGTERM, _interrupt)
        try:
            with dash:
                _serve(args, dash, token)
        except KeyboardInterrupt:
            pass
        finally:
            signal.signal(signal.SIGTERM, previous)
    emit("pawnq dashboard: stopped")
    return EXIT_OK


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def _serve(args: argparse.Namespace, dash: Dashboard, token: str | None) -> None:
    """Say where the page is (once the first poll is done, at most FIRST_POLL_WAIT
    seconds: a page opened then shows the topics at once, and a failing store says so
    here), then serve until interrupted."""
    dash.poller.wait_for_polls(1, timeout=FIRST_POLL_WAIT)
    error = dash.poller.snapshot()["error"]
    if error:
        print(f"pawnq dashboard: the first poll failed: {error}", file=sys.stderr)
    mode = ("actions allowed" if args.allow_actions else "read-only") + (
        ", reads need the token" if args.private else "")
    emit(f"pawnq dashboard on {dash.store}: {dash.url} ({mode})",
         f"the bucket is read at most once every {dash.poller.interval:g} s, only "
         "while a page is open; refreshing pages costs it nothing")
    if (args.allow_actions or args.private) and token is None:
        emit(f"token: {dash.token}",
             f"open {dash.url}#token={dash.token} (the fragment never leaves the browser)")
    threading.Event().wait()  # until Ctrl-C or SIGTERM (KeyboardInterrupt)


def _interval(text: str) -> float:
    value = float(text)
    if not MIN_INTERVAL <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be at least {MIN_INTERVAL:g} seconds, got {text}")
    return value


def _port(text: str) -> int:
    value = int(text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be 0-65535, got {text}")
    return value


def add_parsers(sub: Any, common: argparse.ArgumentParser) -> None:
    """Add ``dashboard`` to ``pawnq``'s subcommands."""
    p = sub.add_parser("dashboard", parents=[common],
                       help="a web page to watch topics and handle dead letters")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1; beyond loopback needs "
                   f"a token: {TOKEN_ENV} or --token-file)")
    p.add_argument("--port", type=_port, default=8710, help="port (default 8710; 0: any free)")
    p.add_argument("--interval", type=_interval, default=5.0, metavar="SECONDS",
                   help=f"seconds between polls of the bucket (default 5, at least "
                   f"{MIN_INTERVAL:g})")
    p.add_argument("--allow-actions", action="store_true",
                   help="allow redrive and purge from the page (with the token)")
    p.add_argument("--token-file", default=None, metavar="FILE",
                   help=f"read the token from FILE's first line (else {TOKEN_ENV}, else one "
                   "is made and printed when actions are allowed)")
    p.add_argument("--private", action="store_true",
                   help="reads need the token on loopback too (other users of this machine "
                   "cannot read payloads); the token is made and printed when none is set")
    p.add_argument("--allowed-host", action="append", default=[], metavar="HOST:PORT",
                   help="another Host header to answer to (a reverse proxy's name)")
    p.set_defaults(func=cmd_dashboard)
