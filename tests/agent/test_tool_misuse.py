"""Tools misused by a small root LM, through the real sandbox: a cell that rebinds a tool's name does not cut the
agent off from the tool (issue: a 1.5B root defined its own ``update_prompt`` and never reached the tool again),
and a value a tool cannot take gets an error naming the argument, not a transport error."""

from __future__ import annotations

import pytest
from support.fakes import FunctionLM, scripted_agent
from support.optimizing import SUBMIT_LINE
from support.tickets import POLICY_PROMPT, RouteTicket, make_splits, metric, task_lm_reply

from rlmoptimizer import RLMDocstringOptimizer

pytestmark = pytest.mark.slow


def compile_with(turns, **settings):
    trainset, valset = make_splits()
    optimizer = RLMDocstringOptimizer(
        max_iterations=2,
        root_lm=scripted_agent(turns),
        eval_lm=FunctionLM(task_lm_reply),
        num_threads=2,
        rlm_autopilot="off",  # scripted turns decide every turn
        **settings,
    )
    return optimizer.compile(student=RouteTicket(), trainset=trainset, metric=metric, valset=valset)


def test_a_cell_that_rebinds_a_tool_is_told_and_the_next_cell_reaches_the_tool_again():
    result = compile_with(
        [
            {
                "reasoning": "my own helper",
                "code": (
                    "def update_prompt(step, text):\n    return 'my own function'\n"
                    "print(update_prompt('route', 'x'))\ncompare = None"
                ),
            },
            {
                "reasoning": "use the tool",
                "code": ("print(update_prompt('route', 'Route by policy.'))\nprint(type(compare).__name__)"),
            },
            {"reasoning": "submit", "code": SUBMIT_LINE},
        ]
    )
    first, second = (turn["output"] for turn in result.agent_trajectory[:2])
    assert "my own function" in first  # within the cell, the agent's own definition is what it calls
    assert "[Notice] compare, update_prompt are your tools: this cell rebound the name" in first
    assert "'step': 'route'" in second and "'version': 1" in second
    assert "function" in second.splitlines()[-1]
    # the tool's edit took effect: the submission (the current prompts) was checked with it
    assert any(log["instructions"]["route"] == "Route by policy." for log in result.trial_logs)


def test_a_cell_that_imports_a_tool_from_a_module_is_told_that_tools_need_no_import():
    """A root LM wrote `from dspy_tools import evaluate_program, compare` (a module that does not exist) turn after
    turn: the bare ModuleNotFoundError never said that the tools are already there."""
    result = compile_with(
        [
            {"reasoning": "tools", "code": "from dspy_tools import evaluate_program, compare\nevaluate_program()"},
            {"reasoning": "a library", "code": "from collections import OrderedDict\nimport not_a_module"},
            {"reasoning": "submit", "code": SUBMIT_LINE},
        ]
    )
    first, second = (turn["output"] for turn in result.agent_trajectory[:2])
    assert "No module named 'dspy_tools'" in first
    assert "[Note] compare, evaluate_program: every tool is already defined in the REPL" in first
    assert "No module named 'not_a_module'" in second and "[Note]" not in second  # no tool asked for: no note


def test_a_value_a_tool_cannot_take_gets_an_error_naming_the_argument():
    result = compile_with(
        [
            {
                "reasoning": "pass my function",
                "code": (
                    "def classify_ticket(t):\n    return 'billing'\n"
                    "for call in (lambda: update_prompt('route', classify_ticket), lambda: compare(['current', object()]),"
                    " lambda: evaluate_program(limit='ten')):\n"
                    "    try:\n        call()\n    except Exception as e:\n        print('REFUSED', type(e).__name__, e)"
                ),
            },
            {"reasoning": "submit", "code": SUBMIT_LINE},
        ]
    )
    refused = [line for line in result.agent_trajectory[0]["output"].splitlines() if line.startswith("REFUSED")]
    assert len(refused) == 3, result.agent_trajectory[0]["output"]
    assert refused[0].startswith("REFUSED AgentToolError update_prompt(): argument 'text' is a function")
    assert "-> pass text" in refused[0]
    assert refused[1].startswith("REFUSED AgentToolError compare(): argument 'candidates' is a list")
    assert refused[2].startswith(
        "REFUSED AgentToolError evaluate_program(): argument 'limit' takes int | None, got str 'ten'"
    )
    assert "not JSON serializable" not in result.agent_trajectory[0]["output"]
    assert result.budget["spent"] == 0


