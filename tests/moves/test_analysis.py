"""The failure analysis (``analyze_failures``) and proposals made for one of its groups, as a library: a real
dspy.Predict program on a scripted task LM, a scripted sub-LM that names causes and merges them, exact charges,
reuse for nothing (also after a resume), refusal when the budget cannot pay, no validation example in any prompt."""

from __future__ import annotations

import json
import re

import dspy
import pytest
from support.evaluating import program_evaluator
from support.fakes import FunctionLM, last_user_text, system_text
from support.optimizing import proposer

from rlmoptimizer.budget import SUB_LM_CALL, TRAIN_EXAMPLE, BudgetLedger
from rlmoptimizer.errors import AgentToolError
from rlmoptimizer.evaluation.evaluator import Evaluator
from rlmoptimizer.evaluation.runs import Runs
from rlmoptimizer.fingerprint import get_instructions
from rlmoptimizer.metric import Metric
from rlmoptimizer.moves import MAX_PROMPTS, FailureAnalysis, Moves
from rlmoptimizer.moves.analysis import FAILURES_PER_PROMPT, prompts_for
from rlmoptimizer.moves.gepa import GepaSpec
from rlmoptimizer.storage.run_store import RunStore

# -- a one-step router whose task LM misses two rules -----------------------------------------------------------
#
# Damaged items go to returns and bank disputes go to disputes, but the task LM routes anything about money to
# billing unless the instructions state the rule; a ticket saying CRASH makes it answer something that does not parse
# (a program error).

TRAIN = [
    ("Refund please, the blender arrived damaged.", "returns"),  # 0 fails: damaged
    ("I was charged twice this month.", "billing"),  # 1 passes
    ("The lamp came damaged, I want my money back.", "returns"),  # 2 fails: damaged
    ("My bank opened a dispute on your charge.", "disputes"),  # 3 fails: dispute
    ("Refund the damaged chair, the invoice is wrong too.", "returns"),  # 4 fails: damaged
    ("Please return my unopened order.", "returns"),  # 5 passes (no money word)
    ("My card issuer filed a dispute about the payment.", "disputes"),  # 6 fails: dispute
    ("The damaged rug needs a refund.", "returns"),  # 7 fails: damaged
    ("CRASH the invoice page.", "technical"),  # 8 fails: program error
    ("How do I export a report?", "how-to"),  # 9 passes
    ("The bank says the charge is in dispute.", "disputes"),  # 10 fails: dispute
    ("A damaged kettle, refund me.", "returns"),  # 11 fails: damaged
    ("I filed a formal dispute with my bank.", "disputes"),  # 12 passes (no money word)
]
DAMAGED, DISPUTES, CRASHED = [0, 2, 4, 7, 11], [3, 6, 10], [8]
MARKER = "VALMARKER"
VAL = [(f"{MARKER} the damaged vase, refund it.", "returns"), (f"{MARKER} bank dispute on the charge.", "disputes")]


def task_reply(messages):
    ticket = last_user_text(messages).split("[[ ## ticket ## ]]", 1)[1].split("Respond with", 1)[0].strip()
    if "CRASH" in ticket:
        return "no fields here"
    rules = system_text(messages).lower()  # instructions that state a rule are followed
    for word, queue in (("damaged", "returns"), ("dispute", "disputes")):
        if word in rules and word in ticket.lower():
            return {"queue": queue}
    money = any(w in ticket.lower() for w in ("refund", "charge", "money", "invoice", "payment"))
    if money:
        return {"queue": "billing"}
    for word, queue in (("damaged", "returns"), ("return", "returns"), ("dispute", "disputes")):
        if word in ticket.lower():
            return {"queue": queue}
    return {"queue": "how-to"}


def metric(example, prediction):
    return float(example.queue == (prediction.queue or "").strip())


class Route(dspy.Module):
    def __init__(self):
        super().__init__()
        self.route = dspy.Predict("ticket -> queue")

    def forward(self, ticket):
        return self.route(ticket=ticket)


