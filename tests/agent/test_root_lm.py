"""root_stateful_session and rlm_multiturn_history: full compile() runs against a fake OpenAI Responses
server on 127.0.0.1 (tests/responses_server.py) or an offline chat LM, with the real sandbox.

Each scripted turn ``i`` carries the marker ``CODE-i`` in its code and prints ``OUT-i`` (the code spells it
``'OUT' + '-i'``), so a request shows exactly which turns' code and output it re-sends."""

from __future__ import annotations

import logging

import dspy
import pytest
from dspy.adapters.json_adapter import JSONAdapter
from dspy.lm15 import Config, Message, Request
from dspy.primitives.repl_types import REPLHistory
from support.fakes import FunctionLM, scripted_agent
from support.optimizing import SUBMIT_POLICY, compile_tickets, outputs
from support.responses_server import ResponsesServer
from support.tickets import POLICY_PROMPT

from rlmoptimizer import OptimizationInterrupted
from rlmoptimizer.agent.root_lm import TurnSender, is_chain_rejection


def look(i: int) -> dict[str, str]:
    return {"reasoning": f"look {i}", "code": f"# CODE-{i}\nprint('OUT' + '-{i}')"}


TURNS = [look(1), look(2), look(3), SUBMIT_POLICY]


def resent_turns(text: str, marker: str) -> list[int]:
    """The turn numbers whose ``CODE-``/``OUT-`` marker appears in ``text``."""
    return [i for i in range(1, 10) if f"{marker}-{i}" in text]


def session_warnings(caplog) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "rlmoptimizer.agent.root_lm" and r.levelno == logging.WARNING
    ]


def assert_completed(result, explored: int = 3) -> None:
    assert result.optimized_dspy_program["route"] == POLICY_PROMPT
    assert [o.strip() for o in outputs(result)[:explored]] == [f"OUT-{i}" for i in range(1, explored + 1)]
    assert result.agent_trajectory[-1]["final"] is True


# -- root_stateful_session ----------------------------------------------------------------------------------
@pytest.mark.slow
def test_each_turn_chains_from_the_previous_response_and_sends_only_the_new_step(caplog):
    with ResponsesServer(TURNS) as server:
        result = compile_tickets(server.lm(), root_stateful_session=True)
    assert_completed(result)
    requests = server.requests
    assert len(requests) == 4 and all(r.status == 200 for r in requests)
    assert requests[0].previous_response_id is None
    for before, after in zip(requests, requests[1:], strict=False):
        assert after.previous_response_id == before.response_id  # the chain is unbroken
    # the first request carries the system prompt as an input item, which the chain keeps
    assert requests[0].roles == ["developer", "user"] and "SUBMIT" in requests[0].items[0][1]
    for k, request in enumerate(requests[1:], start=1):
        assert request.roles == ["user"] and "instructions" not in request.body
        assert resent_turns(request.text, "CODE") == []  # the server holds the agent's own code
        assert resent_turns(request.text, "OUT") == [k]  # only the output of the turn before
        assert f"{k + 1}/200" in request.text
    assert max(r.sent_tokens for r in requests[1:]) < requests[0].sent_tokens / 10
    assert session_warnings(caplog) == []


@pytest.mark.slow
def test_a_refused_id_falls_back_to_a_full_request_and_the_chain_restarts(caplog):
    with ResponsesServer(TURNS, reject_ids={"resp_0002"}) as server:
        result = compile_tickets(server.lm(), root_stateful_session=True)
    assert_completed(result)
    requests = server.requests
    assert [r.status for r in requests] == [200, 200, 400, 200, 200]
    refused, full, chained = requests[2:]
    assert refused.previous_response_id == "resp_0002"
    # the refused turn is sent again in full, without the id: nothing of the run is lost
    assert full.previous_response_id is None
    assert resent_turns(full.text, "CODE") == [1, 2] and resent_turns(full.text, "OUT") == [1, 2]
    assert full.roles == ["developer", "user"]
    # and the chain goes on from that response
    assert chained.previous_response_id == full.response_id and resent_turns(chained.text, "OUT") == [3]
    warnings = session_warnings(caplog)
    assert len(warnings) == 1 and "resp_0002" in warnings[0] and "in full" in warnings[0]


