"""Never worse: which candidate compile() returns, as a small pure policy, and the one rule that ranks candidates.

The rule (:func:`~rlmoptimizer.records.first_sample_complete`, :func:`~rlmoptimizer.records.ranked`, in
:mod:`rlmoptimizer.records` so every room that ranks candidates can use it), the same wherever candidates are
ranked (the selection, ``detailed_results``, ``candidate_programs``, the agent's ``candidates()``): a candidate's
score on a split is the score of a run of it on the whole split at its first sample (rollout 0); an extra rollout
(a lucky sample) or a run of part of the split never ranks it. Highest score first; on a tie the unchanged
instructions, then the preferred candidate (the submission), then the latest.

The policy: the submission wins if it scores better than the unchanged program and at least as well as every
other candidate checked on the selection split (validation, or train without a valset); otherwise the best of
those candidates (a change is returned only when the selection split shows it is better).

A change must be clearly better (:func:`clear_gain`): on the examples both ran, its gain over the unchanged program
must stay above zero when its largest single gain is turned into a loss of the same size; with pass/fail scores,
it wins at least 3 more examples than it loses. One example that flips (a lucky sample, a noisy label) never
decides what is returned. A candidate that scores more without a clear gain is passed over for the best one that
has one, or the unchanged program. This costs no metric call; on a small split it makes a change rarer, and the
reason says so.

Fresh train evidence counts beside the selection split (:func:`confirmed_differences`): a candidate ahead of the
unchanged program but not clearly may be confirmed (``confirm_gain()``, the default loop's last move when budget is
left) on train examples it was never evaluated on before, paired with the unchanged program's records of them. Only
records of a ``"confirm"`` run count, and only on examples the candidate had no earlier record of: an example it
was compared, accepted or chosen on (GEPA's minibatch, a proposal's comparison) never counts twice. Each confirmed
example costs one metric call, two when the unchanged program has no record of it either.

May import: ``rlmoptimizer.records``.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import replace

from rlmoptimizer.records import EvalRun, Selection, first_sample_complete, ranked

CONFIRM = "confirm"
"""The label of the runs whose records are fresh train evidence for the selection (:func:`confirmed_differences`)."""
SMALL_SPLIT = 30
"""Below this many examples, the selection split is called small when a compile starts (:func:`small_split_note`)."""

__all__ = [
    "best_checked",
    "clear_gain",
    "confirmed_differences",
    "small_split_note",
    "tiny_split_warning",
    "first_sample_complete",
    "never_worse",
    "ranked",
    "with_spending_cap",
]


def clear_gain(differences: Sequence[float]) -> bool:
    """Whether paired per-example score differences (candidate minus reference) show a gain no single example
    decides: the total stays above zero when the largest single gain is turned into a loss of the same size. With
    pass/fail scores: at least 3 more examples won than lost."""
    return bool(differences) and sum(differences) - 2 * max(0.0, max(differences)) > 0


TINY_SPLIT = 10
"""Below this many examples, the selection split is warned about whatever ``verbose`` says (:func:`tiny_split_warning`)."""


def tiny_split_warning(val_size: int, train_size: int) -> str | None:
    """What a selection split too small to show most gains means, warned about when a compile starts; None from
    :data:`TINY_SPLIT` examples up."""
    size, split = (val_size, "valset") if val_size else (train_size, "trainset (no valset was given)")
    if size >= TINY_SPLIT:
        return None
    if size >= 3:
        odds = f"on {size} only a large gain can show that (few changes make one)"
    elif val_size:
        odds = (
            "no change can show that on it alone (only fresh train examples confirming a lead can), so the unchanged "
            "program is the likely result"
        )
    else:
        odds = "no change can show that on it, so the unchanged program is returned"
    return (
        f"The {split} decides what is returned and has {size} example(s): a change is returned only when it wins at "
        f"least 3 more examples than it loses, and {odds}. Give a valset of {SMALL_SPLIT} or more examples."
    )


def small_split_note(val_size: int, train_size: int) -> str | None:
    """What a small selection split means for the result, said when a compile starts; None from
    :data:`SMALL_SPLIT` examples up."""
    size, split = (val_size, "validation set") if val_size else (train_size, "train set (no valset)")
    if size >= SMALL_SPLIT:
        return None
    return (
        f"The {split} that decides what is returned has {size} examples: a change is returned only when it "
        "wins at least 3 of them more than it loses (with pass/fail scores), so one example never decides. "
        f"Give a valset of {SMALL_SPLIT} or more examples to let smaller gains count."
    )


OwnDemos = Callable[[dict[str, str]], Collection[int]]
"""The train ids whose own answers a candidate's instructions hold as demos (none by default)."""


