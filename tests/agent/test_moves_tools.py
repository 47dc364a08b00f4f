"""The moves as the agent's tools, through the real sandbox: result shapes, exact charges, refusals the agent
can act on, no change to the current prompts from propose_instructions and compare, and an exact budget with
16 evaluation threads."""

from __future__ import annotations

import json
import re

import pytest
from support.fakes import FunctionLM
from support.optimizing import ORIGINAL_ROUTE, SUBMIT_CURRENT, compile_tickets, proposer
from support.tickets import POLICY_PROMPT, make_splits, task_lm_reply

pytestmark = pytest.mark.slow


def run(turns, *, sub_lm=None, **kwargs):
    """A compile with 3 iterations' budget (unless ``max_metric_calls`` is given) whose sub-LM proposes the policy,
    unless ``sub_lm`` is given."""
    if "max_metric_calls" not in kwargs:
        kwargs.setdefault("max_iterations", 3)
    return compile_tickets(turns, sub_lm=sub_lm or proposer(), **kwargs)


def printed(result, turn: int) -> dict:
    """The JSON a turn printed as its last line."""
    return json.loads(result.agent_trajectory[turn]["output"].strip().splitlines()[-1])


def test_propose_then_compare_charges_exactly_and_changes_no_prompt():
    sub_lm = proposer()
    result = run(
        [
            {
                "reasoning": "propose",
                "code": (
                    "import json\n"
                    "p = propose_instructions('route', n=2, guidance='Name every queue.')\n"
                    "print(json.dumps({k: p[k] for k in ('step', 'texts', 'candidates', 'example_ids', 'check_ids', 'budget_spent')}"
                    " | {'route_now': optimization_status()['current_prompts']['route'], 'left': p['budget_left']}))"
                ),
            },
            {
                "reasoning": "compare",
                "code": (
                    "r = compare(['current'] + p['candidates'], ids=p['check_ids'])\n"
                    "print(json.dumps({'best': r['best'], 'spent': r['budget_spent'], 'ids': r['example_ids'],"
                    " 'cands': [[c['source'], c['score'], c['passed_count'], c['wins'], c['losses'], c['ties']] for c in r['candidates']],"
                    " 'ex': r['examples'], 'route_now': optimization_status()['current_prompts']['route'],"
                    " 'status': optimization_status()['budget_spent_by_kind']}))"
                ),
            },
            {
                "reasoning": "again",
                "code": (
                    "r2 = compare([p['candidates'][0], 'current'], ids=p['check_ids'])\n"
                    "print(json.dumps({'spent': r2['budget_spent'], 'best': r2['best']}))"
                ),
            },
            SUBMIT_CURRENT,
        ],
        sub_lm=sub_lm,
    )

    proposal = printed(result, 0)
    assert proposal["step"] == "route" and proposal["texts"] == [POLICY_PROMPT]
    assert proposal["candidates"] == [{"route": POLICY_PROMPT}]
    assert proposal["example_ids"] == [3, 8]  # the baseline's failures
    assert proposal["check_ids"][:2] == [3, 8] and len(proposal["check_ids"]) == 7
    assert proposal["budget_spent"] == 2 and len(sub_lm.calls) == 2  # 1 unit per proposal call
    assert "Name every queue." in json.dumps(sub_lm.calls[0])
    assert proposal["route_now"] == ORIGINAL_ROUTE  # a proposal changes nothing

    compared = printed(result, 1)
    assert compared["ids"] == proposal["check_ids"]
    # 'current' is the baseline's instructions: stored, free; the proposal's 7 examples are new
    assert compared["spent"] == 7 and compared["status"] == {"train_example": 7, "val_example": 0, "sub_lm_call": 2}
    assert compared["cands"] == [["current", 5 / 7, 5, 0, 0, 7], ["map", 1, 7, 2, 0, 5]]
    assert compared["best"] == 1
    assert [e["scores"] for e in compared["ex"] if e["example_id"] == 3] == [[0, 1]]
    assert compared["route_now"] == ORIGINAL_ROUTE  # compare changes nothing
    assert printed(result, 2) == {"spent": 0, "best": 0}  # stored records are free
    # nothing was kept, so the unchanged program is returned; the total is exactly what the tools reported
    assert result.optimized_dspy_program["route"] == ORIGINAL_ROUTE
    assert result.budget["spent_by_kind"] == {"train_example": 7, "val_example": 0, "sub_lm_call": 2}