def examples(rows):
    return [dspy.Example(ticket=t, queue=q).with_inputs("ticket") for t, q in rows]


# -- a scripted sub-LM: a cause per failure from its ticket, then groups by cause ------------------------------
CAUSE_DAMAGED = "A damaged item goes to returns even when a refund is asked."
CAUSE_DISPUTE = "A bank or card dispute goes to disputes, not billing."
CAUSE_CRASH = "The reply did not parse."


def cause_of(block: str) -> str:
    if "damaged" in block:
        return CAUSE_DAMAGED
    return CAUSE_DISPUTE if "dispute" in block else CAUSE_CRASH


def analyst(merge=None) -> FunctionLM:
    """Names each failure's cause from its ticket; merges by identical cause (or answers ``merge(lines)``)."""

    def reply(messages):
        user = last_user_text(messages)
        if "[[ ## failures ## ]]" not in user:  # the merge
            lines = re.findall(r"^(\d+): (.+)$", user.split("[[ ## causes ## ]]", 1)[1], re.M)
            if merge is not None:
                return merge(lines)
            by_cause: dict[str, list[int]] = {}
            for i, cause in lines:
                by_cause.setdefault(cause, []).append(int(i))
            names = {CAUSE_DAMAGED: "damaged to returns", CAUSE_DISPUTE: "disputes to disputes"}
            return {
                "groups": [
                    {"name": names.get(cause, "unparsed"), "cause": cause, "failure_ids": ids}
                    for cause, ids in by_cause.items()
                ]
            }
        blocks = re.split(r"(?=\[failure \d+\])", user.split("[[ ## failures ## ]]", 1)[1].split("[[ ## passing")[0])
        causes = []
        for block in blocks:
            head = re.match(r"\[failure (\d+)\]", block)
            if head:
                causes.append({"failure_id": int(head.group(1)), "cause": cause_of(block)})
        return {"causes": causes}

    return FunctionLM(reply, name="analyst")


class World:
    """One optimization's worth of state over the router: runs, ledger, the moves; the train baseline evaluated."""

    def __init__(self, directory, *, sub_lm=None, limit=100, sub_lm_limit=None, val=True):
        self.program = Route()
        self.ledger = BudgetLedger(limit, sub_lm_limit=sub_lm_limit)
        self.runs = Runs(
            evaluator=Evaluator(metric=Metric(metric), lm=FunctionLM(task_reply, name="task"), num_threads=4),
            store=RunStore(directory),
            ledger=self.ledger,
            splits={"train": examples(TRAIN), "val": examples(VAL if val else [])},
        )
        stored = self.runs.all()
        self.baseline = (
            stored[0] if stored else self.runs.evaluate(self.program, "train", label="baseline", charged=False)
        )
        self.sub_lm = sub_lm if sub_lm is not None else analyst()
        self.moves = Moves(
            runs=self.runs,
            evaluate=program_evaluator(self.program, self.runs),
            ledger=self.ledger,
            step_names=["route"],
            current=lambda: get_instructions(self.program),
            proposal_lm=self.sub_lm,
        )


def asked(lm: FunctionLM) -> str:
    return "\n".join(str(m.get("content")) for messages in lm.calls for m in messages)


# -- the groups --------------------------------------------------------------------------------------------------


