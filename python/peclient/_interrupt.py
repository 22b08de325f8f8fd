"""Ctrl-C ends the sessions of the clients that are in a request.

While a request is in flight the main thread is inside libpeclient (the
GIL released) and Python's SIGINT handler cannot run until the reply comes.
Python's C-level handler still writes the signal's number to the wakeup
fd at once: a watcher thread reads it and calls pe_client_interrupt on each
client in a request (from another thread, as pe_client.h asks), which ends
its session on a connection of its own; the request returns, and the
KeyboardInterrupt is raised in the main thread as usual.

Installed only where the process has Python's default SIGINT handler and no
wakeup fd of its own (asyncio's, say): those are then left alone.
"""
import os
import signal
import threading
import weakref


WAIT_MS = 1000  # for the request in flight
CLOSE_MS = 1000  # for the close's reply

_busy = weakref.WeakSet()  # clients in a request
_lock = threading.Lock()
_installed = False


def _watch(fd):
    while True:
        try:
            data = os.read(fd, 64)
        except InterruptedError:
            continue
        except OSError:
            return
        if not data:
            return
        if signal.SIGINT in data:
            with _lock:
                clients = list(_busy)
            for c in clients:
                c._interrupt(WAIT_MS, CLOSE_MS)


def install():
    """Start the watcher once, when this is the main thread and SIGINT and the
    wakeup fd are Python's defaults."""
    global _installed
    with _lock:
        if _installed or threading.current_thread() is not threading.main_thread():
            return
        _installed = True
        if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
            return
        r, w = os.pipe()
        os.set_blocking(w, False)
        prev = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
        if prev != -1:  # someone else's: theirs stays
            signal.set_wakeup_fd(prev)
            os.close(r)
            os.close(w)
            return
        threading.Thread(target=_watch, args=(r,), name="peclient-sigint", daemon=True).start()


class busy:
    """Marks a client as in a request for the block."""

    def __init__(self, client):
        self.client = client

    def __enter__(self):
        with _lock:
            _busy.add(self.client)

    def __exit__(self, *exc):
        with _lock:
            _busy.discard(self.client)


