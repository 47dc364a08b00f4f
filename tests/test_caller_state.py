"""A compile leaves the caller's dspy state as it was: its trace holds none of the optimizer's own LM calls."""

from __future__ import annotations

import dspy
from support.optimizing import compile_tickets, proposer


def test_compile_leaves_the_callers_dspy_trace_as_it_was():
    """Regression: the proposals' and the root LM's predictors ran under the caller's ``dspy.settings.trace``, which
    gained an entry per call (every agent turn with its whole REPL history) and kept them after the compile."""
    mine: list = [("the caller's", "entry")]
    sub = proposer()
    with dspy.context(trace=mine):
        result = compile_tickets([], rlm_autopilot="loop", sub_lm=sub)
    assert sub.calls  # the optimizer's own predictors ran
    assert result.selection["chosen_label"] != "baseline"
    assert mine == [("the caller's", "entry")]


def test_no_thread_of_the_compile_outlives_it():
    """Regression: the run store's and the journal's disk-sync threads stayed alive, idle, after compile()
    returned (until the garbage collector took their stores)."""
    import threading

    before = {thread.ident for thread in threading.enumerate()}
    compile_tickets([], rlm_autopilot="loop", sub_lm=proposer())
    left = [t.name for t in threading.enumerate() if t.ident not in before and t.is_alive() and not t.daemon]
    assert left == []