def test_every_failure_is_grouped_by_the_cause_the_sub_lm_names_with_exact_counts_ids_and_charges(tmp_path):
    world = World(tmp_path)
    assert sorted(world.baseline.failed_ids) == sorted(DAMAGED + DISPUTES + CRASHED)
    analysis = world.moves.analyze_failures()
    assert isinstance(analysis, FailureAnalysis) and analysis.analysis_id == "analysis-1"
    assert analysis.grouped_by == "sub-LM" and analysis.failed_ids == tuple(sorted(DAMAGED + DISPUTES + CRASHED))
    assert [(g.name, g.count, g.example_ids) for g in analysis.groups] == [
        ("damaged to returns", 5, tuple(DAMAGED)),
        ("disputes to disputes", 3, tuple(DISPUTES)),
        ("unparsed", 1, tuple(CRASHED)),
    ]
    largest = analysis.largest()
    assert largest is analysis.groups[0] and largest.cause == CAUSE_DAMAGED and largest.step == "route"
    assert largest.kind == "wrong output" and largest.labels == (("queue: 'returns' -> 'billing'", 5),)
    assert largest.contrast_ids == (5,)  # a passing ticket of the same kind (expected returns)
    assert analysis.groups[1].contrast_ids == (12,)
    assert analysis.groups[2].kind == "program error (AdapterParseError)" and analysis.groups[2].labels == ()
    assert analysis.causes[3] == CAUSE_DISPUTE and set(analysis.causes) == set(analysis.failed_ids)
    # what code sees, without an LM: the step, the kind and the label pair
    assert [(g.name, g.example_ids) for g in analysis.code_groups] == [
        ("route: wrong output, queue: 'returns' -> 'billing'", tuple(DAMAGED)),
        ("route: wrong output, queue: 'disputes' -> 'billing'", tuple(DISPUTES)),
        (f"route: {analysis.groups[2].kind}", tuple(CRASHED)),
    ]
    # 9 failures: two cause prompts (8 + 1) and one merge, one unit each
    assert len(world.sub_lm.calls) == 3 == analysis.sub_lm_prompts == prompts_for(9) == analysis.budget_spent
    assert world.ledger.spent_by_kind[SUB_LM_CALL] == 3 and world.ledger.spent_by_kind[TRAIN_EXAMPLE] == 0
    assert max(asked_failures(call) for call in world.sub_lm.calls) == FAILURES_PER_PROMPT
    shown = analysis.to_dict()
    assert json.loads(json.dumps(shown)) == shown  # plain JSON
    assert shown["groups"][0]["example_ids"] == DAMAGED and shown["groups"][0]["analysis"] == "analysis-1"
    assert {"example_id": 3, "cause": CAUSE_DISPUTE, "group": "disputes to disputes"} in shown["causes"]
    assert shown["summary"].splitlines()[0].startswith("analysis-1 of the current instructions' train records: 9")
    assert "0. damaged to returns (5): " in shown["summary"]


def asked_failures(call) -> int:
    return len(re.findall(r"\[failure \d+\]", last_user_text(call)))


def test_a_step_and_a_run_narrow_the_analysis_and_validation_runs_are_refused(tmp_path):
    world = World(tmp_path)
    world.runs.evaluate(world.program, "val", label="agent")
    with pytest.raises(AgentToolError, match=r"is a val run -> pass a train run id"):
        world.moves.analyze_failures(run_id="run-0002")
    with pytest.raises(AgentToolError, match=r"unknown step name 'queue' -> use one of \['route'\]"):
        world.moves.analyze_failures(step="queue")
    with pytest.raises(AgentToolError, match=r"use_lm must be True or False"):
        world.moves.analyze_failures(use_lm="yes")
    analysis = world.moves.analyze_failures(run_id=world.baseline.run_id, step="route")
    assert analysis.source == f"run {world.baseline.run_id}" and analysis.run_id == world.baseline.run_id
    assert analysis.step == "route" and analysis.groups[0].count == 5
    assert world.ledger.spent_by_kind[SUB_LM_CALL] == 3