@pytest.mark.parametrize("status", [400, 404])
def test_errors_that_name_the_previous_response_are_refusals_of_the_chain_and_others_are_not(status):
    with ResponsesServer([look(1)], reject_status=status, fail_requests={2: 401}) as server:
        lm = server.lm()
        with pytest.raises(dspy.LMError) as refused:
            lm(
                Request(
                    model=lm.model,
                    messages=(Message.user("hi"),),
                    config=Config(extensions={"previous_response_id": "resp_gone"}),
                )
            )
        with pytest.raises(dspy.LMError) as unauthorized:
            lm(Request(model=lm.model, messages=(Message.user("hi"),)))
    assert is_chain_rejection(refused.value) and refused.value.status == status
    assert not is_chain_rejection(unauthorized.value) and unauthorized.value.status == 401


@pytest.mark.slow
def test_a_server_without_chaining_is_used_statelessly_after_a_second_refusal(caplog):
    with ResponsesServer(TURNS, reject_previous=True) as server:
        result = compile_tickets(server.lm(), root_stateful_session=True)
    assert_completed(result)
    requests = server.requests
    assert [r.status for r in requests] == [200, 400, 200, 400, 200, 200]
    assert [r.previous_response_id is None for r in requests] == [True, False, True, False, True, True]
    # chaining is off: the last turn goes dspy's usual way, the whole history in one user message
    last = requests[-1]
    assert last.roles == ["user"] and "instructions" in last.body
    assert resent_turns(last.text, "CODE") == [1, 2, 3]
    warnings = session_warnings(caplog)
    assert len(warnings) == 2 and "chaining is off" in warnings[1]


@pytest.mark.slow
def test_a_server_that_ignores_the_id_is_caught_by_its_usage_and_the_turns_stay_in_order(caplog):
    with ResponsesServer(TURNS, ignore_previous=True) as server:
        result = compile_tickets(server.lm(), root_stateful_session=True)
    # the replies given without context were discarded: every scripted turn ran once, in order
    assert_completed(result)
    assert len(result.agent_trajectory) == 4
    assert [r.previous_response_id is None for r in server.requests] == [True, False, True, False, True, True]
    assert len(session_warnings(caplog)) == 2


@pytest.mark.slow
def test_a_reply_that_does_not_parse_is_retried_on_the_same_link_then_resent_as_an_error_turn():
    turns = [look(1), "no fields in this reply", look(3), SUBMIT_POLICY]
    with ResponsesServer(turns) as server:
        result = compile_tickets(server.lm(), root_stateful_session=True)
    assert "could not be parsed" in outputs(result)[1]
    assert result.optimized_dspy_program["route"] == POLICY_PROMPT
    first, *attempts, after, submit = server.requests
    assert len(attempts) == 3  # one try and two retries, all on the same link with the same input
    assert {a.previous_response_id for a in attempts} == {first.response_id}
    assert len({a.text for a in attempts}) == 1
    # the failed step was never chained from, so the next turn sends it along: its reply and its error
    assert after.previous_response_id == first.response_id
    assert after.roles == ["user", "assistant", "user"] and "no fields in this reply" in after.items[1][1]
    assert submit.previous_response_id == after.response_id


@pytest.mark.slow
def test_a_chat_root_lm_runs_statelessly_and_the_log_says_so_once(caplog):
    caplog.set_level(logging.INFO, logger="rlmoptimizer.agent.root_lm")
    root = scripted_agent(TURNS)
    result = compile_tickets(root, root_stateful_session=True)
    assert_completed(result)
    assert [[m["role"] for m in call] for call in root.calls] == [["system", "user"]] * 4
    assert session_warnings(caplog) == []  # the default setting with a chat model is not worth a warning
    notes = [r.getMessage() for r in caplog.records if r.name == "rlmoptimizer.agent.root_lm"]
    assert len(notes) == 1
    assert "root_stateful_session" in notes[0] and "model_type='responses'" in notes[0]


