"""Never worse: which candidate compile() returns, as a small pure policy.

The submission wins if it scores better than the unchanged program and at least as well as every other
candidate checked on the selection split (validation, or train without a valset); otherwise the best of
those candidates. Highest score wins; on a tie the unchanged instructions win (a change is returned only
when the selection split shows it is better), then the submission, then the latest other candidate.

May import: ``rlmoptimizer.records``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from rlmoptimizer.records import EvalRun, Selection


def never_worse(
    *, split: str, complete: Sequence[EvalRun], submitted_run: EvalRun, submission: dict[str, str],
    initial: dict[str, str],
) -> Selection:
    """Choose among ``complete`` (every run that evaluated the whole ``split``, ``submitted_run`` among them)."""
    order = {id(r): i for i, r in enumerate(complete)}
    chosen_run = max(complete, key=lambda r: (r.score, r.instructions == initial, r is submitted_run, order[id(r)]))
    others = [r for r in complete if r.instructions != submission]
    best = max(others, key=lambda r: r.score, default=None)
    if chosen_run is submitted_run and submission == initial:
        reason = f"the agent submitted the unchanged instructions, which score {submitted_run.score:.4f} on {split}"
    elif chosen_run is submitted_run:
        reason = f"the agent's submission scored {submitted_run.score:.4f} on {split}" + (
            f", more than the unchanged program and at least as well as every other candidate (best: "
            f"{best.run_id} ({best.label}) at {best.score:.4f})" if best is not None else ""
        )
    elif chosen_run.instructions == initial and chosen_run.score == submitted_run.score:
        reason = (
            f"the agent's submission scored {submitted_run.score:.4f} on {split}, the same as the unchanged "
            f"program ({chosen_run.run_id}); a change is returned only when it scores better, so the unchanged "
            "instructions are returned"
        )
    else:
        reason = (
            f"the agent's submission scored {submitted_run.score:.4f} on {split}, below {chosen_run.run_id} "
            f"({chosen_run.label}) at {chosen_run.score:.4f}; returning that candidate instead"
        )
    return _selection(split, chosen_run, complete, reason, submitted_run)


def best_checked(*, split: str, complete: Sequence[EvalRun], initial: dict[str, str], why: str,
                 spending_cap: bool = True) -> Selection:
    """The submission could not be checked on ``split`` (``why``: the spending cap stopped spending first, or
    ``max_metric_calls`` is spent): the best candidate that was checked, the unchanged instructions on a tie;
    never an unchecked submission."""
    order = {id(r): i for i, r in enumerate(complete)}
    chosen_run = max(complete, key=lambda r: (r.score, r.instructions == initial, order[id(r)]))
    reason = (f"{why} before the agent's submission could be checked on {split}; returning the best checked "
              f"candidate, {chosen_run.run_id} ({chosen_run.label}) at {chosen_run.score:.4f}")
    return replace(_selection(split, chosen_run, complete, reason, None), spending_cap_reached=spending_cap)


def _selection(split: str, chosen_run: EvalRun, complete: Sequence[EvalRun], reason: str,
               submitted_run: EvalRun | None) -> Selection:
    return Selection(
        split=split,
        instructions=dict(chosen_run.instructions),
        chosen_run_id=chosen_run.run_id,
        chosen_label=chosen_run.label,
        chosen_score=chosen_run.score,
        submission_run_id=submitted_run.run_id if submitted_run is not None else None,
        submission_score=submitted_run.score if submitted_run is not None else None,
        baseline_score=next((r.score for r in complete if r.label == "baseline"), None),
        reason=reason,
        candidates=tuple(
            {"run_id": r.run_id, "label": r.label, "score": r.score, "instructions": r.instructions} for r in complete
        ),
    )


def with_spending_cap(selection: Selection, reached: bool | None, note: str = "") -> Selection:
    """``selection`` saying whether the spending cap was reached (None: no cap), with ``note`` in its reason."""
    if reached is None:
        return selection
    reason = f"{selection.reason} ({note})" if reached and note and note not in selection.reason else selection.reason
    return replace(selection, spending_cap_reached=reached, reason=reason)