def test_rollouts_diff_hard_examples_and_candidates_through_the_sandbox():
    result = run(
        [
            {
                "reasoning": "rollouts",
                "code": (
                    "import json\n"
                    "e = evaluate_program(ids=[0, 3, 8], rollouts=2)\n"
                    "print(json.dumps({'spent': e['budget_spent'], 'rollouts': e['rollouts'], 'runs': len(e['run_ids']),"
                    " 'rates': [x['pass_rate'] for x in e['examples']], 'scores': [x['rollout_scores'] for x in e['examples']],"
                    " 'always': e['always_failing_ids'], 'flaky': e['flaky_ids']}))"
                ),
            },
            {
                "reasoning": "change and diff",
                "code": (
                    f"update_prompt('route', {POLICY_PROMPT!r})\n"
                    "after = evaluate_program(ids=[0, 3, 8])\n"
                    "d = diff_runs(baseline_train['run_id'], after['run_id'])\n"
                    "print(json.dumps({'fixed': [(f['example_id'], f['first_changed_step'], f['outputs_b']) for f in d['fixed']],"
                    " 'broken': d['broken'], 'passing': d['still_passing'], 'failing': d['still_failing'], 'changed': d['instructions_changed']}))"
                ),
            },
            {
                "reasoning": "replay and pool",
                "code": (
                    "h = hard_examples(); c = candidates()\n"
                    "print(json.dumps({'hard': h['examples'], 'under_best': h['failing_under_best'], 'best': c['best'],"
                    " 'front': c['pareto_front'], 'scores': [x['train_scores'] for x in c['candidates']],"
                    " 'current': [x['is_current'] for x in c['candidates']], 'spent': optimization_status()['budget_spent']}))"
                ),
            },
            SUBMIT_CURRENT,
        ]
    )
    rollouts = printed(result, 0)
    # rollout 0 of the current instructions is stored by the baseline (free); rollout 1 is 3 new samples
    assert rollouts["spent"] == 3 and rollouts["rollouts"] == 2 and rollouts["runs"] == 2
    assert rollouts["rates"] == [1, 0, 0] and rollouts["scores"] == [[1, 1], [0, 0], [0, 0]]
    assert rollouts["always"] == [3, 8] and rollouts["flaky"] == []

    diff = printed(result, 1)
    assert [(i, step) for i, step, _ in diff["fixed"]] == [(3, "route"), (8, "route")]
    assert diff["fixed"][0][2] == {"queue": "disputes"}
    assert diff["broken"] == [] and diff["passing"] == [0] and diff["failing"] == [] and diff["changed"] == ["route"]

    pool = printed(result, 2)
    assert pool["hard"] == [
        {"example_id": 3, "failed": 2, "evaluated": 3, "fail_rate": 2 / 3},
        {"example_id": 8, "failed": 2, "evaluated": 3, "fail_rate": 2 / 3},
    ]
    assert pool["best"] == 0 and pool["under_best"] == [3, 8]  # the baseline is the only one checked on validation
    assert pool["scores"][1] == {"0": 1, "3": 1, "8": 1} and pool["current"] == [False, True]
    # the policy prompt is best on 3 and 8; the baseline is the only one evaluated on the other examples
    assert pool["front"] == [0, 1]
    assert pool["spent"] == 3 + 3
    assert result.budget["spent_by_kind"]["train_example"] == 6


