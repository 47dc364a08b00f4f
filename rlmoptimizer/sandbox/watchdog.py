"""The per-cell time limit (the CPU the process uses while a host tool call runs counts, the wait does not), and
the watch between cells: a thread that calls back once an armed call has run too long, or once the idle process
has used too much CPU.

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

# How often the CPU of an idle process is sampled.
_IDLE_SAMPLE_S = 0.25


class Watchdog:
    """Calls ``on_expire`` once the armed call has spent ``limit`` seconds running.

    Counts the time between :meth:`arm`/:meth:`resume` and :meth:`pause`/:meth:`disarm`; while paused (a host
    tool call), only the CPU the process uses (a clock given to :meth:`pause`): waiting is not charged, work the
    cell keeps doing meanwhile (a Worker, a timer, other tasks) is. Between calls, :meth:`idle` watches a CPU
    clock instead. Any
    limit is safe (infinite, NaN or huge: such a limit never expires, and the thread lives on). One daemon
    thread per watchdog."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._limit: float | None = None
        self._spent = 0.0
        self._since: float | None = None
        self._on_expire: Callable[[], None] | None = None
        self._paused: tuple[Callable[[], float | None], float] | None = None  # a CPU clock and its reading at pause
        self._fired = False
        self._stopped = False
        self._idle: tuple[Callable[[], float | None], Callable[[float], None], float, float, float, float] | None = None
        self._thread = threading.Thread(target=self._loop, name="rlmoptimizer-sandbox-watchdog", daemon=True)
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def arm(self, limit: float, on_expire: Callable[[], None]) -> None:
        with self._cond:
            self._idle, self._paused = None, None
            self._limit, self._on_expire = float(limit), on_expire
            self._spent, self._since, self._fired = 0.0, time.monotonic(), False
            self._cond.notify()

    def pause(self, cpu_seconds: Callable[[], float | None] | None = None) -> None:
        """Stop counting time; with ``cpu_seconds``, count the CPU it reports instead until :meth:`resume`."""
        start = cpu_seconds() if cpu_seconds is not None else None
        with self._cond:
            if self._since is not None:
                self._spent += time.monotonic() - self._since
                self._since = None
                self._paused = (cpu_seconds, start) if start is not None else None
                self._cond.notify()

    def resume(self) -> None:
        with self._cond:
            self._spent += self._paused_cpu()
            self._paused = None
            if self._limit is not None and self._since is None:
                self._since = time.monotonic()
                self._cond.notify()

    def disarm(self) -> bool:
        """Stop counting; True if the limit was reached (and ``on_expire`` called) since :meth:`arm`."""
        with self._cond:
            self._limit, self._since, self._on_expire, self._paused = None, None, None, None
            return self._fired

    def idle(
        self,
        cpu_seconds: Callable[[], float | None],
        on_exceed: Callable[[float], None],
        *,
        allowance_s: float,
        share: float,
    ) -> None:
        """Until the next :meth:`arm`: sample ``cpu_seconds()`` and call ``on_exceed(used)`` once the CPU used
        since now exceeds ``allowance_s`` plus ``share`` of the time passed. Does nothing if the clock cannot be
        read (``None``)."""
        start = cpu_seconds()
        if start is None:
            return
        with self._cond:
            if self._limit is None:
                self._idle = (cpu_seconds, on_exceed, start, time.monotonic(), allowance_s, share)
                self._cond.notify()

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify()

    def _loop(self) -> None:
        with self._cond:
            while not self._stopped:
                if self._limit is None and self._idle is not None:
                    self._cond.wait(_IDLE_SAMPLE_S)
                    self._check_idle()
                    continue
                if self._limit is None or (self._since is None and self._paused is None):
                    self._cond.wait()
                    continue
                if self._since is None:  # paused: the CPU the process uses while the tool call runs
                    remaining = self._limit - self._spent - self._paused_cpu()
                    if remaining > 0 or remaining != remaining:
                        self._cond.wait(_IDLE_SAMPLE_S)
                        continue
                else:
                    remaining = self._limit - self._spent - (time.monotonic() - self._since)
                if remaining > 0 or remaining != remaining:  # NaN never expires
                    self._cond.wait(min(remaining, _MAX_WAIT_S) if remaining == remaining else _MAX_WAIT_S)
                    continue
                on_expire, self._fired = self._on_expire, True
                self._limit, self._since, self._on_expire, self._paused = None, None, None, None
                if on_expire is not None:
                    try:
                        on_expire()
                    except Exception:  # a failed kill shows up as a hung read, then as the next timeout
                        logger.exception("The sandbox watchdog could not stop the Deno process.")

    def _paused_cpu(self) -> float:
        """The CPU the process used since :meth:`pause` (0 when not paused with a clock, or the clock is gone)."""
        if self._paused is None:
            return 0.0
        cpu_seconds, start = self._paused
        try:
            now = cpu_seconds()
        except Exception:
            now = None
        return max(0.0, now - start) if now is not None else 0.0

    def _check_idle(self) -> None:
        idle = self._idle
        if idle is None or self._limit is not None or self._stopped:
            return
        cpu_seconds, on_exceed, start, since, allowance_s, share = idle
        try:
            now = cpu_seconds()
        except Exception:
            now = None
        if now is None:  # the process is gone
            self._idle = None
            return
        used = now - start
        if used > allowance_s + share * (time.monotonic() - since):
            self._idle = None
            try:
                on_exceed(used)
            except Exception:
                logger.exception("The sandbox watchdog could not stop the Deno process.")
