"""Paired per-ticket comparisons of arms scored on the same test tickets, and summaries over seeds.

Every arm is scored on the same test tickets, so two arms are compared ticket by ticket, not by their means:

* ``mcnemar(a, b)``: one seed of an arm against one run of another (0/1 correctness per ticket). The exact
  McNemar test: among the tickets where exactly one of the two is right, is "a right, b wrong" as likely as
  the reverse? A two-sided binomial test on the discordant pairs (p = 1 when there are none).
* ``sign_test(a_runs, b_runs)``: the seeds pooled. Each ticket's correctness is averaged over the seeds of
  each arm (a run without seeds, like the unchanged program, is its one run); a ticket counts for ``a`` when
  its average is higher, for ``b`` when lower, and not at all when equal. A two-sided binomial test on those
  counts. The tickets are the units, so the test asks whether the arm's gains are spread over tickets, not
  whether one lucky seed carried the mean.

No SciPy: the exact binomial tail is a sum of ``math.comb`` terms.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence


def binomial_two_sided(k: int, n: int) -> float:
    """Two-sided exact binomial p-value of ``k`` successes in ``n`` trials at p = 1/2 (1.0 when n = 0)."""
    if n == 0:
        return 1.0
    tail = min(k, n - k)
    p = 2 * sum(math.comb(n, i) for i in range(tail + 1)) / 2**n
    return min(1.0, p)


def mcnemar(a: Sequence[float], b: Sequence[float]) -> dict:
    """``a`` against ``b``, ticket by ticket: wins (a right, b wrong), losses (the reverse), exact p."""
    if len(a) != len(b):
        raise ValueError(f"paired comparison of {len(a)} against {len(b)} tickets")
    wins = sum(1 for x, y in zip(a, b, strict=True) if x >= 0.5 > y)
    losses = sum(1 for x, y in zip(a, b, strict=True) if y >= 0.5 > x)
    return {"wins": wins, "losses": losses, "p": binomial_two_sided(wins, wins + losses)}


def per_ticket_mean(runs: Sequence[Sequence[float]]) -> list[float]:
    """Each ticket's correctness averaged over ``runs`` (all of the same length)."""
    if not runs:
        raise ValueError("no runs")
    n = len(runs[0])
    if any(len(r) != n for r in runs):
        raise ValueError("runs scored on different numbers of tickets")
    return [sum(r[i] for r in runs) / len(runs) for i in range(n)]


def sign_test(a_runs: Sequence[Sequence[float]], b_runs: Sequence[Sequence[float]]) -> dict:
    """The seeds pooled: per ticket, ``a``'s seed-averaged correctness against ``b``'s; counts and exact p."""
    a, b = per_ticket_mean(a_runs), per_ticket_mean(b_runs)
    if len(a) != len(b):
        raise ValueError(f"paired comparison of {len(a)} against {len(b)} tickets")
    better = sum(1 for x, y in zip(a, b, strict=True) if x > y + 1e-9)
    worse = sum(1 for x, y in zip(a, b, strict=True) if y > x + 1e-9)
    return {
        "better": better,
        "worse": worse,
        "ties": len(a) - better - worse,
        "p": binomial_two_sided(better, better + worse),
    }


def spread(values: Sequence[float]) -> dict:
    """Mean, sample standard deviation (0 for one value), min and max."""
    values = list(values)
    return {
        "mean": statistics.fmean(values),
        "sd": statistics.stdev(values) if len(values) > 1 else 0.0,
        "min": min(values),
        "max": max(values),
        "n": len(values),
    }
