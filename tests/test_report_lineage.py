"""The ancestry of a candidate read from what ``candidates.json`` and the prompt history keep, on the shapes a
compile leaves that the end-to-end tests (tests/test_report.py) do not reach: a GEPA merge of two lineages, a
parent that is the agent's own edit, a parent ``'current'`` the history cannot tell apart, a run id as the start,
and a damaged file whose parents form a cycle."""

from __future__ import annotations

from rlmoptimizer.fingerprint import instructions_digest
from rlmoptimizer.report.lineage import UNCHANGED, Lineage, lineage_shape
from rlmoptimizer.report.summary import ancestry_lines

INITIAL = {"a": "A0", "b": "B0"}


def labels(ancestry: list[dict]) -> list[tuple[str, list[str], int]]:
    return [(n["label"], n["parents"], n["generation"]) for n in ancestry]


def test_a_merge_has_both_parents_and_each_ancestor_is_listed_once():
    named = {"gepa-1": {"a": "A1", "b": "B0"}, "gepa-2": {"a": "A0", "b": "B1"}, "gepa-3": {"a": "A1", "b": "B1"}}
    lineage = {
        "gepa-1": {
            "parents": ["current"],
            "move": "gepa reflective proposal",
            "run": "gepa run 1",
            "steps": ["a", "b"],
            "reflected_on": [1, 2],
        },
        "gepa-2": {
            "parents": ["current"],
            "move": "gepa reflective proposal",
            "run": "gepa run 1",
            "steps": ["a", "b"],
            "reflected_on": [4],
        },
        "gepa-3": {"parents": ["gepa-1", "gepa-2"], "move": "gepa merge", "run": "gepa run 1", "steps": ["a", "b"]},
    }
    evaluated = [INITIAL, named["gepa-1"], named["gepa-2"], named["gepa-3"]]
    ancestry = Lineage(named, lineage, evaluated, INITIAL, {}, []).ancestry(3)
    assert labels(ancestry) == [
        (UNCHANGED, [], 0),
        ("gepa-1", [UNCHANGED], 1),
        ("gepa-2", [UNCHANGED], 1),
        ("gepa-3", ["gepa-1", "gepa-2"], 2),
    ]
    assert [n["candidate"] for n in ancestry] == [0, 1, 2, 3]
    assert [n["changed_steps"] for n in ancestry] == [[], ["a"], ["b"], ["b"]]  # against the first parent
    assert ancestry[1]["reflected_on"] == [1, 2] and ancestry[3]["reflected_on"] is None


def test_a_proposal_stands_for_its_parents_instructions_with_the_step_it_wrote():
    named = {"gepa-1": {"a": "A1", "b": "B0"}, "proposal-1": {"b": "B2"}}
    lineage = {
        "gepa-1": {"parents": ["current"], "move": "gepa reflective proposal", "steps": ["a", "b"]},
        "proposal-1": {
            "parents": ["gepa-1"],
            "move": "reflective proposal (propose_instructions)",
            "steps": ["b"],
            "reflected_on": [0],
        },
    }
    evaluated = [INITIAL, {"a": "A0", "b": "B2"}, named["gepa-1"], {"a": "A1", "b": "B2"}]
    found = Lineage(
        named, lineage, evaluated, INITIAL, {}, [{"version": 1, "step": "a", "text": "A1", "source": "adopt_candidate"}]
    )
    # not candidate 1, which has the same text for b over the unchanged a
    assert found.candidate_of("proposal-1") == 3 and found.ids_of(3) == ("proposal-1",) and found.ids_of(1) == ()
    assert labels(found.ancestry(3)) == [(UNCHANGED, [], 0), ("gepa-1", [UNCHANGED], 1), ("proposal-1", ["gepa-1"], 2)]


def test_a_parent_that_is_the_agents_own_edit_is_told_apart_from_the_unchanged_program():
    # the agent edited step a (update_prompt), then run_gepa rewrote step b from there
    versions = [{"version": 1, "step": "a", "text": "A-edit", "source": "update_prompt"}]
    named = {"gepa-1": {"a": "A-edit", "b": "B1"}}
    lineage = {"gepa-1": {"parents": ["current"], "move": "gepa reflective proposal", "steps": ["a", "b"]}}
    evaluated = [INITIAL, {"a": "A-edit", "b": "B0"}, named["gepa-1"]]
    ancestry = Lineage(named, lineage, evaluated, INITIAL, {}, versions).ancestry(2)
    assert labels(ancestry) == [("edited before gepa-1", [], 0), ("gepa-1", ["edited before gepa-1"], 1)]
    assert ancestry[0]["candidate"] == 1 and ancestry[1]["changed_steps"] == ["b"]