def test_the_code_groups_are_free_and_stand_when_the_merge_is_unusable(tmp_path):
    world = World(tmp_path / "a")
    free = world.moves.analyze_failures(use_lm=False)
    assert free.grouped_by == "code" and free.groups == free.code_groups and free.analysed_ids == ()
    assert [g.count for g in free.groups] == [5, 3, 1] and free.budget_spent == 0 and not world.sub_lm.calls
    assert world.ledger.spent_by_kind[SUB_LM_CALL] == 0

    garbled = World(tmp_path / "b", sub_lm=analyst(merge=lambda lines: "this is not json")).moves.analyze_failures()
    assert garbled.grouped_by == "code" and [g.count for g in garbled.groups] == [5, 3, 1]
    assert "the merge gave nothing usable" in garbled.note and "answer(s) gave nothing usable" in garbled.note
    assert garbled.budget_spent == 3  # the merge answered: paid
    # the code groups still carry the causes the sub-LM named
    assert CAUSE_DAMAGED in garbled.groups[0].cause

    def partial(lines):  # unknown and repeated ids, an empty group, and the crash left out
        return {
            "groups": [
                {"name": "money words", "cause": "money words win", "failure_ids": [*DAMAGED, 3, 99]},
                {"name": "disputes", "cause": CAUSE_DISPUTE, "failure_ids": [3, 6, 10]},
                {"name": "nothing", "cause": "-", "failure_ids": []},
            ]
        }

    world = World(tmp_path / "c", sub_lm=analyst(merge=partial))
    checked = world.moves.analyze_failures()
    assert checked.grouped_by == "sub-LM"
    assert [(g.name, g.example_ids) for g in checked.groups] == [
        ("money words", (0, 2, 3, 4, 7, 11)),
        ("disputes", (6, 10)),
        (f"route: {checked.code_groups[2].kind}", (8,)),
    ]
    ids = [i for g in checked.groups for i in g.example_ids]
    assert sorted(ids) == sorted(checked.failed_ids)  # every failure exactly once
    assert "unknown id 99" in checked.note and "id 3 placed twice" in checked.note
    assert "1 failure(s) no merged group holds are grouped by code" in checked.note


# -- reuse, resume, refusal ------------------------------------------------------------------------------------


def test_asking_again_is_free_also_after_a_resume_and_new_records_make_a_new_analysis(tmp_path):
    world = World(tmp_path)
    first = world.moves.analyze_failures()
    calls, spent = len(world.sub_lm.calls), world.ledger.snapshot()
    again = world.moves.analyze_failures()
    assert again.reused and again.budget_spent == 0 and again.groups == first.groups
    assert again.analysis_id == "analysis-1" and len(world.sub_lm.calls) == calls
    assert world.ledger.snapshot() == spent
    # a resumed compile (a new process: new moves over the same run directory) reuses it for nothing
    resumed = World(tmp_path, sub_lm=analyst())
    assert resumed.runs.all()[0].run_id == world.baseline.run_id
    back = resumed.moves.analyze_failures()
    assert back.reused and back.groups == first.groups and not resumed.sub_lm.calls
    assert resumed.moves.latest_analysis.analysis_id == "analysis-1"
    # killed after the prompts were answered, before the analysis was kept: the answers are replayed, not paid again
    (tmp_path / "analyses.json").unlink()
    replayed = World(tmp_path, sub_lm=analyst())
    redone = replayed.moves.analyze_failures()
    assert not redone.reused and redone.groups == first.groups and redone.budget_spent == 0
    assert not replayed.sub_lm.calls and replayed.ledger.spent_by_kind[SUB_LM_CALL] == 0
    # a damaged answer in the run directory is asked again (and paid), never taken for one
    answers = tmp_path / "analysis_answers.jsonl"
    lines = [json.loads(line) for line in answers.read_text().splitlines()]
    answers.write_text("".join(json.dumps({**e, "text": "{not json"}) + "\n" for e in lines))
    (tmp_path / "analyses.json").unlink()
    damaged = World(tmp_path, sub_lm=analyst())
    assert damaged.moves.analyze_failures().groups == first.groups
    assert len(damaged.sub_lm.calls) == 3 == damaged.ledger.spent_by_kind[SUB_LM_CALL]
    # other records (a fixed example) are another analysis, paid again
    world.program.route.signature = world.program.route.signature.with_instructions("Damaged items go to returns.")
    world.runs.evaluate(world.program, "train", label="agent")
    assert world.moves.analyze_failures().analysis_id == "analysis-2"