@pytest.mark.slow
def test_a_resumed_run_starts_a_fresh_chain(tmp_path):
    with ResponsesServer(TURNS, fail_requests={3: 401}) as server, pytest.raises(OptimizationInterrupted):
        compile_tickets(server.lm(), root_stateful_session=True, run_storage_dir=tmp_path)
    assert [r.status for r in server.requests] == [200, 200, 401]
    assert len(list((tmp_path / "turns").glob("*.json"))) == 2

    with ResponsesServer(TURNS) as server:
        result = compile_tickets(server.lm(), root_stateful_session=True, run_storage_dir=tmp_path)
    assert_completed(result)
    first, *rest = server.requests
    assert first.previous_response_id is None  # the stored ids belong to another server session
    assert resent_turns(first.text, "CODE") == [1, 2] and resent_turns(first.text, "OUT") == [1, 2]
    assert [r.previous_response_id for r in rest] == [first.response_id]
    assert resent_turns(rest[0].text, "OUT") == [3]


# -- rlm_multiturn_history ------------------------------------------------------------------------------------
@pytest.mark.slow
def test_multiturn_history_alternates_the_agent_and_the_repl_and_keeps_each_prefix():
    root = scripted_agent(TURNS)
    result = compile_tickets(root, root_stateful_session=False, rlm_multiturn_history=True)
    assert_completed(result)
    for k, call in enumerate(root.calls):
        assert [m["role"] for m in call] == ["system", *["user", "assistant"] * k, "user"]
        assistants = [m["content"] for m in call if m["role"] == "assistant"]
        users = [m["content"] for m in call if m["role"] == "user"]
        assert [resent_turns(text, "CODE") for text in assistants] == [[i] for i in range(1, k + 1)]
        assert [resent_turns(text, "OUT") for text in users] == [[]] + [[i] for i in range(1, k + 1)]
        assert "variables_info" in users[0] and all("variables_info" not in text for text in users[1:])
        # turn k+1 is turn k plus two messages, except for the optimizer state that closed turn k's last message
        # (what changes every turn is at the end): a provider's prompt cache reuses everything before it
        assert "=== Optimizer state" in users[-1] and all("=== Optimizer state" not in text for text in users[:-1])
        if k:
            previous = root.calls[k - 1]
            assert call[: len(previous) - 1] == previous[:-1]
            before_state = previous[-1]["content"].split("=== Optimizer state")[0]
            assert call[len(previous) - 1]["content"].startswith(before_state)


@pytest.mark.slow
@pytest.mark.parametrize("stateful", [False, True])
def test_multiturn_history_over_the_responses_api(stateful):
    with ResponsesServer(TURNS, reject_ids={"resp_0002"}) as server:
        result = compile_tickets(server.lm(), root_stateful_session=stateful, rlm_multiturn_history=True)
    assert_completed(result)
    requests = server.requests
    if not stateful:
        assert [r.roles for r in requests] == [["user", *["assistant", "user"] * k] for k in range(4)]
        assert all(r.previous_response_id is None and "instructions" in r.body for r in requests)
        return
    # chained turns send one user message; the full request after the refused id alternates
    assert [r.roles for r in requests] == [
        ["developer", "user"],
        ["user"],
        ["user"],
        ["developer", "user", "assistant", "user", "assistant", "user"],
        ["user"],
    ]
    assert resent_turns(requests[3].items[2][1], "CODE") == [1] and resent_turns(requests[3].items[5][1], "OUT") == [2]


def test_multiturn_history_speaks_the_configured_adapter():
    """With dspy.settings.adapter = JSONAdapter, history turns are JSON and replies are parsed as JSON."""
    sent: list[list[dict]] = []

    def reply(messages):
        sent.append(messages)
        return f'{{"reasoning": "r{len(sent)}", "code": "print({len(sent)})"}}'

    lm = FunctionLM(reply)
    session = TurnSender(stateful=False, multiturn=True, max_iters=5)
    signature = dspy.Signature(
        "variables_info: str, repl_history: str, iteration: str -> reasoning: str, code: str", "Work in the REPL."
    )
    history = REPLHistory()
    with dspy.context(adapter=JSONAdapter()):
        for _ in range(2):
            action = session.act(
                lm, signature, variables_info=["x"], history=history, iteration=f"{len(history) + 1}/5"
            )
            history = history.append(reasoning=action.reasoning, code=action.code, output="done")
    assert [e.code for e in history] == ["print(1)", "print(2)"]
    assert [m["role"] for m in sent[1]] == ["system", "user", "assistant", "user"]
    assert sent[1][2]["content"].lstrip().startswith("{") and '"reasoning": "r1"' in sent[1][2]["content"]


