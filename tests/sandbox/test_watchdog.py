"""The watchdog thread survives any limit it is given and still enforces the next finite one; between calls it
stops a process whose CPU clock keeps running."""

from __future__ import annotations

import threading
import time
import types

import pytest

from rlmoptimizer.sandbox import watchdog as watchdog_module
from rlmoptimizer.sandbox.protocol import ProtocolReader
from rlmoptimizer.sandbox.watchdog import Watchdog


class ThreadClock:
    """The watchdog module's clock, telling the test each time one watchdog's own thread reads it."""

    def __init__(self) -> None:
        self.reads = threading.Semaphore(0)
        self.thread: threading.Thread | None = None

    def monotonic(self) -> float:
        if threading.current_thread() is self.thread:
            self.reads.release()
        return time.monotonic()

    def read_by_the_thread(self) -> None:
        """Wait until the thread has read the clock: it is computing how long to wait."""
        assert self.reads.acquire(timeout=30), "the watchdog thread did not look at the clock"


@pytest.mark.parametrize("limit", [float("inf"), float("nan"), 1e300, 1e18])
def test_the_watchdog_survives_any_limit_and_enforces_the_next_finite_one(limit, monkeypatch):
    clock = ThreadClock()
    monkeypatch.setattr(watchdog_module, "time", types.SimpleNamespace(monotonic=clock.monotonic))
    watchdog = Watchdog()
    clock.thread = watchdog._thread
    never = threading.Event()
    try:
        watchdog.arm(limit, never.set)
        clock.read_by_the_thread()  # the thread computes its wait from the limit...
        with watchdog._cond:  # ...and waits with it (or died trying)
            pass
        assert watchdog.alive
        watchdog.pause()
        watchdog.resume()
        clock.read_by_the_thread()  # woken by resume, it computes its wait again
        with watchdog._cond:
            pass
        assert watchdog.alive and not never.is_set()
        assert watchdog.disarm() is False
        expired = threading.Event()
        watchdog.arm(0.2, expired.set)
        assert expired.wait(30), "a finite limit after an unbounded one was not enforced"
        assert watchdog.disarm() is True and watchdog.alive
    finally:
        watchdog.stop()


def test_idle_watch_stops_a_process_whose_cpu_keeps_running_and_spares_a_quiet_one():
    watchdog = Watchdog()
    try:
        started = time.monotonic()
        busy, quiet = threading.Event(), threading.Event()
        used: list[float] = []
        watchdog.idle(
            lambda: time.monotonic() - started, lambda s: (used.append(s), busy.set()), allowance_s=0.3, share=0.02
        )
        assert busy.wait(30) and used[0] > 0.3  # a clock running like a busy core

        samples = threading.Semaphore(0)

        def standing_clock() -> float:
            samples.release()
            return 5.0

        watchdog.idle(standing_clock, lambda s: quiet.set(), allowance_s=0.3, share=0.02)
        for _ in range(1 + 6):  # read when the watch starts and at each check: the 7th comes after 5 checks
            assert samples.acquire(timeout=30), "the idle watch stopped sampling"
        assert not quiet.is_set()  # a clock that stands still
        watchdog.arm(60, lambda: None)  # a call ends the idle watch
        assert watchdog.disarm() is False and watchdog.alive
    finally:
        watchdog.stop()


def test_a_paused_call_counts_the_cpu_the_process_uses_not_the_wait():
    watchdog = Watchdog()
    try:
        expired = threading.Event()
        watchdog.arm(1.0, expired.set)
        watchdog.pause(lambda: 5.0)  # a tool call the process only waits on: its CPU clock stands still
        assert not expired.wait(2.0)  # past the limit in wall time, not in CPU
        watchdog.resume()
        assert watchdog.disarm() is False

        watchdog.arm(1.0, expired.set)
        started = time.monotonic()
        watchdog.pause(lambda: time.monotonic() - started)  # a Worker spinning while the call waits
        assert expired.wait(30)
        assert watchdog.disarm() is True and watchdog.alive
    finally:
        watchdog.stop()


class _Chunks:
    """A binary stream serving ``data`` in chunks, like a pipe."""

    def __init__(self, data: bytes, chunk: int = 65536):
        self.data, self.at, self.chunk = data, 0, chunk

    def read1(self, n: int) -> bytes:
        piece = self.data[self.at : self.at + min(n, self.chunk)]
        self.at += len(piece)
        return piece


def test_the_reader_cuts_an_oversize_answer_and_keeps_what_follows():
    answer = b'{"jsonrpc":"2.0","result":{"output":"' + b"z" * 3_000_000 + b'"},"id":"abc"}\n'
    follow = b'{"jsonrpc":"2.0","result":{"output":"ok"},"id":"def"}\n'
    reader = ProtocolReader(_Chunks(answer + follow), max_line_bytes=1_000_000)
    reader.expect("abc", executing=True)
    first = reader.readline()
    assert '"OutputTooLarge"' in first and '"abc"' in first and len(first) < 2000
    reader.expect("def", executing=True)
    assert reader.readline() == follow.decode()
    assert reader.readline() == ""