def test_an_analysis_the_budget_cannot_pay_in_full_is_refused_and_spends_nothing(tmp_path):
    world = World(tmp_path / "a", limit=2)  # it needs 3 prompts
    with pytest.raises(AgentToolError, match=r"needs 3 sub-LM prompt\(s\) \(2 of up to 8 failures, and one to merge"):
        world.moves.analyze_failures()
    assert world.ledger.spent == 0 and not world.sub_lm.calls
    assert world.moves.analyze_failures(use_lm=False).grouped_by == "code"  # what the refusal offers, for nothing
    # with max_metric_calls the sub-LM prompts have their own allowance: the metric calls are never touched
    world = World(tmp_path / "b", limit=50, sub_lm_limit=2)
    with pytest.raises(AgentToolError, match=r"but 2 are left -> pass use_lm=False"):
        world.moves.analyze_failures()
    assert world.ledger.spent_by_kind == {TRAIN_EXAMPLE: 0, "val_example": 0, SUB_LM_CALL: 0}
    world = World(tmp_path / "c", limit=50, sub_lm_limit=MAX_PROMPTS)
    assert world.moves.analyze_failures().budget_spent == 3 and world.ledger.spent == 0
    assert world.ledger.left_for(SUB_LM_CALL) == MAX_PROMPTS - 3


def test_a_prompt_the_sub_lm_did_not_answer_is_not_charged_and_is_asked_again(tmp_path):
    from dspy.utils.exceptions import LMTransportError

    down = FunctionLM(lambda m: LMTransportError("connection refused", model="analyst", provider="fake"))
    world = World(tmp_path, sub_lm=down)
    analysis = world.moves.analyze_failures()
    assert analysis.grouped_by == "code" and world.ledger.spent == 0
    assert analysis.note.startswith("2 prompt(s) got no answer (LMTransportError: [analyst] connection refused)")
    world.moves._proposal_lm = world.sub_lm = analyst()
    again = world.moves.analyze_failures()
    assert not again.reused and again.grouped_by == "sub-LM" and again.analysis_id == "analysis-2"


# -- validation stays out --------------------------------------------------------------------------------------


def test_no_validation_example_reaches_any_prompt_of_the_analysis_or_of_a_proposal_for_its_group(tmp_path):
    sub = analyst()
    world = World(tmp_path, sub_lm=sub)
    val = world.runs.evaluate(world.program, "val", label="agent")
    assert val.failed_ids == [0, 1]  # the validation failures are of the very kinds analysed
    world.moves.analyze_failures()
    world.moves.analyze_failures(step="route")
    world.moves.analyze_failures(run_id=world.baseline.run_id)
    world.moves._proposal_lm = writer = proposer("Damaged items go to returns.")
    world.moves.propose_instructions("route", group=0)
    world.moves.propose_instructions("route", group=1, run_id=world.baseline.run_id)
    assert len(sub.calls) == 3 and len(writer.calls) == 2  # the same prompts again: their answers are replayed
    for lm in (sub, writer):
        assert MARKER not in asked(lm)
        assert TRAIN[0][0] in asked(lm)  # train failures are shown


# -- proposals for a group ---------------------------------------------------------------------------------------


