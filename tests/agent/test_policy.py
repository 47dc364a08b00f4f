"""The default policy by value: every action it can return, from a state built by hand (no sandbox, no LM), and
the memory each move's outcome leaves."""

from __future__ import annotations

from dataclasses import replace

import pytest

from rlmoptimizer.agent.policy import (
    DEMOS,
    END,
    GEPA,
    TARGETED,
    Adopt,
    Adopted,
    Analyze,
    Analyzed,
    BudgetView,
    CheckValidation,
    Compare,
    Compared,
    CompareValidation,
    Confirm,
    EvaluateTrain,
    GepaFinished,
    LastDraw,
    LoopMemory,
    LoopState,
    PromptEdited,
    Propose,
    Proposed,
    ProposeDemos,
    RunGepa,
    Submit,
    Validated,
    fold,
    gepa_budget,
    next_action,
)

STEPS = ("summarize", "route")


def state(memory: LoopMemory | None = None, **budget) -> LoopState:
    budget.setdefault("left", 40)
    budget.setdefault("val_size", 8)
    budget.setdefault("reserve", budget["val_size"] or 12)
    budget.setdefault("proposals_left", budget["left"])
    budget.setdefault("failing", 2)
    return LoopState(memory or LoopMemory.start(STEPS), BudgetView(**budget))


def after(*outcomes) -> LoopMemory:
    memory = LoopMemory.start(STEPS)
    for outcome in outcomes:
        memory = fold(memory, outcome)
    return memory


def test_gepa_comes_first_with_all_the_budget_unless_a_fifth_pays_a_targeted_round():
    assert next_action(state(left=40)) == RunGepa(40)  # a fifth (8) does not pay a check (8), a proposal and 2x3
    assert next_action(state(left=100)) == RunGepa(80)  # a fifth (20) does
    assert gepa_budget(BudgetView(left=100, reserve=8)) == 80
    assert RunGepa(80).phase == GEPA and RunGepa(80).call == "run_gepa(budget=80)"


def test_no_gepa_run_when_no_sub_lm_prompt_is_left_for_its_reflections():
    """Regression: the agent's own llm_query calls had spent every sub-LM prompt; the loop still ran GEPA, which
    paid minibatches for reflections it could not ask, then found nothing."""
    spent = state(left=40, proposals_left=0, demos=True)
    assert next_action(spent) == ProposeDemos()  # what needs no sub LM, then the end
    assert next_action(state(left=40, proposals_left=0)) == Submit("no sub-LM prompt is left for a proposal")
    assert next_action(state(left=40, proposals_left=0, unfinished_gepa=12)) == RunGepa(12)  # its reflections kept
    # nothing fails yet and nothing could use a failure found now (no sub-LM prompt, no demos): the end
    nothing = state(after(GepaFinished(None)), left=40, proposals_left=0, failing=0, unevaluated=(1, 2, 3))
    assert next_action(nothing) == Submit("no sub-LM prompt is left for a proposal")
    assert next_action(replace(nothing, budget=replace(nothing.budget, proposals_left=5))) == EvaluateTrain((1, 2, 3))


def test_gepas_best_is_adopted_and_checked_even_with_nothing_left():
    memory = after(GepaFinished("gepa-2"))
    action = next_action(state(memory, left=0))
    assert action == Adopt("gepa-2", check=True)  # GEPA scored it on validation: the check is free
    assert action.phase == GEPA
    assert action.call == "adopt_candidate('gepa-2'); evaluate_program(split='val')"
    memory = fold(fold(memory, Adopted("gepa-2", changed=True)), Validated())
    assert next_action(state(memory, left=0)) == Submit("the budget is spent")