def test_refusals_are_messages_the_agent_can_act_on_and_cost_nothing():
    catch = "def show(f):\n    try:\n        f()\n    except AgentToolError as exc:\n        print('REFUSED', exc)\n"
    result = run(
        [
            {
                "reasoning": "refusals",
                "code": catch
                + (
                    "show(lambda: propose_instructions('routing'))\n"
                    "show(lambda: compare({'route': 'x'}))\n"
                    "show(lambda: compare(['current', 'best one']))\n"
                    "show(lambda: compare(['current', {'route': ''}]))\n"
                    "show(lambda: compare(['current', {'route': 'A'}, {'route': 'B'}, {'route': 'C'}, {'route': 'D'}], rollouts=3))\n"
                    "show(lambda: evaluate_program(split='val', rollouts=2))\n"
                    "show(lambda: diff_runs(baseline_train['run_id'], baseline_val['run_id']))\n"
                    "show(lambda: propose_instructions('route', ids=[99]))\n"
                    "show(lambda: compare(['current', {'route': 'A'}], limit=0))\n"
                    "print(optimization_status()['budget_spent'], optimization_status()['current_prompts']['route'] == "
                    f"{ORIGINAL_ROUTE!r})"
                ),
            },
            SUBMIT_CURRENT,
        ],
        max_iterations=1,
    )
    lines = result.agent_trajectory[0]["output"].strip().splitlines()
    refused = [line for line in lines if line.startswith("REFUSED")]
    assert len(refused) == 9
    expected = [
        r"unknown step name 'routing' -> use one of \['summarize.predict', 'route'\]",
        r"candidates must be a non-empty list.* -> pass a list like \['current', \{'step': 'new text'\}\]",
        r"candidate 1 is str 'best one' -> each candidate is 'current', a run id like 'run-0003', a candidate id like 'proposal-1' or 'gepa-2', or a \{step: text\} dict",
        r"instructions for step 'route' are empty -> pass non-empty instructions text",
        r"needs 168 budget unit\(s\) \(5 instruction set\(s\) x 12 example\(s\) x 3 rollout\(s\), 12 already stored"
        r" and free\) but 20 are left -> select fewer",
        r"validation takes one sample per example .* -> use rollouts on split='train'",
        r"run run-0002 is a val run -> pass a train run id",
        r"ids must be example ids of the split, got out-of-range \[99\]",
        r"compare: the selection is empty -> select at least one example",
    ]
    for line, pattern in zip(refused, expected, strict=True):
        assert re.search(pattern, line), (pattern, line)
    assert lines[-1] == "0 True"
    assert result.budget["spent"] == 0


def test_budget_is_exact_with_sixteen_threads_and_every_new_tool():
    sub_lm = proposer()
    result = run(
        [
            {
                "reasoning": "spend",
                "code": (
                    "import json\n"
                    "spent = []\n"
                    "p = propose_instructions('route', n=3); spent.append(p['budget_spent'])\n"
                    "r = compare(['current'] + p['candidates'] + [{'route': 'Pick the queue.'}], rollouts=2); spent.append(r['budget_spent'])\n"
                    "e = evaluate_program(sample='random', limit=8, seed=3, rollouts=3); spent.append(e['budget_spent'])\n"
                    "answers = llm_query_batched(['a', 'b']); spent.append(2)\n"
                    "v = compare(['current', p['candidates'][0]], split='val'); spent.append(v['budget_spent'])\n"
                    "try:\n"
                    "    compare(['current', {'route': 'Other.'}], rollouts=10)\n"
                    "except AgentToolError as exc:\n"
                    "    print('REFUSED', str(exc)[:40])\n"
                    "s = optimization_status()\n"
                    "print(json.dumps({'spent': spent, 'total': s['budget_spent'], 'kinds': s['budget_spent_by_kind'], 'limit': s['budget_limit']}))"
                ),
            },
            {"reasoning": "submit", "code": f"SUBMIT(optimized_dspy_program={{'route': {POLICY_PROMPT!r}}})"},
        ],
        sub_lm=sub_lm,
        num_threads=16,
        max_iterations=8,
    )
    out = printed(result, 0)
    assert "REFUSED" in result.agent_trajectory[0]["output"]
    # proposals: 3 calls; compare: 2 new instruction sets x 12 x 2 rollouts + current's rollout 1 (12);
    # rollouts: current, rollout 2 only is new (8); sub-LM queries: 2; validation compare: the proposal's 8
    assert out["spent"] == [3, 2 * 12 * 2 + 12, 8, 2, 8]
    assert out["total"] == sum(out["spent"]) == 3 + 60 + 8 + 2 + 8
    assert out["kinds"] == {"train_example": 68, "val_example": 8, "sub_lm_call": 5 + 0}
    # the submission was checked on validation by the compare already: nothing more was spent
    assert result.budget["spent"] == out["total"] <= out["limit"]