def test_a_proposal_for_a_group_is_written_from_its_causes_and_examples_and_records_them_in_its_lineage(tmp_path):
    world = World(tmp_path)
    analysis = world.moves.analyze_failures()
    world.moves._proposal_lm = writer = proposer("Damaged items go to returns; bank disputes go to disputes.")
    result = world.moves.propose_instructions("route", group="disputes to disputes")
    made_for = {"analysis": "analysis-1", "group": "disputes to disputes", "example_ids": DISPUTES}
    assert result["made_for"] == made_for and result["example_ids"] == DISPUTES
    assert result["check_ids"][:3] == DISPUTES and len(result["check_ids"]) == 3 + 5
    assert world.moves.lineage["proposal-1"]["made_for"] == made_for
    assert world.moves.lineage["proposal-1"]["reflected_on"] == DISPUTES
    prompt = asked(writer)
    assert 'Fix this group of failures: "disputes to disputes" (3 of the 9 failures' in prompt
    assert CAUSE_DISPUTE in prompt and "queue: 'disputes' -> 'billing' (x3)" in prompt
    assert TRAIN[3][0] in prompt and TRAIN[0][0] not in prompt  # the group's examples only
    assert world.ledger.spent_by_kind[SUB_LM_CALL] == 3 + 1
    # the largest group by index, by the value and by its dict: a few of its examples (5 at most), each a proposal
    for group in (0, analysis.largest(), analysis.to_dict()["groups"][0]):
        proposed = world.moves.propose_instructions("route", group=group, guidance="Keep it short.")
        assert proposed["made_for"]["example_ids"] == DAMAGED and set(proposed["example_ids"]) <= set(DAMAGED)
    assert "Keep it short." in asked(writer)
    # a code group can be asked for by name too
    code = world.moves.propose_instructions("route", group=analysis.code_groups[1].name)
    assert code["made_for"]["example_ids"] == DISPUTES


def test_a_group_that_names_nothing_known_is_refused_saying_what_to_pass(tmp_path):
    world = World(tmp_path)
    with pytest.raises(AgentToolError, match=r"no failure analysis yet -> call analyze_failures\(\) first"):
        world.moves.propose_instructions("route", group=0)
    world.moves.analyze_failures()
    with pytest.raises(AgentToolError, match=r"analysis-1 has no group 'refunds' -> pass an index from 0 to 2"):
        world.moves.propose_instructions("route", group="refunds")
    with pytest.raises(AgentToolError, match=r"has no group 7"):
        world.moves.propose_instructions("route", group=7)
    with pytest.raises(AgentToolError, match=r"no failure analysis 'analysis-9'"):
        world.moves.propose_instructions("route", group={"analysis": "analysis-9", "name": "x"})
    with pytest.raises(AgentToolError, match=r"pass group= or ids=, not both"):
        world.moves.propose_instructions("route", group=0, ids=[0])
    with pytest.raises(AgentToolError, match=r"group is list"):
        world.moves.propose_instructions("route", group=[0])
    assert world.ledger.spent_by_kind[SUB_LM_CALL] == 3  # the analysis only


def test_gepa_can_reflect_with_a_groups_causes_and_its_candidates_record_the_group(tmp_path):
    fix = "Damaged items go to returns."
    world = World(tmp_path)
    reflections = []

    def reply(messages):
        if "[[ ## failures ## ]]" in last_user_text(messages) or "[[ ## causes ## ]]" in last_user_text(messages):
            return world.sub_lm.fn(messages)
        reflections.append(messages)
        return json.dumps({"new_instruction": fix})

    world.moves._proposal_lm = FunctionLM(reply, name="sub")
    analysis = world.moves.analyze_failures()
    result = world.moves.run_gepa(GepaSpec(budget=40, group="damaged to returns"))
    assert reflections and all('Fix this group of failures: "damaged to returns"' in str(m) for m in reflections)
    made_for = {"analysis": analysis.analysis_id, "group": "damaged to returns", "example_ids": DAMAGED}
    assert result["best"] == "gepa-1" and world.moves.proposals["gepa-1"]["route"] == fix
    assert world.moves.lineage["gepa-1"]["made_for"] == made_for
    with pytest.raises(AgentToolError, match=r"run_gepa: analysis-1 has no group 'x'"):
        world.moves.run_gepa(GepaSpec(budget=10, group="x"))