def test_a_compared_winner_is_adopted_with_its_check_when_the_check_can_be_paid():
    memory = after(GepaFinished(None), Proposed("route", ("proposal-1",), (1, 2, 3)))
    memory = fold(memory, Compared(("current", "proposal-1"), 1, "train"))
    assert next_action(state(memory, left=20)) == Adopt("proposal-1", check=True)
    assert next_action(state(memory, left=7)) == Adopt("proposal-1", check=False)  # validation no longer fits
    assert Adopt("proposal-1", check=True).phase == TARGETED
    # a comparison the current instructions won leaves nothing to adopt
    lost = fold(
        after(GepaFinished(None), Proposed("route", ("proposal-1",), (1,))),
        Compared(("current", "proposal-1"), 0, "train"),
    )
    assert lost.winner is None and lost.pending is None


def test_an_unchecked_change_is_checked_on_validation_when_that_can_be_paid():
    memory = after(GepaFinished(None), PromptEdited())
    assert next_action(state(memory, left=20)) == CheckValidation()
    assert next_action(state(memory, left=20, val_size=0)) != CheckValidation()  # no validation split
    assert next_action(state(fold(memory, Validated()), left=20)) == Propose("route")
    # a comparison on validation that includes the current instructions checks them too
    assert not fold(memory, Compared(("current", "proposal-1"), 0, "val")).unchecked
    assert fold(memory, Compared(("proposal-1",), 0, "val")).unchecked


def test_a_proposal_is_compared_on_its_failures_and_other_examples_in_turn_cut_to_what_pays():
    memory = after(GepaFinished(None), Proposed("route", ("proposal-1", "proposal-2"), (1, 2, 3, 4, 5, 6, 7), (1, 2)))
    assert memory.pending.check_ids == (1, 3, 2, 4, 5, 6, 7)
    # 20 left, 8 kept for validation: 6 units per candidate, a third of it (at least 3 examples)
    assert next_action(state(memory, left=20)) == Compare(("proposal-1", "proposal-2"), (1, 3, 2))
    assert next_action(state(memory, left=200)) == Compare(("proposal-1", "proposal-2"), (1, 3, 2, 4, 5, 6, 7))
    assert Compare(("proposal-1",), (1, 3)).call == "compare(['current', 'proposal-1'], ids='1,3')"


def test_an_adopted_candidate_is_neither_compared_nor_adopted_again():
    memory = after(GepaFinished(None), Proposed("route", ("proposal-1",), (1, 2, 3), (1,)))
    memory = fold(memory, Adopted("proposal-1", changed=False))  # the same text as the current instructions
    assert memory.pending is None and not isinstance(next_action(state(memory)), Compare)
    memory = fold(memory, GepaFinished("gepa-2"))
    memory = fold(memory, Adopted("gepa-2", changed=False))
    assert memory.winner is None and next_action(state(memory)) == Propose("summarize")


def test_proposals_go_round_robin_over_the_steps_the_last_step_first():
    memory = after(GepaFinished(None))
    assert next_action(state(memory)) == Propose("route")
    memory = fold(memory, Proposed("route", ("proposal-1",), ()))
    memory = fold(memory, Compared(("current", "proposal-1"), 0, "train"))
    assert next_action(state(memory)) == Propose("summarize")
    assert Propose("route").call == "propose_instructions('route')"


def test_train_is_evaluated_further_when_the_current_instructions_fail_nothing_seen():
    memory = after(GepaFinished(None))
    assert next_action(state(memory, left=20, failing=0, unevaluated=(4, 5, 6, 7, 8))) == EvaluateTrain((4, 5, 6, 7, 8))
    # what the moves may spend (20 - 8 kept for validation) cuts the ids
    assert next_action(state(memory, left=11, failing=0, unevaluated=(4, 5, 6, 7, 8))) == EvaluateTrain((4, 5, 6))
    # a lead to confirm: failures found with the last units could pay no proposal with its comparison, the
    # confirmation takes them instead; with more left, the search for failures comes first
    lead = fold(fold(memory, Adopted("gepa-1", changed=True)), Validated())
    assert next_action(state(lead, left=11, failing=0, unevaluated=(4, 5, 6), confirmable=4)) == Confirm()
    assert next_action(state(lead, left=20, failing=0, unevaluated=(4, 5, 6), confirmable=4)) == EvaluateTrain(
        (4, 5, 6)
    )
    assert next_action(state(memory, failing=0, unevaluated=())) == Submit(
        "the current instructions pass every train example"
    )