def test_the_tool_list_sends_each_tools_summary_and_help_prints_the_rest_in_the_repl():
    """Every request carries the tool list, so it holds one summary line per tool; the arguments' details, the
    result's keys and the costs are one ``help(tool)`` away, in the sandbox."""
    from rlmoptimizer.agent.prompts import tool_summary
    from rlmoptimizer.agent.tools import AgentTools
    from rlmoptimizer.agent.window import unbound_tools

    requests: list[str] = []
    turns = [
        {"reasoning": "read the tool", "code": "help(compare)\nhelp('compare')  # its name, quoted: the same"},
        SUBMIT_POLICY,
    ]

    def reply(messages):
        requests.append(str(messages[0]["content"]))
        return turns[min(len(requests) - 1, len(turns) - 1)]

    result = compile_tickets(
        FunctionLM(reply, name="root"), sub_lm=FunctionLM(lambda m: "{}"), max_iterations=1, rlm_autopilot="off"
    )
    detail = "stored records are free; refused if the budget cannot cover it all"
    assert detail in AgentTools.compare.__doc__
    assert "help(compare)" in requests[0]
    for tool in unbound_tools():  # every tool's summary is sent, and none of what help() adds to it
        summary, _, rest = " ".join(tool.__doc__.split()).partition(tool_summary(tool))
        assert not summary and f"{tool.__name__}(" in requests[0] and tool_summary(tool) in requests[0]
        assert not rest.strip() or rest.strip() not in requests[0], tool.__name__
    assert detail not in requests[0]
    shown = outputs(result)[0]
    assert "Help on function compare" in shown and "split='train'" in shown  # the signature, from the wrapper
    assert tool_summary(AgentTools.compare) in shown and shown.count(detail) == 2


@pytest.mark.parametrize(
    "reply",
    [
        "```python\n    x = 1\n    if x:\n        print(x)\n```",  # a block indented as a whole (a list item's)
        "    x = 1\n    if x:\n        print(x)",  # no fence
        "Here it is:\n```python\n  x = 1\n  if x:\n      print(x)\n",  # unclosed
    ],
)
def test_code_indented_as_a_whole_is_dedented_so_it_runs(reply):
    from rlmoptimizer.agent.cells import code_of

    code = code_of(reply)
    assert code.splitlines()[0] == "x = 1" and code.splitlines()[2].strip() == "print(x)"
    compile(code, "<cell>", "exec")  # no IndentationError


def test_a_memory_error_with_no_message_tells_the_agent_what_fills_the_memory():
    from rlmoptimizer.agent._dspy import CodeExecutionError
    from rlmoptimizer.agent.agent import OptimizerAgent

    shown = OptimizerAgent._error_text(CodeExecutionError("MemoryError: "))
    assert shown.startswith("[Error] MemoryError: the REPL's memory is full") and "del the large ones" in shown


def test_code_that_is_not_indented_keeps_the_whitespace_inside_its_strings():
    from rlmoptimizer.agent.cells import code_of

    code = 'update_prompt("route", """Rules:\n    \nAnswer tersely.""")'
    assert code_of(code) == code and code_of(f"```python\n{code}\n```") == code


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        ("```python\nx = 1\n```\nThen print it:\n```python\nprint(x)\n```", "x = 1\n\nprint(x)"),
        ("```\nx = 1\n```\nand\n```\nprint(x)\n```", "x = 1\n\nprint(x)"),  # bare blocks are the code
        ("```python\nprint(1)\n```\nIt prints:\n```\n1 candidate, score 0.5\n```", "print(1)"),  # bare: output
        ("```python\nx = 1\n```\n```text\nwhat it shows\n```\n```python\nprint(x)", "x = 1\n\nprint(x)"),
        ("Check:\n```\nprint(compare())\n```\nExpected output:\n```\nroute: 4/6 passed\n```", "print(compare())"),
        (
            "```\nrows = evaluate()\n```\nThen:\n```python\nprint(len(rows))\n```",
            "rows = evaluate()\n\nprint(len(rows))",
        ),
        (
            "```python\nupdate_prompt('route', '''Answer as:\n```json\n{}\n```\n''')\n```",
            "update_prompt('route', '''Answer as:\n```json\n{}\n```\n''')",
        ),
    ],
    ids=[
        "two python blocks",
        "two bare blocks",
        "python, then its output",
        "python, text, unclosed python",
        "bare code, then its output",
        "bare code, then python",
        "fences inside a string",
    ],
)
def test_a_reply_with_several_code_blocks_runs_them_in_order_as_one_cell(reply, expected):
    """Regression: only the first block ran and the agent was not told, so a second block's call never happened."""
    from rlmoptimizer.agent.cells import code_of

    assert code_of(reply) == expected