def test_one_failure_is_one_prompt_and_no_merge_and_a_run_without_failures_costs_nothing(tmp_path):
    world = World(tmp_path)
    rules = "Damaged items go to returns; a dispute goes to disputes."
    world.program.route.signature = world.program.route.signature.with_instructions(rules)
    world.runs.evaluate(world.program, "train", label="agent")
    analysis = world.moves.analyze_failures()
    assert analysis.failed_ids == (8,) and analysis.budget_spent == 1 == prompts_for(1) == len(world.sub_lm.calls)
    assert [(g.name, g.cause, g.example_ids) for g in analysis.groups] == [(CAUSE_CRASH, CAUSE_CRASH, (8,))]
    clean = world.runs.evaluate(world.program, "train", label="agent", ids=[0, 1, 2, 3])
    empty = world.moves.analyze_failures(run_id=clean.run_id)
    assert empty.groups == () and empty.largest() is None and empty.budget_spent == 0
    assert empty.note == f"nothing failed in run {clean.run_id}" and len(world.sub_lm.calls) == 1


# -- what a confirmation may use ---------------------------------------------------------------------------------


def test_a_confirmation_uses_only_examples_no_search_saw_and_no_copy_of_a_validation_example(tmp_path):
    world = World(tmp_path)
    initial = get_instructions(world.program)
    assert world.moves.fresh_ids(initial) == []  # the unchanged program: nothing to confirm
    world.moves.analyze_failures()
    world.moves._proposal_lm = proposer("Damaged items go to returns; bank disputes go to disputes.")
    proposal = world.moves.propose_instructions("route", group="disputes to disputes")
    world.moves.compare(["current", "proposal-1"], ids=[1, 9])
    world.program.route.signature = world.program.route.signature.with_instructions(proposal["texts"][0])
    world.runs.splits["val"].append(world.runs.splits["train"][5])  # a train example also in validation
    fresh = world.moves.fresh_ids(initial)
    # not what it was written from (its group, DISPUTES), not what it was compared on (1, 9), not the copy (5); the
    # unchanged program ran on all of train at the start: 1 unit each (the proposal's run is the only one to pay)
    assert sorted(i for i, _ in fresh) == sorted(set(range(len(TRAIN))) - set(DISPUTES) - {1, 9, 5})
    assert {units for _, units in fresh} == {1}
    # the same text written by hand has no lineage: its author could read the unchanged program's records
    world.moves.lineage.clear()
    assert world.moves.fresh_ids(initial) == []


def test_a_merge_that_groups_nothing_gives_way_to_the_code_groups_with_the_named_causes(tmp_path):
    def apart(lines):  # every failure a group of its own, though five share the damaged-goods rule
        return {"groups": [{"name": f"case {i}", "cause": cause, "failure_ids": [int(i)]} for i, cause in lines]}

    world = World(tmp_path, sub_lm=analyst(merge=apart))
    analysis = world.moves.analyze_failures()
    assert analysis.grouped_by == "code" and analysis.groups == analysis.code_groups
    assert "left every failure in a group of its own" in analysis.note
    largest = analysis.largest()
    assert largest.count == len(DAMAGED) and set(largest.example_ids) == set(DAMAGED)
    assert CAUSE_DAMAGED in largest.cause  # the causes the sub-LM named still reach a proposal for the group