def test_no_proposal_is_made_when_no_sub_lm_prompt_can_be_paid():
    memory = after(GepaFinished(None))
    assert next_action(state(memory, left=30, proposals_left=5)) == Propose("route")
    assert next_action(state(memory, left=30, proposals_left=0)) == Submit("no sub-LM prompt is left for a proposal")


def test_the_last_draw_is_offered_once_after_gepa_and_only_when_its_check_can_be_paid():
    memory = after(GepaFinished(None))
    draw = state(memory, left=22, val_size=20, proposal_units=0)
    assert next_action(draw) == LastDraw("route") and LastDraw("route").phase == GEPA
    assert next_action(replace(draw, budget=replace(draw.budget, left=19))).phase == END  # the check cannot be paid
    assert next_action(replace(draw, budget=replace(draw.budget, failing=0, unevaluated=()))).phase == END
    # a proposal paid from the same units needs one more for the check
    assert next_action(state(memory, left=20, val_size=20, proposal_units=1)).phase == END
    assert next_action(state(memory, left=21, val_size=20, proposal_units=1)) == LastDraw("route")
    # once: after a proposal made since GEPA ended, what is left ends the run
    drawn = fold(fold(memory, Proposed("route", ("proposal-1",), (1, 2), (1,))), Adopted("proposal-1", changed=True))
    assert next_action(replace(draw, memory=fold(drawn, Validated()))) == Submit(
        "what is left pays no proposal with its comparison"
    )
    assert next_action(state(LoopMemory.start(STEPS), left=22, val_size=20)) == RunGepa(22)  # before GEPA: GEPA


def test_a_submission_ends_the_run():
    assert next_action(state(left=0)) == Submit("the budget is spent")
    assert Submit("x").phase == END and Submit("x").call.startswith("SUBMIT(")


def test_an_outcome_the_policy_does_not_know_is_refused():
    with pytest.raises(TypeError, match="not an outcome"):
        fold(LoopMemory.start(STEPS), "proposal-1")


def test_a_proposal_made_before_gepas_best_was_adopted_leaves_it_to_adopt():
    """Regression (real-model benchmark, seed 0): the root LM ran GEPA, then propose_instructions in the same cell, and
    the proposal erased GEPA's better best from the loop's memory; the pilot then submitted the start's instructions
    (never-worse returned GEPA's candidate, so nothing was lost but the adoption)."""
    memory = after(GepaFinished("gepa-2"), Proposed("route", ("proposal-1",), (1, 2, 3), (1,)))
    assert next_action(state(memory, left=0)) == Adopt("gepa-2", check=True)
    memory = fold(fold(memory, Adopted("gepa-2", changed=True)), Validated())
    assert next_action(state(memory, left=40)) == Compare(("proposal-1",), (1, 2, 3))


def test_demos_are_proposed_once_after_gepa_when_train_has_successes_and_a_comparison_pays():
    gepa_done = after(GepaFinished(None))
    assert next_action(state(gepa_done, demos=True)) == ProposeDemos()
    assert ProposeDemos().call == "propose_demos()" and ProposeDemos().phase == TARGETED
    assert next_action(state(gepa_done, demos=False)) == Propose("route")  # max_demos=0, or no success to show
    assert next_action(state(after(), demos=True)) == RunGepa(40)  # GEPA first
    assert next_action(state(gepa_done, demos=True, left=8 + 5)) != ProposeDemos()  # no comparison could be paid
    tried = fold(gepa_done, Proposed(DEMOS, ("demos-1",), (3, 5, 0, 1), (3, 5)))
    assert next_action(state(tried, demos=True)) == Compare(("demos-1",), (3, 0, 5, 1))
    compared = fold(tried, Compared(("current", "demos-1"), 0, "train"))
    assert next_action(state(compared, demos=True)) == Propose("route")  # once: the proposals go on
    assert tried.proposals == 0  # demos are not an instruction proposal (the last draw still counts them)


