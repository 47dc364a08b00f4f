"""``run_gepa``: the gepa package's engine as the agent's move, through the real sandbox with fake LMs.

The task is the ticket router of the offline demo: its fake task LM follows the company policy only when the
routing step's instructions state it, and the fake reflection LM answers gepa's reflection prompt with
instructions that state it. So GEPA can find the fix, and what it spends can be counted exactly."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import dspy
import pytest
from support.fakes import FunctionLM, last_user_text, scripted_agent
from support.metrics import CountingMetric
from support.optimizing import SUBMIT_LINE, copier
from support.tickets import POLICY_PROMPT, TICKETS, RouteTicket, make_splits, metric, task_lm_reply

from rlmoptimizer import RLMDocstringOptimizer

pytestmark = pytest.mark.slow

ORIGINAL_ROUTE = RouteTicket().route.signature.instructions
TESTS = Path(__file__).resolve().parent.parent


def reflection_lm(text: str = POLICY_PROMPT, log: list | None = None) -> FunctionLM:
    """The sub-LM answering the reflection (dspy's InstructionProposer, as dspy.GEPA reflects) with ``text``."""

    def reply(messages):
        if log is not None:
            log.append(last_user_text(messages))
        return json.dumps({"new_instruction": text})

    return FunctionLM(reply, name="reflection")


def compile_with(turns_or_lm, *, sub_lm=None, metric_fn=metric, train_size=None, **kwargs):
    trainset, valset = make_splits()
    trainset = trainset[:train_size]
    root = turns_or_lm if isinstance(turns_or_lm, dspy.BaseLM) else scripted_agent(turns_or_lm)
    kwargs.setdefault("num_threads", 4)
    kwargs.setdefault("rlm_autopilot", "off")  # scripted turns decide every turn; the pilot's tests say "assist"
    if "max_metric_calls" not in kwargs:
        kwargs.setdefault("max_iterations", 5)
    optimizer = RLMDocstringOptimizer(
        root_lm=root, sub_lm=sub_lm or reflection_lm(), eval_lm=FunctionLM(task_lm_reply), **kwargs
    )
    return optimizer.compile(student=RouteTicket(), trainset=trainset, metric=metric_fn, valset=valset)


def printed(result, turn: int) -> dict:
    return json.loads(result.agent_trajectory[turn]["output"].strip().splitlines()[-1])


def test_a_root_lm_that_only_copies_the_suggested_line_gets_gepas_best():
    seen: list[str] = []
    result = compile_with(copier(seen), max_iterations=3, rlm_max_iterations=8)

    turns = result.agent_trajectory
    # 3 * 12 + 8 = 44 units: too few for a targeted round after GEPA as well, so GEPA gets them all. One next_phase()
    # takes GEPA's phase: the run, the adoption of its best with its check, and SUBMIT (nothing is left to pay for)
    assert seen == ["print(next_phase()['summary'])"] and len(turns) == 1 and turns[0]["final"]
    assert turns[0]["code"] == "print(next_phase()['summary'])"
    first = turns[0]["output"]
    assert (
        "run_gepa(budget=44) -> gepa run 1: best gepa-1 (validation score 1.000, its seed, the instructions it started from, scored 0.500)"
        in first
    )
    assert "adopt_candidate('gepa-1'); evaluate_program(split='val') -> adopted gepa-1 (changed: route)" in first
    assert all("Error" not in turn["output"] for turn in turns), turns
    # the checkpoint was free: GEPA had scored its best on the whole validation split
    assert result.optimized_dspy_program["route"] == POLICY_PROMPT
    assert result.route.signature.instructions == POLICY_PROMPT
    assert result.selection["chosen_score"] == 1.0 and result.selection["baseline_score"] == 0.5
    assert result.budget["spent"] <= 44


def test_run_gepa_returns_candidates_with_their_lineage_and_the_other_moves_take_their_ids():
    turns = [
        {
            "reasoning": "gepa",
            "code": (
                "import json\nr = run_gepa(budget=40)\n"
                "print(json.dumps({k: r[k] for k in ('best', 'best_is_new', 'candidate_ids', 'candidates', 'pareto_front',"
                " 'scored_on', 'best_score', 'spent', 'spent_by_kind', 'reflections')}))"
            ),
        },
        {
            "reasoning": "look",
            "code": (
                "c = candidates()\nrows = [row for row in c['candidates'] if 'gepa-1' in row['ids']]\n"
                "cmp = compare(['current', 'gepa-1'], ids='3,8')\n"
                "print(json.dumps({'lineage': rows[0]['lineage'], 'route_now': optimization_status()['current_prompts']['route'],"
                " 'cmp': [c['score'] for c in cmp['candidates']]}))"
            ),
        },
        {"reasoning": "adopt", "code": "print(json.dumps(adopt_candidate('gepa-1')))"},
        {"reasoning": "submit", "code": SUBMIT_LINE},
    ]
    result = compile_with(turns)

    gepa = printed(result, 0)
    assert gepa["best"] == "gepa-1" and gepa["best_is_new"] is True and gepa["candidate_ids"] == ["gepa-1"]
    assert gepa["candidates"] == [
        {"id": "current", "parents": [], "score": 0.5},
        {"id": "gepa-1", "parents": ["current"], "score": 1.0},
    ]
    assert gepa["scored_on"] == "validation" and gepa["best_score"] == 1.0
    # the seed's minibatches and validation run were the baselines' stored records: the spending is the
    # reflections (1 unit each), the children's minibatches and the new candidate's validation run
    assert gepa["spent_by_kind"]["sub_lm_call"] == gepa["reflections"] >= 2
    assert gepa["spent_by_kind"]["val_example"] == 8
    assert gepa["spent"] == sum(gepa["spent_by_kind"].values())

    look = printed(result, 1)
    assert look["route_now"] == ORIGINAL_ROUTE  # run_gepa and compare change nothing
    lineage = look["lineage"]["gepa-1"]
    assert lineage["parents"] == ["current"] and lineage["move"] == "gepa reflective proposal"
    assert lineage["run"] == "gepa run 1" and len(lineage["reflected_on"]) == 3
    assert all(0 <= i < 12 for i in lineage["reflected_on"])
    assert look["cmp"] == [0.0, 1.0]  # tickets 3 and 8 are disputes: the policy routes them right
    assert printed(result, 2)["changed_steps"] == ["route"]
    assert result.route.signature.instructions == POLICY_PROMPT


def test_run_gepa_samples_its_minibatches_by_the_compiles_attempt_unless_given_a_seed(tmp_path):
    def reflected_on(attempt: int, call: str) -> list:
        turns = [
            {
                "reasoning": "gepa",
                "code": (
                    f"import json\nr = {call}\nrows = candidates()['candidates']\n"
                    "print(json.dumps(sorted((i, e['reflected_on']) for row in rows for i, e in (row['lineage'] or {}).items()"
                    " if i.startswith('gepa-'))))"
                ),
            },
            {"reasoning": "submit", "code": SUBMIT_LINE},
        ]
        result = compile_with(turns, attempt=attempt, run_storage_dir=tmp_path / f"{attempt}-{len(call)}")
        return json.loads(result.agent_trajectory[0]["output"].strip().splitlines()[-1])

    first, second = reflected_on(0, "run_gepa(budget=40)"), reflected_on(1, "run_gepa(budget=40)")
    assert first and second and first != second  # another attempt, other minibatches (as GEPA's seed= does)
    assert reflected_on(0, "run_gepa(budget=40, seed=1)") == second


@pytest.mark.parametrize(("proposals", "budget"), [(1, 14), (3, 24)])
def test_run_gepa_never_spends_past_its_slice_and_every_metric_call_is_one_unit(proposals, budget):
    counting = CountingMetric()
    log: list[str] = []
    turns = [
        {
            "reasoning": "gepa",
            "code": (
                "import json\n"
                f"r = run_gepa(budget={budget}, proposals_per_iteration={proposals})\n"
                "print(json.dumps({k: r[k] for k in ('spent', 'spent_by_kind', 'stopped', 'reflections')}))"
            ),
        },
        {"reasoning": "submit", "code": "SUBMIT(optimized_dspy_program={})"},
    ]
    result = compile_with(
        turns,
        sub_lm=reflection_lm("Route tickets carefully.", log),
        metric_fn=counting,
        num_threads=16,
        max_iterations=5,
    )
    out = printed(result, 0)
    # A useless proposal never beats its parent, so gepa keeps proposing until the slice cannot pay the next step
    # (mid-iteration, when several proposals are paid at once) or what is left cannot pay a child to keep: with 3
    # proposals an iteration that could keep one costs 3 x (1 reflection + 3 examples) + 8 validation examples.
    assert out["spent"] <= budget
    assert "ran out" in out["stopped"] or "cannot pay a child that could be kept" in out["stopped"]
    evaluations = out["spent_by_kind"].get("train_example", 0) + out["spent_by_kind"].get("val_example", 0)
    baselines = 12 + 8
    # the submission ({}: the current prompts) was the baseline: its check is free; so every metric call after
    # the baselines is one of run_gepa's charged evaluations
    assert counting.calls - baselines == evaluations
    assert out["spent_by_kind"].get("sub_lm_call", 0) == out["reflections"] == len(log) >= 1
    assert result.budget["spent"] == out["spent"]
    assert result.route.signature.instructions == ORIGINAL_ROUTE


def test_a_kept_child_without_train_records_makes_its_parents_minibatch_count_again():
    """Once gepa keeps a child, the next parent may be that child, which has records of its own minibatch only:
    the stop counts the parent's minibatch again (3 + 1 + 3 + 8), where it counted the start's as free (1 + 3 + 8)."""
    turns = [
        {
            "reasoning": "gepa",
            "code": "import json\nr = run_gepa(budget=28)\nprint(json.dumps({k: r[k] for k in ('spent', 'stopped', 'best_is_new')}))",
        },
        {"reasoning": "submit", "code": "SUBMIT(optimized_dspy_program={})"},
    ]
    asked = []

    def fix_then_useless(
        messages,
    ):  # the route step's fix once (kept: it wins its minibatch and validation), then words
        asked.append(ORIGINAL_ROUTE in last_user_text(messages))
        fix = asked[-1] and asked.count(True) == 1
        half = "Route the ticket. Policy: any chargeback or bank dispute goes to disputes."  # security still fails
        return json.dumps({"new_instruction": half if fix else f"Route tickets carefully, case {len(asked)}."})

    result = compile_with(turns, sub_lm=FunctionLM(fix_then_useless, name="reflection"), max_iterations=5)
    out = printed(result, 0)
    assert out["best_is_new"], out
    # 13 left: enough for a child of the start (12), not for one that may have the kept child as its parent (15)
    assert "the 13 unit(s) left cannot pay a child" in out["stopped"], out
    assert "8 validation examples it is scored on: 15)" in out["stopped"], out


@pytest.mark.parametrize("budget", [12, 11])
def test_a_child_of_the_start_runs_with_exactly_what_keeping_it_costs_and_not_with_one_unit_less(budget):
    """The start's train baseline is complete: a child costs its reflection, its minibatch and the 8 validation
    examples (12). With 12 it is proposed, scored and kept; with 11 no iteration starts (none could keep a child)."""
    turns = [
        {
            "reasoning": "gepa",
            "code": f"import json\nr = run_gepa(budget={budget}, steps=['route'])\nprint(json.dumps({{k: r[k] for k in ('spent', 'stopped', 'best_is_new')}}))",
        },
        {"reasoning": "submit", "code": "SUBMIT(optimized_dspy_program={})"},
    ]
    out = printed(compile_with(turns, max_iterations=5), 0)
    if budget == 12:
        assert out["best_is_new"] and out["spent"] <= 12, out
    else:
        assert not out["best_is_new"] and out["spent"] == 0, out
        assert "the 11 unit(s) left cannot pay a child" in out["stopped"] and "scored on: 12)" in out["stopped"], out


def test_run_gepa_stops_before_an_iteration_whose_child_could_not_be_kept_and_leaves_those_units():
    turns = [
        {
            "reasoning": "gepa",
            "code": (
                "import json\n"
                "r = run_gepa(budget=30)\n"
                "print(json.dumps({k: r[k] for k in ('spent', 'stopped', 'budget_left')}))"
            ),
        },
        {"reasoning": "left", "code": "print(json.dumps({'left': optimization_status()['budget_left']}))"},
        {"reasoning": "submit", "code": "SUBMIT(optimized_dspy_program={})"},
    ]
    # a useless reflection, new words each time (one that repeats itself is stopped sooner): every child loses on its
    # minibatch, each iteration pays 3 examples and 1 reflection
    asked = []

    def useless(messages):
        asked.append(1)
        return json.dumps({"new_instruction": f"Route tickets carefully, case {len(asked)}."})

    result = compile_with(turns, sub_lm=FunctionLM(useless, name="reflection"), max_iterations=5)
    out = printed(result, 0)
    # its reflection (1 unit with max_iterations), its own minibatch and the 8 validation examples a kept child is
    # scored on; its parent's minibatch is free: the only parent is the start, whose train baseline is complete
    keep_cost = 1 + 3 + 8
    assert (
        f"cannot pay a child that could be kept (its parent's minibatch, its reflection, its own and the 8 validation examples it is scored on: {keep_cost})"
        in out["stopped"]
    ), out
    assert 30 - keep_cost < out["spent"] <= 30 and 30 - out["spent"] < keep_cost
    # what GEPA did not spend is the agent's: nothing of the slice is held back or lost
    assert printed(result, 1)["left"] == out["budget_left"] == result.budget["limit"] - out["spent"]


def test_a_child_that_cannot_beat_its_parent_on_the_minibatch_is_not_run_on_the_rest_of_it():
    turns = [
        {
            "reasoning": "gepa",
            "code": (
                "import json\n"
                "r = run_gepa(budget=30)\n"
                "print(json.dumps({k: r[k] for k in ('spent', 'spent_by_kind', 'children_cut_short', "
                "'examples_not_run')}))"
            ),
        },
        {"reasoning": "submit", "code": "SUBMIT(optimized_dspy_program={})"},
    ]
    counting = CountingMetric()
    # a useless reflection: the fake task LM answers as it did under the parent, so each child fails where its
    # parent failed and can never win a minibatch on which its parent passed something
    # 11 train examples: gepa pads the last minibatch of each epoch with an example drawn twice
    result = compile_with(turns, sub_lm=reflection_lm("Route tickets carefully."), metric_fn=counting, train_size=11)
    out = printed(result, 0)

    runs = [json.loads(p.read_text()) for p in sorted(Path(result.run_storage_dir, "runs").glob("run-*.json"))]
    gepa_runs = [run for run in runs if run["label"] == "gepa"]
    scored = {}  # (instructions, train example id) -> passed, over every train run
    for run in runs:
        for record in run["records"] if run["split"] == "train" else []:
            scored[(json.dumps(run["instructions"], sort_keys=True), record["example_id"])] = record["passed"]
    original = json.dumps(next(run for run in runs if run["label"] == "baseline")["instructions"], sort_keys=True)
    children = [run for run in gepa_runs if json.dumps(run["instructions"], sort_keys=True) != original]
    assert children, gepa_runs
    for child in children:
        ids = [record["example_id"] for record in child["records"]]
        # a child runs only where its parent failed (the fake task LM fails it there too), then stops: on the
        # parent's passes it could at best tie, and gepa keeps only a child that scores higher
        assert all(not scored[(original, i)] for i in ids), child
        assert not any(record["passed"] for record in child["records"]), child
    assert out["children_cut_short"] >= 1 and out["examples_not_run"] >= 1
    # an example drawn twice in a minibatch runs once
    assert all(len({r["example_id"] for r in run["records"]}) == len(run["records"]) for run in gepa_runs)
    # what was not run was not paid: every charged example is one metric call, nothing more
    charged = out["spent_by_kind"].get("train_example", 0) + out["spent_by_kind"].get("val_example", 0)
    assert counting.calls - (11 + 8) == charged
    assert result.route.signature.instructions == ORIGINAL_ROUTE


def test_no_validation_example_reaches_the_agent_or_the_reflection_lm_through_run_gepa():
    _, valset = make_splits()
    log: list[str] = []
    root = scripted_agent(
        [
            {"reasoning": "gepa", "code": "r = run_gepa(budget=40)\nprint(r)\nprint(candidates())"},
            {"reasoning": "submit", "code": SUBMIT_LINE},
        ]
    )
    result = compile_with(root, sub_lm=reflection_lm(POLICY_PROMPT, log))

    shown = "\n".join(turn["output"] for turn in result.agent_trajectory)
    requests = "\n".join(str(m.get("content", "")) for call in root.calls for m in call)
    reflections = "\n".join(log)
    assert log, "gepa reflected"
    for example in valset:
        for where, text in (
            ("REPL output", shown),
            ("root-LM requests", requests),
            ("reflection prompts", reflections),
        ):
            assert example.ticket not in text, f"validation ticket {example.ticket!r} reached the {where}"
    train_tickets = [ticket for ticket, _ in TICKETS[:12]]
    assert any(ticket in reflections for ticket in train_tickets)  # the reflection did see train failures


def test_a_reflection_lm_that_fails_stops_run_gepa_then_the_run_naming_it_and_charges_nothing_for_it(tmp_path):
    from dspy.utils.exceptions import LMAuthError

    from rlmoptimizer import OptimizationInterrupted

    failing = FunctionLM(lambda messages: LMAuthError("403 Forbidden: the key has no access"), name="revoked")
    turns = [
        {
            "reasoning": "gepa",
            "code": (
                "try:\n    run_gepa(budget=40)\nexcept Exception as e:\n    print('REFUSED', type(e).__name__, e)\n"
                "print(optimization_status()['budget_spent_by_kind'])"
            ),
        },
        {"reasoning": "submit", "code": SUBMIT_LINE},
    ]
    with pytest.raises(OptimizationInterrupted, match="the sub LM is unusable: LMAuthError: 403 Forbidden"):
        compile_with(turns, sub_lm=failing, run_storage_dir=tmp_path)
    taken = [json.loads(path.read_text()) for path in sorted((tmp_path / "turns").glob("turn-*.json"))]
    assert len(taken) == 1  # the agent saw the error in its cell, and the run stopped after that turn
    output = taken[0]["output"]
    assert "REFUSED AgentToolError" in output
    assert "the reflection LM (sub_lm) failed: LMAuthError: 403 Forbidden" in output
    assert "check sub_lm" in output
    assert "'sub_lm_call': 0" in output  # a call that got no answer is not charged


def test_run_gepa_refuses_bad_arguments_with_what_to_do():
    bad = (
        "for kwargs in [dict(budget=0), dict(budget='lots'), dict(budget=10**6), dict(budget=5, steps=['routing']),"
        " dict(budget=5, start='gepa-7'), dict(budget=5, use_merge='maybe'), dict(budget=5, proposals_per_iteration=99)]:\n"
        "    try:\n        run_gepa(**kwargs)\n    except Exception as e:\n        print('REFUSED', e)\n"
    )
    result = compile_with([{"reasoning": "try", "code": bad}, {"reasoning": "submit", "code": SUBMIT_LINE}])
    refused = [line for line in result.agent_trajectory[0]["output"].splitlines() if line.startswith("REFUSED")]
    assert len(refused) == 7, result.agent_trajectory[0]["output"]
    assert "budget must be an int >= 1, got int 0" in refused[0]
    assert "run_gepa(): argument 'budget' takes int | None, got str 'lots'" in refused[1]
    assert "only 68 unit(s) are left -> pass budget=68 or less" in refused[2]
    assert "unknown step name 'routing'" in refused[3] and "route" in refused[3]
    assert "no candidate with id 'gepa-7'" in refused[4]
    assert "argument 'use_merge' takes bool, got str 'maybe'" in refused[5]
    assert "proposals_per_iteration must be an int from 1 to 8" in refused[6]
    assert result.budget["spent"] == 0


KILLED_COMPILE = textwrap.dedent("""
    import json, os, signal, sys, threading
    sys.path[:0] = [{tests!r}]
    os.environ["DSPY_CACHEDIR"] = {cache!r}
    from support.fakes import FunctionLM, last_user_text, scripted_agent
    from support.tickets import POLICY_PROMPT, RouteTicket, make_splits, metric, task_lm_reply
    from rlmoptimizer import RLMDocstringOptimizer

    log = open(os.environ["GEPA_TEST_LOG"], "a")
    KILL_AT = int(os.environ["GEPA_TEST_KILL_AT"])
    lock = threading.Lock()
    calls = [0]

    def counting(example, prediction, trace=None):
        with lock:
            calls[0] += 1
            log.write(json.dumps(["metric", example.ticket, prediction.queue]) + "\\n"); log.flush()
            if calls[0] == KILL_AT:
                os.kill(os.getpid(), signal.SIGKILL)
        return metric(example, prediction, trace)

    def reflect(messages):
        log.write(json.dumps(["reflect", last_user_text(messages)]) + "\\n"); log.flush()
        return json.dumps({{"new_instruction": "Route carefully. " + str(len(last_user_text(messages)))}})

    turns = [{{"reasoning": "gepa", "code": "r = run_gepa(budget=40, use_merge=False); print(r['summary'])"}},
             {{"reasoning": "submit", "code": "SUBMIT(optimized_dspy_program={{}})"}}]
    trainset, valset = make_splits()
    optimizer = RLMDocstringOptimizer(max_iterations=5, root_lm=scripted_agent(turns), sub_lm=FunctionLM(reflect),
                                      eval_lm=FunctionLM(task_lm_reply), num_threads=1, run_storage_dir={runs!r})
    result = optimizer.compile(student=RouteTicket(), trainset=trainset, metric=counting, valset=valset)
    print(json.dumps({{"spent": result.budget["spent"], "spent_by_kind": result.budget["spent_by_kind"],
                      "out": result.agent_trajectory[0]["output"]}}))
""")


def test_a_compile_killed_during_run_gepa_and_resumed_pays_no_completed_call_twice(tmp_path):
    """A useless reflection keeps gepa proposing; the process is killed by SIGKILL in the middle of its run; the
    resumed compile replays the stored evaluations and reflections free and pays only what was not done."""
    runs, cache = tmp_path / "run", tmp_path / "cache"
    logs = [tmp_path / "first.jsonl", tmp_path / "second.jsonl"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("DSPY_")}

    def start(log: Path, kill_at: int) -> subprocess.CompletedProcess:
        script = KILLED_COMPILE.format(tests=str(TESTS), cache=str(cache), runs=str(runs))
        return subprocess.run(
            [sys.executable, "-c", script],
            capture_output=True,
            text=True,
            timeout=600,
            env={**env, "GEPA_TEST_LOG": str(log), "GEPA_TEST_KILL_AT": str(kill_at)},
        )

    first = start(logs[0], kill_at=20 + 9)  # the baselines' 20 calls, then 9 of run_gepa's
    assert first.returncode == -signal.SIGKILL, first.stderr[-2000:]
    second = start(logs[1], kill_at=-1)
    assert second.returncode == 0, second.stderr[-3000:]
    done = json.loads(second.stdout.strip().splitlines()[-1])
    assert "gepa run 1" in done["out"] and "cannot pay a child that could be kept" in done["out"]

    def entries(path: Path) -> list[list]:
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    first_entries, second_entries = entries(logs[0]), entries(logs[1])
    reflected = [sum(1 for e in entries_ if e[0] == "reflect") for entries_ in (first_entries, second_entries)]
    metric_calls = [sum(1 for e in entries_ if e[0] == "metric") for entries_ in (first_entries, second_entries)]
    assert reflected[0] >= 1 and metric_calls[0] == 29, "the first process reflected and was killed in its 29th call"
    # every reflection answered before the kill is replayed from the run directory, not asked again: each answer
    # was asked for once, across both processes
    stored = (runs / "gepa_reflections.jsonl").read_text().splitlines()
    assert reflected[0] + reflected[1] == len(stored) == done["spent_by_kind"]["sub_lm_call"]
    # every metric call completed before the kill (its record saved or in the pending log) is reused: the second
    # process calls the metric only for what the first never finished (the killed call included), and each
    # evaluation is charged once
    evaluations = done["spent_by_kind"]["train_example"] + done["spent_by_kind"]["val_example"]
    completed_before_kill = metric_calls[0] - 20 - 1
    assert metric_calls[1] == evaluations - completed_before_kill
    # the resumed turn calls run_gepa(budget=40) again: the replayed run takes only what is left of its 40, so the
    # two processes together spent at most 40 (the run stopped when what was left could not pay a child to keep)
    assert done["spent"] <= 40 and "before the compile was resumed" in done["out"]


def test_candidate_ids_and_their_lineage_survive_a_resume(tmp_path):
    """The agent's history names 'gepa-1'; after the compile is interrupted and resumed (a new process, a new
    REPL), that id still names the same candidate."""
    from rlmoptimizer.errors import OptimizationInterrupted

    gepa_turn = {"reasoning": "gepa", "code": "r = run_gepa(budget=30); print(r['summary'])"}
    adopt_turn = {
        "reasoning": "adopt",
        "code": (
            "print(adopt_candidate('gepa-1'))\n"
            "print([row['lineage'] for row in candidates()['candidates'] if 'gepa-1' in row['ids']])"
        ),
    }
    interrupted = [False]

    def first_root(messages):
        if "gepa run 1" in last_user_text(messages):  # the second turn: the user presses Ctrl-C
            interrupted[0] = True
            return KeyboardInterrupt()
        return gepa_turn

    with pytest.raises(OptimizationInterrupted):
        compile_with(FunctionLM(first_root), run_storage_dir=tmp_path / "run")
    assert interrupted[0]
    result = compile_with(
        [gepa_turn, adopt_turn, {"reasoning": "submit", "code": SUBMIT_LINE}], run_storage_dir=tmp_path / "run"
    )
    adopted = result.agent_trajectory[1]["output"]
    assert "'changed_steps': ['route']" in adopted, adopted
    assert "'move': 'gepa reflective proposal'" in adopted and "'parents': ['current']" in adopted
    assert result.route.signature.instructions == POLICY_PROMPT


def test_a_root_lm_that_repeats_one_cell_ends_with_gepas_best():
    """A turn without progress is followed by the default loop's next phase: the first is GEPA's, so a root LM stuck
    on one cell still gets GEPA's result."""
    stuck = {"reasoning": "look again", "code": "print(baseline_train['score'])"}
    result = compile_with([stuck], max_iterations=3, rlm_max_iterations=8, rlm_autopilot="assist")
    codes = [call for turn in result.agent_trajectory for call in turn.get("pilot", [])]
    assert "[pilot]" in result.agent_trajectory[0]["output"], codes
    assert codes[0] == "run_gepa(budget=44)" and codes[1].startswith("adopt_candidate('gepa-1')"), codes
    assert result.route.signature.instructions == POLICY_PROMPT
    assert result.selection["chosen_score"] == 1.0


def test_a_reflection_without_an_instruction_in_it_is_charged_and_proposes_no_child():
    asked: list[str] = []

    def chatty(messages):  # what a 1.5B reflection LM often answers
        asked.append(last_user_text(messages))
        return "Certainly! Please provide the inputs so that I can write the new instruction."

    turns = [
        {
            "reasoning": "gepa",
            "code": (
                "import json\nr = run_gepa(budget=16)\n"
                "print(json.dumps({k: r[k] for k in ('spent_by_kind', 'reflections', 'candidate_ids', 'stopped')}))"
            ),
        },
        {"reasoning": "submit", "code": "SUBMIT(optimized_dspy_program={})"},
    ]
    result = compile_with(turns, sub_lm=FunctionLM(chatty, name="chatty"))
    out = printed(result, 0)

    runs = [json.loads(p.read_text()) for p in Path(result.run_storage_dir, "runs").glob("run-*.json")]
    children = [run for run in runs if run["label"] == "gepa" and run["instructions"]["route"] != ORIGINAL_ROUTE]
    assert not children  # no child was ever scored: the parents' minibatches were the only runs
    assert out["candidate_ids"] == [] and out["reflections"] >= 1
    # every answer was a call, charged once, whatever the adapter retried on the way
    assert out["spent_by_kind"]["sub_lm_call"] == out["reflections"] and len(asked) >= out["reflections"]
    # the parents' minibatches were the train baseline's records: nothing but the reflections was paid
    assert out["spent_by_kind"] == {"sub_lm_call": out["reflections"]}
    assert result.route.signature.instructions == ORIGINAL_ROUTE