def test_a_stray_fence_still_runs_and_a_syntax_error_says_where_and_why():
    result = compile_with(
        [
            "[[ ## reasoning ## ]]\nlook\n\n[[ ## code ## ]]\nprint('ran', 1 + 1)\n```\n\n[[ ## completed ## ]]",
            {"reasoning": "broken", "code": "```python\nx = (1,\nprint(x)\n```"},
            {"reasoning": "another language", "code": "```javascript\nconsole.log(1)\n```"},
            {"reasoning": "prose first", "code": "Here is the code:```python # a note\nprint('after', 'prose')\n```"},
            {"reasoning": "fenced string", "code": "print('a fence: ```')"},
            # the submission as JSON text with raw newlines in it (small models write it so)
            {
                "reasoning": "submit",
                "code": "SUBMIT(optimized_dspy_program='''{\"route\": \"Route it.\nCarefully.\"}''')",
            },
        ]
    )
    stray, broken, other, prose, fenced = (turn["output"] for turn in result.agent_trajectory[:5])
    assert "ran 2" in stray  # the closing fence with no opening one is dropped, the code runs
    assert "line 1" in broken and "never closed" in broken  # not the sandbox's blank "message: "
    assert "```javascript" in other and "```python" in other
    assert "after prose" in prose and "a fence: ```" in fenced
    final = result.agent_trajectory[-1]
    assert final["final"] and final["outputs"]["optimized_dspy_program"] == {"route": "Route it.\nCarefully."}


def test_a_value_the_tool_takes_after_coercion_reaches_it_coerced():
    result = compile_with(
        [
            {
                "reasoning": "numbers as text",
                "code": "r = evaluate_program(limit='2', seed=1.0)\nprint(r['evaluated_count'])",
            },
            {"reasoning": "submit", "code": SUBMIT_LINE},
        ]
    )
    assert result.agent_trajectory[0]["output"].strip() == "2"  # limit='2' is the int 2, as dspy's tools took it


def test_adopt_candidate_refuses_what_it_cannot_adopt_and_names_what_it_takes():
    bad = (
        "for c in ['proposal-9', 'current', 'run-0099', {'routing': 'x'}, 42]:\n"
        "    try:\n        adopt_candidate(c)\n    except Exception as e:\n        print('REFUSED', e)\n"
    )
    result = compile_with([{"reasoning": "try", "code": bad}, {"reasoning": "done", "code": SUBMIT_LINE}])
    refused = [line for line in result.agent_trajectory[0]["output"].splitlines() if line.startswith("REFUSED")]
    assert len(refused) == 5
    assert (
        "no candidate with id 'proposal-9' -> use an id propose_instructions, propose_demos or run_gepa returned: none yet"
        in refused[0]
    )
    assert "'current' is already the current instructions" in refused[1]
    assert "no run with id 'run-0099' -> use one of ['run-0001', 'run-0002']" in refused[2]
    assert "routing" in refused[3] and "route" in refused[3]
    assert "the candidate is int 42" in refused[4]
    assert result.route.signature.instructions == RouteTicket().route.signature.instructions


def test_a_cell_that_rebinds_submit_does_not_keep_the_run_from_ending():
    """Regression: ``SUBMIT = lambda **k: print('FAKE SUBMIT')`` stayed, so every later SUBMIT printed and nothing
    ended the run until rlm_max_iterations (paid turns of the root LM). SUBMIT is restored after the cell."""
    result = compile_with(
        [
            {"reasoning": "my own submit", "code": "SUBMIT = lambda **k: print('FAKE SUBMIT')"},
            {"reasoning": "submit", "code": SUBMIT_LINE},
            {"reasoning": "never reached", "code": "print('a third turn')"},
        ]
    )
    assert "[Notice] SUBMIT is reserved" in result.agent_trajectory[0]["output"]
    assert len(result.agent_trajectory) == 2
    assert result.agent_trajectory[-1]["final"]


@pytest.mark.parametrize(
    "after",
    ["print('went on')", "raise ValueError('after the submission')"],
    ids=["the cell goes on", "the cell raises after it"],
)
def test_a_submit_whose_exception_the_cell_catches_still_ends_the_run(after):
    """Regression: ``try: SUBMIT(...) except BaseException: ...`` swallowed dspy's control-flow exception, and the
    run went on with no notice (paid root turns) although the agent had submitted."""
    code = (
        "try:\n"
        f"    SUBMIT(optimized_dspy_program={{'route': {POLICY_PROMPT!r}}})\n"
        "except BaseException as caught:\n"
        "    print('caught', type(caught).__name__)\n"
        f"{after}"
    )
    result = compile_with(
        [
            {"reasoning": "submit, carefully", "code": code},
            {"reasoning": "never reached", "code": "print('a second turn')"},
        ]
    )
    assert len(result.agent_trajectory) == 1 and result.agent_trajectory[0]["final"]
    assert result.route.signature.instructions == POLICY_PROMPT


def test_update_prompt_takes_a_steps_demos_as_the_list_its_docstring_names():
    """Regression: the bridge refused ``update_prompt('route:demos', [{...}])`` as "text takes str", though the
    tool's docstring (and SUBMIT) take demos as a list of dicts of the step's fields."""
    demo = {"summary": "My bank opened a chargeback.", "queue": "disputes"}
    result = compile_with(
        [
            {"reasoning": "a demo", "code": f"print(update_prompt('route:demos', [{demo!r}])['version'])"},
            {"reasoning": "submit", "code": "SUBMIT(optimized_dspy_program=optimization_status()['current_prompts'])"},
        ]
    )
    assert result.agent_trajectory[0]["output"].strip() == "1"
    versions = [v for v in result.agent_trajectory if "Error" in v["output"]]
    assert versions == []