def test_a_lucky_extra_rollout_never_picks_the_returned_program():
    """Without a valset the program is chosen on train; only each candidate's first sample counts."""

    def reply(messages, settings):
        system = next((m["content"] for m in messages if m.get("role") == "system"), "")
        if "LUCKY" in system and "[[ ## summary ## ]]" in str(messages[-1]["content"]):
            if settings.get("rollout_id") == 1:  # the extra sample follows the policy, the first never does
                messages = [
                    {**m, "content": m["content"] + POLICY_PROMPT} if m.get("role") == "system" else m for m in messages
                ]
            else:
                return {"queue": "nowhere"}
        return task_lm_reply(messages)

    result = run(
        [
            {
                "reasoning": "try",
                "code": (
                    "update_prompt('route', 'LUCKY')\n"
                    "e = evaluate_program(rollouts=2)\n"
                    "print([x['score'] for x in e['examples']].count(0), e['score'], [run_data(i)['score'] for i in e['run_ids']])"
                ),
            },
            {"reasoning": "submit", "code": "SUBMIT(optimized_dspy_program={'route': 'LUCKY'})"},
        ],
        eval_lm=FunctionLM(reply, with_settings=True),
        valset=None,
    )
    assert result.agent_trajectory[0]["output"].strip() == "12 0.5 [0, 1]"
    assert result.selection["chosen_label"] == "baseline" and result.optimized_dspy_program["route"] == ORIGINAL_ROUTE
    assert result.selection["submission_score"] == 0.0


def test_confirm_gain_through_the_sandbox_refuses_without_a_lead_spends_within_units_and_only_once():
    _, val = make_splits()
    result = run(
        [
            {"reasoning": "nothing to confirm yet", "code": "confirm_gain()"},
            {
                "reasoning": "state the policy, check it, confirm it on fresh train examples",
                "code": (
                    "import json\n"
                    f"update_prompt('route', {POLICY_PROMPT!r})\n"
                    "v = evaluate_program(split='val')\n"
                    "c = confirm_gain(units=5)\n"
                    "print(json.dumps({k: c[k] for k in ('example_ids', 'wins', 'losses', 'clear_gain', 'budget_spent')}))"
                ),
            },
            {"reasoning": "again", "code": "confirm_gain()"},
            SUBMIT_CURRENT,
        ],
        max_metric_calls=40,
        valset=val[:6],  # the policy wins 2 of these 6 and loses none: a lead, not a clear gain
    )
    assert "there is no gain to confirm" in result.agent_trajectory[0]["output"]
    confirmed = printed(result, 1)
    # no train example was run yet (with max_metric_calls the train baseline is paid when first read): each fresh
    # example costs 2 units (the unchanged program and the policy), so 5 units pay 2 of them
    assert len(confirmed["example_ids"]) == 2 and confirmed["budget_spent"] == 4
    assert "confirmed already (once per set of instructions)" in result.agent_trajectory[2]["output"]
