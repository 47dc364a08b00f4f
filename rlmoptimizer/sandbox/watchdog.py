"""The per-cell time limit: a thread that calls back once an armed call has run too long.

May import: the standard library only.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

logger = logging.getLogger(__name__)

# The longest single wait of the watchdog thread; a limit beyond it is waited out in steps, so any limit
# (even an infinite one) is safe for ``Condition.wait``.
_MAX_WAIT_S = 3600.0


class Watchdog:
    """Calls ``on_expire`` once the armed call has spent ``limit`` seconds running.

    Counts only the time between :meth:`arm`/:meth:`resume` and :meth:`pause`/:meth:`disarm`, so
    host tool calls (paused) are not charged. One daemon thread per watchdog."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._limit: float | None = None
        self._spent = 0.0
        self._since: float | None = None
        self._on_expire: Callable[[], None] | None = None
        self._fired = False
        self._stopped = False
        self._thread = threading.Thread(target=self._loop, name="rlmoptimizer-sandbox-watchdog", daemon=True)
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def arm(self, limit: float, on_expire: Callable[[], None]) -> None:
        with self._cond:
            self._limit, self._on_expire = float(limit), on_expire
            self._spent, self._since, self._fired = 0.0, time.monotonic(), False
            self._cond.notify()

    def pause(self) -> None:
        with self._cond:
            if self._since is not None:
                self._spent += time.monotonic() - self._since
                self._since = None

    def resume(self) -> None:
        with self._cond:
            if self._limit is not None and self._since is None:
                self._since = time.monotonic()
                self._cond.notify()

    def disarm(self) -> bool:
        """Stop counting; True if the limit was reached (and ``on_expire`` called) since :meth:`arm`."""
        with self._cond:
            self._limit, self._since, self._on_expire = None, None, None
            return self._fired

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify()

    def _loop(self) -> None:
        with self._cond:
            while not self._stopped:
                if self._limit is None or self._since is None:
                    self._cond.wait()
                    continue
                remaining = self._limit - self._spent - (time.monotonic() - self._since)
                if remaining > 0 or remaining != remaining:  # NaN never expires
                    self._cond.wait(min(remaining, _MAX_WAIT_S) if remaining == remaining else _MAX_WAIT_S)
                    continue
                on_expire, self._fired = self._on_expire, True
                self._limit, self._since, self._on_expire = None, None, None
                if on_expire is not None:
                    try:
                        on_expire()
                    except Exception:  # a failed kill shows up as a hung read, then as the next timeout
                        logger.exception("The sandbox watchdog could not stop the Deno process.")