def test_only_a_clear_gain_is_adopted_one_ahead_is_checked_on_validation_first():
    pending = after(GepaFinished(None), Proposed("route", ("proposal-1",), (3, 4, 5), (3,)))
    clear = fold(pending, Compared(("current", "proposal-1"), 1, "train"))
    assert next_action(state(clear)) == Adopt("proposal-1", check=True)
    ahead = fold(pending, Compared(("current", "proposal-1"), 0, "train", ahead=1))
    assert ahead.winner is None and ahead.trial == "proposal-1"
    assert next_action(state(ahead)) == CompareValidation("proposal-1")
    assert CompareValidation("proposal-1").call == "compare(['current', 'proposal-1'], split='val')"
    won = fold(ahead, Compared(("current", "proposal-1"), 1, "val"))
    assert next_action(state(won)) == Adopt("proposal-1", check=True) and won.trial is None
    lost = fold(ahead, Compared(("current", "proposal-1"), 0, "val"))
    assert lost.winner is None and lost.trial is None and next_action(state(lost)) == Propose("summarize")
    again = fold(lost, Compared(("current", "proposal-1"), 0, "train", ahead=1))
    assert again.trial is None  # checked further once
    assert not isinstance(next_action(state(ahead, left=7)), CompareValidation)  # a validation check cannot be paid


def test_without_validation_a_candidate_ahead_is_compared_on_the_whole_train_split_once():
    ahead = fold(
        after(GepaFinished(None), Proposed("route", ("proposal-1",), (3, 4), (3,))),
        Compared(("current", "proposal-1"), 0, "train", ahead=1),
    )
    assert next_action(state(ahead, val_size=0, reserve=6, train_size=6)) == Compare(("proposal-1",), tuple(range(6)))
    whole = fold(ahead, Compared(("current", "proposal-1"), 0, "train", ahead=1))
    assert whole.trial is None and "proposal-1" in whole.trials


GROUPS = (("analysis-1", "refunds go to billing", "route"), ("analysis-1", "short tickets", None))


def test_after_gepa_the_failures_are_analysed_then_the_largest_group_is_proposed_for():
    memory = after(GepaFinished(None))
    assert next_action(state(memory, analysis_prompts=2)) == Analyze()
    assert Analyze().call == "analyze_failures()"
    assert next_action(state(memory, analysis_prompts=0)) == Propose("route")  # no failure to analyse
    memory = fold(memory, Analyzed(GROUPS))
    action = next_action(state(memory, analysis_prompts=2, demos=True))  # the group first, then demos
    assert action == Propose("route", ("analysis-1", "refunds go to billing"))
    assert action.call == (
        "propose_instructions('route', group={'analysis': 'analysis-1', 'name': 'refunds go to billing'})"
    )
    memory = fold(memory, Proposed("route", ("proposal-1",), (4, 7, 1), (4, 7), group=action.group))
    assert memory.groups == GROUPS[1:]
    assert next_action(state(memory, analysis_prompts=2)) == Compare(("proposal-1",), (4, 1, 7))
    memory = fold(memory, Compared(("current", "proposal-1"), 0, "train"))
    assert next_action(state(memory, analysis_prompts=2, demos=True)) == ProposeDemos()
    # the next group names no step: the round robin picks one (route was proposed for, summarize was not)
    assert next_action(state(memory, analysis_prompts=2)) == Propose("summarize", ("analysis-1", "short tickets"))