def _no_demos(instructions: dict[str, str]) -> Collection[int]:
    return ()


def paired_differences(run: EvalRun, reference: EvalRun, left_out: Collection[int] = ()) -> list[float]:
    """``run``'s score minus ``reference``'s on each example both have an answered record of (an LM call that failed
    without an answer scores 0 and says nothing of the instructions), but those in ``left_out``."""
    theirs = {r.example_id: r.score for r in reference.records if r.reusable and r.example_id not in left_out}
    return [r.score - theirs[r.example_id] for r in run.records if r.reusable and r.example_id in theirs]


def confirmed_differences(
    train_runs: Sequence[EvalRun], instructions: dict[str, str], initial: dict[str, str]
) -> list[float]:
    """Fresh train evidence for ``instructions`` against the unchanged program (``initial``): on each train example
    whose first record of ``instructions`` (rollout 0, in run order) was made by a :data:`CONFIRM` run, its score
    minus the unchanged program's. An example they were evaluated on before (compared, accepted or chosen on) never
    counts."""
    if instructions == initial:
        return []
    first: dict[int, tuple[str, float]] = {}
    unchanged: dict[int, float] = {}
    for run in train_runs:
        if run.split != "train" or run.rollout != 0:
            continue
        for record in run.records:
            if not record.reusable:
                continue
            if run.instructions == instructions:
                first.setdefault(record.example_id, (run.label, record.score))
            elif run.instructions == initial:
                unchanged.setdefault(record.example_id, record.score)
    return [score - unchanged[i] for i, (label, score) in sorted(first.items()) if label == CONFIRM and i in unchanged]


def _evidence(
    run: EvalRun, baseline: EvalRun, train_runs: Sequence[EvalRun], own_demos: OwnDemos = _no_demos
) -> tuple[list[float], list[float]]:
    """``run``'s paired differences with the unchanged program on the selection split, and on fresh train examples.
    On train (no valset), the examples either program holds as demos are left out: a demo sees its own answer."""
    if run.split == "train":  # train is the selection split (no valset): its records are all counted already
        left_out = {*own_demos(run.instructions), *own_demos(baseline.instructions)}
        return paired_differences(run, baseline, left_out), []
    return paired_differences(run, baseline), confirmed_differences(train_runs, run.instructions, baseline.instructions)


def describe_evidence(split_differences: Sequence[float], fresh: Sequence[float], split: str) -> str:
    """``won W and lost L of N <split> examples`` (and of the fresh train examples, when there are any)."""

    def counts(differences: Sequence[float]) -> str:
        wins, losses = sum(1 for d in differences if d > 0), sum(1 for d in differences if d < 0)
        return f"won {wins} and lost {losses} of {len(differences)}"

    text = f"{counts(split_differences)} {split} examples"
    return text + (f", {counts(fresh)} fresh train examples" if fresh else "")


def _clearly_better(
    ranking: Sequence[EvalRun],
    initial: dict[str, str],
    train_runs: Sequence[EvalRun] = (),
    own_demos: OwnDemos = _no_demos,
) -> tuple[EvalRun, str]:
    """The first run of ``ranking`` that is the unchanged program or clearly better than it (:func:`clear_gain`
    over its paired differences on the split and on fresh train examples), and, when that passed over
    better-scoring runs, a sentence saying why."""
    baseline = next((r for r in ranking if r.instructions == initial), None)
    if baseline is None:
        return ranking[0], ""
    for run in ranking:
        if run.instructions == initial or clear_gain(
            [d for part in _evidence(run, baseline, train_runs, own_demos) for d in part]
        ):
            break
    if run is ranking[0]:
        return run, ""
    top = ranking[0]
    on_split, fresh = _evidence(top, baseline, train_runs, own_demos)
    confirm = (
        ""
        if fresh or top.split != "val"
        else (
            "; a lead can be confirmed on train examples no search saw, when budget is left for them (confirm_gain(), "
            "the default loop's last move)"
        )
    )
    return run, (
        f"{top.run_id} ({top.label}) scored {top.score:.4f}, above the unchanged program's {baseline.score:.4f}, but "
        f"it {describe_evidence(on_split, fresh, top.split)}: a gain one example could undo (a change is returned "
        f"when it wins at least 3 more examples than it loses; a larger {top.split} split makes that easier to "
        f"show{confirm})"
    )