def test_a_cause_that_copies_its_examples_inputs_is_no_cause_and_those_failures_are_grouped_by_code(tmp_path):
    # A sub-LM that answers a failure with its own ticket names no rule: a group named after one ticket would send the
    # proposal after that ticket's words. Those failures stand in their code group, and the analysis says why.
    def copying(messages):
        user = last_user_text(messages)
        if "[[ ## failures ## ]]" not in user:
            return analyst().fn(messages)
        blocks = re.split(r"(?=\[failure \d+\])", user.split("[[ ## failures ## ]]", 1)[1].split("[[ ## passing")[0])
        causes = []
        for block in blocks:
            head = re.match(r"\[failure (\d+)\]", block)
            if head:
                ticket = TRAIN[int(head.group(1))][0]
                cause = f"The ticket: {ticket}" if "dispute" in block else cause_of(block)
                causes.append({"failure_id": int(head.group(1)), "cause": cause})
        return {"causes": causes}

    world = World(tmp_path, sub_lm=FunctionLM(copying, name="copying"))
    analysis = world.moves.analyze_failures()
    assert set(analysis.causes) == set(DAMAGED + CRASHED)  # the copies are not causes
    assert [(g.name, g.example_ids) for g in analysis.groups] == [
        ("damaged to returns", tuple(DAMAGED)),
        ("route: wrong output, queue: 'disputes' -> 'billing'", tuple(DISPUTES)),
        ("unparsed", tuple(CRASHED)),
    ]
    assert f"failure(s) {DISPUTES} copied the example's inputs" in analysis.note
    assert not any("My card issuer" in g.name + g.cause for g in analysis.groups)


@pytest.mark.parametrize(
    ("cause", "copied"),
    [
        ("My card issuer filed a dispute about the payment.", True),
        ("Customer says: my card issuer filed a dispute about the payment", True),
        ("Tickets where a card issuer filed a dispute go to disputes, not billing, whatever the amount.", False),
        ("A dispute goes to disputes.", False),  # too short to be a copy of anything
    ],
)
def test_a_cause_is_a_copy_when_a_verbatim_run_of_the_inputs_makes_up_most_of_it(cause, copied):
    from rlmoptimizer.moves.failures import copies_inputs

    assert copies_inputs(cause, {"ticket": "My card issuer filed a dispute about the payment."}) is copied


def test_a_copy_of_a_multi_line_input_is_a_copy_and_a_quoted_rule_of_a_shared_policy_is_a_cause():
    """The inputs' text is read as written (a JSON dump turned each line break into part of the next word, so a
    copy of a multi-line ticket passed as a cause), and an input every failure carries alike (a policy) is no
    example's own: a cause that quotes one of its rules verbatim names the rule."""
    from rlmoptimizer.moves.failures import copies_inputs, shared_inputs
    from rlmoptimizer.records import ExampleResult

    policy = "Rules:\nRefund requests go to billing even when the item arrived damaged.\nDisputes go to disputes."
    tickets = ["Hello,\nmy card issuer filed\na dispute about the payment\nyesterday.", "Where is my parcel?"]
    records = [
        ExampleResult(
            example_id=i, inputs={"policy": policy, "ticket": t}, expected={}, predicted={}, score=0.0, passed=False
        )
        for i, t in enumerate(tickets)
    ]
    shared = shared_inputs(records)
    assert shared == {"policy"}
    copy = "my card issuer filed a dispute about the payment yesterday"
    assert copies_inputs(copy, records[0].inputs, shared)
    rule = "Refund requests go to billing even when the item arrived damaged."
    assert not copies_inputs(rule, records[0].inputs, shared)
    assert copies_inputs(rule, records[0].inputs)  # read as the example's own, it would be a copy
    assert shared_inputs(records[:1]) == frozenset()  # one failure: nothing is known to be shared


def test_a_merged_group_whose_cause_is_blank_is_named_by_its_name():
    """Regression: a merge group whose cause was whitespace became a group with cause "", and a proposal for it was
    told "Their shared cause: " and nothing more."""
    from rlmoptimizer.moves.failures import CauseGroup, checked_merge

    answer = [
        CauseGroup(name="refunds to billing", cause=" \n ", failure_ids=[1, 2]),
        CauseGroup(name="x", cause="y", failure_ids=[3]),
    ]
    groups, unplaced, dropped = checked_merge(answer, [1, 2, 3])
    assert groups == [("refunds to billing", "refunds to billing", [1, 2]), ("x", "y", [3])]
    assert unplaced == [] and dropped == []