def test_an_analysis_is_made_again_only_after_the_instructions_changed():
    memory = after(GepaFinished(None), Analyzed(GROUPS))
    assert fold(memory, Adopted("proposal-1", changed=False)).analyzed  # nothing changed: it still holds
    for outcome in (Adopted("proposal-1", changed=True), PromptEdited()):
        changed = fold(memory, outcome)
        assert not changed.analyzed and changed.groups == ()
        assert next_action(state(fold(changed, Validated()), analysis_prompts=2)) == Analyze()
    # an analysis that found (or could pay for) nothing: proposals learn from the failures themselves
    assert next_action(state(after(GepaFinished(None), Analyzed()), analysis_prompts=2)) == Propose("route")


def test_the_last_draw_is_written_for_the_largest_group_when_the_analysis_before_it_leaves_it_paid():
    memory = after(GepaFinished(None))
    # 22 left, 20 for the check: the analysis' 3 prompts come from the sub-LM's own allowance (proposal_units=0)
    assert next_action(state(memory, left=22, val_size=20, proposal_units=0, analysis_prompts=3)) == Analyze()
    analysed = fold(memory, Analyzed((("analysis-1", "disputes", "route"),)))
    assert next_action(state(analysed, left=22, val_size=20, proposal_units=0)) == LastDraw(
        "route", ("analysis-1", "disputes")
    )
    # paid from the budget, the prompts would leave the draw's check unpaid: the plain draw instead
    assert next_action(state(memory, left=22, val_size=20, proposal_units=1, analysis_prompts=3)) == LastDraw("route")
    # an analysis that found no group: the plain draw, once
    assert next_action(state(fold(memory, Analyzed()), left=22, val_size=20, proposal_units=0)) == LastDraw("route")


def test_an_analysis_is_skipped_when_it_would_leave_no_proposal_or_comparison():
    memory = after(GepaFinished(None))
    assert next_action(state(memory, analysis_prompts=7, proposals_left=7)) == Propose("route")  # none left after it
    assert next_action(state(memory, analysis_prompts=7, proposals_left=8)) == Analyze()
    # sub-LM prompts paid from the budget: the analysis must leave what one round needs besides the check
    # (14 - 8 reserve - 4 < 3; and 6 to spend compare too few examples: the proposal is checked on validation)
    assert next_action(state(memory, left=14, analysis_prompts=4)) == LastDraw("route")
    assert next_action(state(memory, left=14, analysis_prompts=4, proposal_units=0)) == Analyze()


def test_a_proposal_that_repeats_tried_instructions_is_not_compared_and_repeats_end_the_run():
    memory = after(GepaFinished(None), Proposed("route", (), (1, 2, 3), (1,)))  # it repeated: no candidate
    assert memory.pending is None and memory.repeats == 1
    assert next_action(state(memory)) == Propose("summarize")  # the other step's turn
    memory = fold(fold(memory, Proposed("summarize", (), (1, 2))), Proposed("route", (), (1, 2)))
    assert next_action(state(memory)) == Submit(
        "the last 3 proposals gave nothing new to compare (instructions already tried, or no usable answer from the "
        "sub LM)"
    )
    assert fold(memory, Proposed("route", ("proposal-4",), (1, 2))).repeats == 0  # something new: counting restarts


def test_a_candidate_that_won_on_validation_is_adopted_even_with_nothing_left():
    pending = after(GepaFinished(None), Proposed("route", ("proposal-1",), (3, 4, 5), (3,)))
    ahead = fold(pending, Compared(("current", "proposal-1"), 0, "train", ahead=1))
    won = fold(ahead, Compared(("current", "proposal-1"), 1, "val"))
    assert won.winner == "proposal-1" and won.winner_on_val
    assert next_action(state(won, left=0)) == Adopt("proposal-1", check=True)  # its validation records are stored
    # a winner on train only still needs its check paid
    on_train = fold(pending, Compared(("current", "proposal-1"), 1, "train"))
    assert not on_train.winner_on_val and next_action(state(on_train, left=0)) == Submit("the budget is spent")


