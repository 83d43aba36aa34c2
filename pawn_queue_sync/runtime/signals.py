"""Waking a waiting thread from a signal handler, and installing stop handlers.

Shared by the :class:`~pawn_queue_sync.runtime.Listener` and the worker pool's
supervisor and children. Python runs a signal handler in the main thread, between
bytecodes; a signal the kernel hands to another thread only sets a flag, so the main
thread may sleep on through it. Making a :class:`Wakeup`'s socket the process's wakeup
fd (``signal.set_wakeup_fd``) has the C-level handler write a byte there, which wakes
a main thread waiting in :meth:`Wakeup.wait` (or selecting on :meth:`Wakeup.fileno`),
and the Python handler then runs.
"""

from __future__ import annotations

import contextlib
import select
import signal
import socket
import threading
from collections.abc import Callable, Sequence

__all__ = ["Wakeup", "STOP_SIGNALS", "install_stop_handlers"]

#: The signals that ask a listener or a worker pool to stop gracefully.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Wakeup:
    """A self-pipe: :meth:`notify` is safe in a signal handler (no lock is taken)."""

    def __init__(self) -> None:
        self._r, self._w = socket.socketpair()
        self._r.setblocking(False)
        self._w.setblocking(False)

    def write_fd(self) -> int:
        """The end a signal's C handler may write to (``signal.set_wakeup_fd``)."""
        return self._w.fileno()

    def fileno(self) -> int:
        """The end that becomes readable once notified (for ``select`` and
        ``multiprocessing.connection.wait``)."""
        return self._r.fileno()

    def notify(self) -> None:
        with contextlib.suppress(OSError):  # full (already woken) or closed (stopped)
            self._w.send(b"x")

    def wait(self, timeout: float | None) -> None:
        """Wait until notified or ``timeout`` (real seconds; None: forever; 0: just
        drain), then drain what was written."""
        try:
            select.select([self._r], [], [], timeout)
        except (OSError, ValueError):  # closed meanwhile
            return
        try:
            while self._r.recv(4096):
                pass
        except OSError:
            pass

    def close(self) -> None:
        self._w.close()
        self._r.close()


def install_stop_handlers(
    on_signal: Callable[[int, object], None],
    wakeup: Wakeup,
    signals: Sequence[signal.Signals] = STOP_SIGNALS,
) -> Callable[[], None] | None:
    """Install ``on_signal`` for ``signals`` and make ``wakeup`` the wakeup fd; the
    function that restores what was there. None (nothing installed) outside the main
    thread, where Python cannot install signal handlers."""
    if threading.current_thread() is not threading.main_thread():
        return None
    previous = {s: signal.signal(s, on_signal) for s in signals}
    # A signal may be delivered to any thread; its C handler then writes here, which
    # wakes the main thread's wait so that on_signal runs (it runs in that thread).
    previous_fd = signal.set_wakeup_fd(wakeup.write_fd(), warn_on_full_buffer=False)

    def restore() -> None:
        signal.set_wakeup_fd(previous_fd)
        for s, h in previous.items():
            signal.signal(s, h)

    return restore