def never_worse(
    *,
    split: str,
    complete: Sequence[EvalRun],
    submitted_run: EvalRun,
    submission: dict[str, str],
    initial: dict[str, str],
    train_runs: Sequence[EvalRun] = (),
    submitted_by: str = "the agent's submission",
    own_demos: OwnDemos = _no_demos,
) -> Selection:
    """Choose among ``complete`` (every run that evaluated the whole ``split``, ``submitted_run`` among them);
    ``train_runs``: the compile's train runs (their fresh evidence counts, :func:`confirmed_differences`);
    ``submitted_by``: what made the submission, as the reason names it (the agent's SUBMIT, the default loop, ...);
    ``own_demos``: the train ids a candidate holds as demos (left out of its evidence on train)."""
    ranking = ranked(complete, initial=initial, preferred=submitted_run)
    chosen_run, unclear = _clearly_better(ranking, initial, train_runs, own_demos)
    others = [r for r in complete if r.instructions != submission]
    best = max(others, key=lambda r: r.score, default=None)
    if chosen_run is submitted_run:
        basis = "submission"
    else:
        basis = "unchanged" if chosen_run.instructions == initial else "other candidate"
    if chosen_run is submitted_run and submission == initial:
        reason = f"{submitted_by} is the unchanged instructions, which score {submitted_run.score:.4f} on {split}"
    elif chosen_run is submitted_run:
        reason = f"{submitted_by} scored {submitted_run.score:.4f} on {split}" + (
            f", more than the unchanged program and at least as well as every other candidate (best: "
            f"{best.run_id} ({best.label}) at {best.score:.4f})"
            if best is not None
            else ""
        )
    elif chosen_run.instructions == initial and chosen_run.score == submitted_run.score:
        reason = (
            f"{submitted_by} scored {submitted_run.score:.4f} on {split}, the same as the unchanged "
            f"program ({chosen_run.run_id}); a change is returned only when it scores better, so the unchanged "
            "instructions are returned"
        )
    else:
        reason = (
            f"{submitted_by} scored {submitted_run.score:.4f} on {split}, below {chosen_run.run_id} "
            f"({chosen_run.label}) at {chosen_run.score:.4f}; returning that candidate instead"
        )
    if unclear:
        reason = f"{unclear}; returning {chosen_run.run_id} ({chosen_run.label}) at {chosen_run.score:.4f}"
    reason += _confirmed(chosen_run, ranking, initial, train_runs, own_demos)
    return _selection(split, chosen_run, complete, reason, submitted_run, basis)


def _confirmed(
    chosen_run: EvalRun,
    ranking: Sequence[EvalRun],
    initial: dict[str, str],
    train_runs: Sequence[EvalRun],
    own_demos: OwnDemos = _no_demos,
) -> str:
    """What the returned change won on, when fresh train examples counted toward its clear gain."""
    baseline = next((r for r in ranking if r.instructions == initial), None)
    if baseline is None or chosen_run.instructions == initial:
        return ""
    on_split, fresh = _evidence(chosen_run, baseline, train_runs, own_demos)
    if not fresh:
        return ""
    return f" (a clear gain: it {describe_evidence(on_split, fresh, chosen_run.split)})"


def best_checked(
    *,
    split: str,
    complete: Sequence[EvalRun],
    initial: dict[str, str],
    why: str,
    spending_cap: bool | None = True,
    partial: EvalRun | None = None,
    train_runs: Sequence[EvalRun] = (),
    submitted_by: str = "the agent's submission",
    own_demos: OwnDemos = _no_demos,
) -> Selection:
    """The submission could not be checked on the whole ``split`` (``why``: the spending cap stopped spending, or
    ``max_metric_calls`` is spent), before its check or during it (``partial``: the run of it that was cut
    short): the best candidate that was checked (:func:`ranked`); never a submission checked on part of the split."""
    chosen_run, unclear = _clearly_better(ranked(complete, initial=initial), initial, train_runs, own_demos)
    if partial is None:
        when = f"before {submitted_by} could be checked on {split}"
    else:
        when = (
            f"while {submitted_by} was being checked on {split} ({partial.run_id}: "
            f"{partial.evaluated_count} of {partial.requested_count} examples, so it is not returned)"
        )
    reason = (
        f"{why} {when}; returning the best checked candidate, {chosen_run.run_id} ({chosen_run.label}) at "
        f"{chosen_run.score:.4f}"
    ) + (f" ({unclear})" if unclear else "")
    return replace(
        _selection(split, chosen_run, complete, reason, None, "best checked"), spending_cap_reached=spending_cap
    )


def _selection(
    split: str,
    chosen_run: EvalRun,
    complete: Sequence[EvalRun],
    reason: str,
    submitted_run: EvalRun | None,
    basis: str,
) -> Selection:
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
        basis=basis,
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