def test_a_reply_whose_blocks_are_all_in_another_language_is_refused_with_what_to_write():
    from rlmoptimizer.agent.cells import code_of

    with pytest.raises(SyntaxError, match="tagged ```bash: write Python in a ```python block"):
        code_of("```bash\nls\n```\n```text\nout\n```")


@pytest.mark.parametrize(
    ("reply", "left_out"),
    [
        ("```python\nx = 1\n```\nthen\n```\nprint(x\n```", "1 ``` block(s) after the first did not run"),
        ("```python\nprint(1)\n```\nIt prints:\n```\n1 candidate, score 0.5\n```", "1 ``` block(s)"),
        ("```python\nx = 1\n```\n```text\nwhat it shows\n```", ""),  # tagged as text: meant to be shown
        ("```python\nx = 1\n```\n```\nprint(x)\n```", ""),  # it parses: it runs
    ],
)
def test_a_bare_block_that_is_left_out_is_named_to_the_agent(reply, left_out):
    from rlmoptimizer.agent.cells import cell_of

    _, note = cell_of(reply)
    assert (left_out in note) if left_out else note == ""


def test_a_second_block_with_a_syntax_error_is_not_run_and_the_agent_is_told_why():
    """Regression: a reply's second block with a typo was dropped silently; the agent never saw its SyntaxError."""
    reply = "```python\nprint('first ran')\n```\nNow the check:\n```\nprint(evaluate_program(split='val')\n```"
    result = compile_tickets([{"reasoning": "two blocks", "code": reply}, SUBMIT_POLICY])
    first = outputs(result)[0]
    assert first.startswith("first ran")
    assert "did not run: it is not valid Python (" in first and "```python" in first
    assert "evaluate_program" not in result.agent_trajectory[0]["code"]  # the code that ran is what the turn shows


@pytest.mark.parametrize(
    ("reply", "reasoning", "runs"),
    [
        ("I will look first.\n```python\nprint(1)\n```", "I will look first.", "print(1)"),
        ("[[ ## reasoning ## ]]\nLook.\n```python\nprint(1)\n```\n[[ ## completed ## ]]", "Look.", "print(1)"),
        ("```py\nx = 1\n```\nthen\n```python\nprint(x)\n```", "", "x = 1\n\nprint(x)"),
        # a code field without the reasoning field (regression: retried three times, then dropped)
        ("[[ ## code ## ]]\nprint(1)\n\n[[ ## completed ## ]]", "", "print(1)"),
        ("Look first.\n[[ ## Code ## ]]\nx = 1\nprint(x)", "Look first.", "x = 1\nprint(x)"),
    ],
)
def test_a_reply_without_fields_but_with_a_python_block_is_read_as_its_action(reply, reasoning, runs):
    from rlmoptimizer.agent.cells import code_of, fenced_action

    found = fenced_action(reply)
    assert found is not None and found[0] == reasoning and code_of(found[1]) == runs


@pytest.mark.parametrize(
    "reply",
    [
        "no code at all",
        "Output:\n```\nprint(1)\n```",
        '```json\n{"a": 1}\n```',
        '{"code": "```python\\nprint(1)\\n```"}',
        "[[ ## code ## ]]\n\n[[ ## completed ## ]]",  # an empty code field
    ],
)
def test_a_reply_without_fields_or_a_python_block_is_no_action(reply):
    from rlmoptimizer.agent.cells import fenced_action

    assert fenced_action(reply) is None