def test_the_analysis_waits_for_the_train_examples_not_seen_when_a_round_still_pays_after_them():
    memory = after(GepaFinished(None))
    unseen = (4, 5, 6, 7)
    assert next_action(state(memory, left=40, analysis_prompts=2, unevaluated=unseen)) == EvaluateTrain(unseen)
    # 40 - 8 reserve = 32 free: 4 unseen, 2 prompts and a round (3 + 3) fit; with 16 left they do not
    assert next_action(state(memory, left=16, analysis_prompts=2, unevaluated=unseen)) == Analyze()
    assert next_action(state(fold(memory, Analyzed(GROUPS)), left=40, unevaluated=unseen)) == Propose(
        "route", ("analysis-1", "refunds go to billing")
    )


def test_a_lead_on_validation_that_is_not_clear_is_confirmed_on_fresh_train_examples_before_the_run_ends():
    memory = fold(after(GepaFinished("gepa-1"), Adopted("gepa-1", changed=True)), Validated())
    ending = state(memory, left=20, val_size=20, confirmable=8)  # nothing pays a proposal besides the reserve
    assert next_action(ending) == Confirm() and Confirm().phase == END and Confirm().call == "confirm_gain()"
    assert next_action(replace(ending, budget=replace(ending.budget, confirmable=2))) == Submit(
        "what is left pays no proposal with its comparison"
    )  # fewer than 3 fresh examples: not worth the units
    unchecked = fold(memory, PromptEdited())  # a change not checked on validation has no lead to confirm
    assert next_action(replace(ending, memory=unchecked, budget=replace(ending.budget, left=10))) != Confirm()
    assert next_action(state(memory, left=20, val_size=20, proposals_left=0, confirmable=5)) == Confirm()
    # with budget for targeted rounds, they come first: the confirmation is what is left at the end
    assert next_action(state(memory, left=40, val_size=20, confirmable=20, analysis_prompts=2)) == Analyze()


def test_too_little_to_compare_on_after_gepa_checks_the_largest_groups_proposal_on_validation_at_once():
    memory = fold(after(GepaFinished(None)), Analyzed((("analysis-1", "disputes", "summarize"),)))
    # 16 left, 8 kept for validation: 8 would compare on too few train examples for a clear gain to show
    draw = next_action(state(memory, left=16))
    assert draw == LastDraw("summarize", ("analysis-1", "disputes")) and draw.phase == TARGETED
    assert "propose_instructions('summarize', group={'analysis': 'analysis-1', 'name': 'disputes'})" in draw.call
    # with enough for a comparison worth making, the group's proposal is compared on train first
    assert next_action(state(memory, left=40)) == Propose("summarize", ("analysis-1", "disputes"))
    # once: after a proposal since GEPA, no second draw
    drawn = fold(memory, Proposed("summarize", (), (), (), ("analysis-1", "disputes")))
    assert not isinstance(next_action(state(drawn, left=16)), LastDraw)


@pytest.mark.parametrize("train_size", [1, 2])
def test_without_validation_a_train_split_too_small_to_show_a_change_ends_the_run_before_anything_is_spent(train_size):
    """Regression: with 1 or 2 train examples and no valset, no change can win 3 more examples than it loses (the
    start's warning says the unchanged program is returned), yet GEPA ran and paid a metric call and a sub-LM prompt."""
    action = next_action(state(val_size=0, reserve=train_size, train_size=train_size))
    assert isinstance(action, Submit) and "cannot show a change" in action.why
    assert isinstance(next_action(state(val_size=0, reserve=3, train_size=3)), RunGepa)  # 3 can show one
    assert isinstance(next_action(state(val_size=2, reserve=2, train_size=1)), RunGepa)  # validation decides