def test_a_current_parent_the_history_cannot_tell_is_left_unresolved_not_guessed():
    # a proposal for step b made either before or after the agent's edit of step a; both versions were evaluated
    versions = [{"version": 1, "step": "a", "text": "A-edit", "source": "update_prompt"}]
    named = {"proposal-1": {"b": "B1"}}
    lineage = {"proposal-1": {"parents": ["current"], "move": "reflective proposal (propose_instructions)"}}
    evaluated = [INITIAL, {"a": "A0", "b": "B1"}, {"a": "A-edit", "b": "B1"}]
    found = Lineage(named, lineage, evaluated, INITIAL, {}, versions)
    ancestry = found.ancestry(found.candidate_of("proposal-1"))
    assert labels(ancestry) == [
        ("current when proposal-1 was made", [], 0),
        ("proposal-1", ["current when proposal-1 was made"], 1),
    ]
    assert ancestry[0]["candidate"] is None
    # with one of them evaluated, that one is the proposal, and its parent the state it was made from
    found = Lineage(named, lineage, evaluated[:1] + evaluated[2:], INITIAL, {}, versions)
    assert found.candidate_of("proposal-1") == 1
    assert labels(found.ancestry(1))[0] == ("edited before proposal-1", [], 0)


def test_a_current_parent_recorded_by_its_digest_is_resolved_exactly():
    # the same ambiguity as above, but the move recorded which instructions 'current' was: the agent's edit
    versions = [{"version": 1, "step": "a", "text": "A-edit", "source": "update_prompt"}]
    named = {"proposal-1": {"b": "B1"}}
    lineage = {
        "proposal-1": {
            "parents": ["current"],
            "move": "reflective proposal (propose_instructions)",
            "parent_digests": [instructions_digest({"a": "A-edit", "b": "B0"})],
        }
    }
    evaluated = [INITIAL, {"a": "A0", "b": "B1"}, {"a": "A-edit", "b": "B1"}]
    found = Lineage(named, lineage, evaluated, INITIAL, {}, versions)
    assert found.candidate_of("proposal-1") == 2
    assert labels(found.ancestry(2)) == [
        ("edited before proposal-1", [], 0),
        ("proposal-1", ["edited before proposal-1"], 1),
    ]
    # recorded as the unchanged program: the ancestry starts there
    lineage["proposal-1"]["parent_digests"] = [instructions_digest(INITIAL)]
    found = Lineage(named, lineage, evaluated, INITIAL, {}, versions)
    assert found.candidate_of("proposal-1") == 1
    assert labels(found.ancestry(1)) == [(UNCHANGED, [], 0), ("proposal-1", [UNCHANGED], 1)]


def test_a_run_id_start_and_a_cycle_in_a_damaged_file_end_the_walk():
    named = {"gepa-1": {"a": "A1", "b": "B1"}, "gepa-2": {"a": "A2", "b": "B1"}, "gepa-3": {"a": "A3", "b": "B1"}}
    lineage = {
        "gepa-1": {"parents": ["run-0004"], "move": "gepa reflective proposal"},
        "gepa-2": {"parents": ["gepa-3"], "move": "gepa reflective proposal"},
        "gepa-3": {"parents": ["gepa-2"], "move": "gepa reflective proposal"},
    }
    evaluated = [INITIAL, {"a": "A0", "b": "B1"}, *named.values()]
    found = Lineage(named, lineage, evaluated, INITIAL, {"run-0004": {"a": "A0", "b": "B1"}}, [])
    ancestry = found.ancestry(2)
    assert labels(ancestry) == [("run-0004", [], 0), ("gepa-1", ["run-0004"], 1)]
    assert ancestry[0]["candidate"] == 1 and ancestry[0]["move"] == "the instructions of evaluation run run-0004"
    assert labels(found.ancestry(4)) == [("gepa-2", [], 0), ("gepa-3", ["gepa-2"], 1)]


def test_the_unchanged_program_and_an_unnamed_instruction_set_have_no_lineage_to_follow():
    versions = [{"version": 1, "step": "a", "text": "A-edit", "source": "update_prompt"}]
    found = Lineage({}, {}, [INITIAL, {"a": "A-edit", "b": "B0"}], INITIAL, {}, versions)
    assert labels(found.ancestry(0)) == [(UNCHANGED, [], 0)]
    [written] = found.ancestry(1)
    assert written["label"] == "candidate 1" and written["move"].startswith("written with update_prompt")
    assert found.ancestry(None) == []


def test_a_proposal_made_for_a_failure_group_names_it_in_its_ancestry_and_a_malformed_entry_is_dropped():
    made_for = {"analysis": "analysis-1", "group": "damaged to returns", "example_ids": [0, 2, 4]}
    named = {"proposal-1": {"a": "A1"}}
    lineage = {
        "proposal-1": {
            "parents": ["current"],
            "move": "reflective proposal (propose_instructions)",
            "steps": ["a"],
            "reflected_on": [0, 2],
            "made_for": made_for,
            "parent_digests": [instructions_digest(INITIAL)],
        }
    }
    ancestry = Lineage(named, lineage, [INITIAL, {"a": "A1", "b": "B0"}], INITIAL, {}, []).ancestry(1)
    assert ancestry[0]["made_for"] is None and ancestry[1]["made_for"] == made_for
    [(_, line)] = ancestry_lines(ancestry[1:], "val")
    assert "; made for group 'damaged to returns' of analysis-1 (train 0, 2, 4)" in line
    problems: list[str] = []
    damaged = {"proposal-1": {**lineage["proposal-1"], "made_for": {"analysis": 1, "group": "g", "example_ids": []}}}
    assert "made_for" not in lineage_shape(damaged, problems)["proposal-1"]
    assert problems == ["candidates.json: ignored lineage field(s) of the wrong kind: proposal-1.made_for"]
