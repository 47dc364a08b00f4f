"""Metrics whose identity a resume must recognise in a new process: a function with a parameter (used through
``functools.partial``) and a callable object. They live here, in an importable module, because the identity
names the module a metric comes from."""

from __future__ import annotations

import threading

from support.tickets import metric


def weighted(example, prediction, trace=None, weight=1.0):
    return weight * metric(example, prediction)


class Judge:
    def __init__(self, strict):
        self.strict = strict

    def __call__(self, example, prediction, trace=None):
        return metric(example, prediction)


class CountingMetric:
    """The ticket metric, counting its calls under a lock (evaluations run in threads)."""

    def __init__(self):
        self.calls = 0
        self._lock = threading.Lock()

    def __call__(self, example, prediction, trace=None):
        with self._lock:
            self.calls += 1
        return metric(example, prediction, trace)