def test_the_agents_own_edit_of_current_prompts_stays_until_a_tool_changes_the_instructions():
    """current_prompts is set anew only after a tool changed the instructions: an agent that edits the dict itself
    and submits it in a later turn submits its edit."""
    result = compile_with(
        [
            {"reasoning": "edit the dict", "code": f"current_prompts['route'] = {POLICY_PROMPT!r}"},
            {"reasoning": "look", "code": "print(optimization_status()['budget']['left'])"},
            {"reasoning": "submit", "code": "SUBMIT(optimized_dspy_program=current_prompts)"},
        ]
    )
    assert result.route.signature.instructions == POLICY_PROMPT


def test_with_max_demos_0_the_agent_cannot_give_a_step_demos_either():
    """Regression: max_demos=0 ("0 switches demos off, so only instructions change") refused propose_demos, but the
    agent's own update_prompt('route:demos', ...) and a SUBMIT with demos were taken, and the program came back with
    demos."""
    demo = {"summary": "My bank opened a chargeback.", "queue": "disputes"}
    attempt = "try:\n    {}\nexcept AgentToolError as e:\n    print('refused:', e)"
    result = compile_with(
        [
            {"reasoning": "a demo", "code": attempt.format(f"update_prompt('route:demos', [{demo!r}])")},
            {"reasoning": "submit", "code": f"SUBMIT(optimized_dspy_program={{'route:demos': [{demo!r}]}})"},
            {"reasoning": "keep", "code": "SUBMIT(optimized_dspy_program={'route:demos': '[]'})"},
        ],
        max_demos=0,
    )
    outputs = [turn["output"] for turn in result.agent_trajectory]
    assert "refused: 'route:demos': demos are switched off for this compile (max_demos=0)" in outputs[0]
    assert "demos are switched off" in outputs[1] and not result.agent_trajectory[1]["final"]
    assert len(outputs) == 3 and result.agent_trajectory[2]["final"]  # the demos it has (none) may be submitted
    assert result.route.demos == []


def test_a_submit_with_another_keyword_says_which_it_takes():
    """Regression: ``SUBMIT(program=...)`` gave Python's bare "got an unexpected keyword argument 'program'" every
    turn, naming no field; every other refused submission says what to write."""
    result = compile_with(
        [
            {"reasoning": "submit", "code": f"SUBMIT(program={{'route': {POLICY_PROMPT!r}}})"},
            {"reasoning": "as told", "code": SUBMIT_LINE},
        ]
    )
    first = result.agent_trajectory[0]["output"]
    assert "unexpected keyword argument 'program'" in first and "-> call SUBMIT(optimized_dspy_program=...)" in first
    assert len(result.agent_trajectory) == 2 and result.agent_trajectory[-1]["final"]


def test_current_prompts_is_the_current_instructions_in_the_turns_after_a_tool_changed_them():
    """Regression: ``current_prompts`` was read once, at setup: an agent that edited a prompt with update_prompt and
    then submitted ``current_prompts`` in a later turn submitted the unchanged instructions, and its edit was lost
    without a word."""
    submit = "print(current_prompts['route'][:20])\nSUBMIT(optimized_dspy_program=current_prompts)"
    turns = [
        {"reasoning": "edit", "code": f"update_prompt('route', {POLICY_PROMPT!r})"},
        {"reasoning": "submit", "code": submit},
    ]
    result = compile_with(turns)
    assert POLICY_PROMPT[:20] in result.agent_trajectory[-1]["output"]
    assert result.route.signature.instructions == POLICY_PROMPT


def test_the_train_baseline_read_on_demand_is_whole_whatever_the_first_use_of_it():
    """Regression: with max_metric_calls the train baseline is read on first use, but only reads triggered it:
    ``json.dumps(baseline_train)`` gave '{}', ``baseline_train | {}`` gave {}, and a write first (a key of the
    agent's own) stored that key and kept the data from ever loading (every later read raised KeyError)."""
    from support.optimizing import compile_tickets

    code = (
        "import json\n"
        "baseline_train['mine'] = 'x'\n"
        "print('score', baseline_train['score'], 'mine', baseline_train['mine'])\n"
        "print('dumped', len(json.loads(json.dumps(baseline_train))['examples']))"
    )
    fresh = "import json\nprint('dumped', sorted(json.loads(json.dumps(baseline_train)))[:3])"
    result = compile_tickets(
        [{"reasoning": "use it", "code": code}, {"reasoning": "again", "code": SUBMIT_LINE}], max_metric_calls=60
    )
    output = result.agent_trajectory[0]["output"]
    assert "score 0.83" in output and "mine x" in output and "dumped 12" in output
    other = compile_tickets(
        [{"reasoning": "dump", "code": fresh}, {"reasoning": "submit", "code": SUBMIT_LINE}], max_metric_calls=60
    )
    assert "dumped ['budget_left', 'budget_spent', 'evaluated_count']" in other.agent_trajectory[0]["output"]
