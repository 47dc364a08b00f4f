"""compile() keeps going through what goes wrong inside the agent loop: a cell that runs forever, a sandbox
that dies, a budget that runs out, a root-LM reply that does not parse."""

from __future__ import annotations

import json

import dspy
import litellm
import pytest
from support.fakes import FunctionLM, scripted_agent
from support.optimizing import SUBMIT_POLICY, compile_tickets, outputs
from support.tickets import POLICY_PROMPT

from rlmoptimizer.errors import OptimizationInterrupted

pytestmark = pytest.mark.slow  # every test here runs compile() with a real sandbox


def test_a_cell_that_runs_too_long_is_stopped_and_the_run_goes_on():
    result = compile_tickets(
        [
            {"reasoning": "keep something", "code": "notes = ['a', 'b']\nprint('ok')"},
            {"reasoning": "oops", "code": "while True:\n    pass"},
            {"reasoning": "still here?", "code": "print(len(baseline_train['examples']), 'notes' in dir())"},
            SUBMIT_POLICY,
        ],
        # the endless loop's limit; every other cell (a restart's first among them) stays far below it on a loaded
        # machine, as it did not below 3 s
        sandbox_timeout_s=10,
    )
    timed_out, after = outputs(result)[1:3]
    assert "notes" in timed_out and "restart" in timed_out.lower()
    assert after.strip() == "12 False"
    assert result.optimized_dspy_program["route"] == POLICY_PROMPT


def test_a_killed_sandbox_is_restarted_with_the_data_and_the_agent_is_told():
    result = compile_tickets(
        [
            {"reasoning": "keep something", "code": "mine = 42\nprint(mine)"},
            {"reasoning": "kill it", "code": "import js\njs.Deno.exit(3)"},
            {"reasoning": "data back?", "code": "print(baseline_train['score'], step_names)"},
            SUBMIT_POLICY,
        ]
    )
    died, after = outputs(result)[1:3]
    assert "mine" in died
    assert "['summarize.predict', 'route']" in after
    assert result.optimized_dspy_program["route"] == POLICY_PROMPT


def test_budget_exhaustion_evaluates_what_fits_and_the_agent_can_still_submit():
    # budget = 1 * 12 + 8 = 20 units
    result = compile_tickets(
        [
            {
                "reasoning": "spend",
                "code": f"update_prompt('route', {POLICY_PROMPT!r})\n"
                "a = evaluate_program()\nprint('a', a['evaluated_count'], a['budget_left'])",
            },
            {
                "reasoning": "more",
                "code": "update_prompt('route', 'Answer with the queue name.')\n"
                "b = evaluate_program()\nprint('b', b['evaluated_count'], b['note'])",
            },
            {
                "reasoning": "sub-lm",
                "code": "try:\n    llm_query('hi')\nexcept Exception as e:\n    print('refused', e)",
            },
            {"reasoning": "status", "code": "s = optimization_status()\nprint('left', s['budget_left'])"},
            SUBMIT_POLICY,
        ],
        max_iterations=1,
    )
    out = outputs(result)
    assert out[0].split() == ["a", "12", "8"]
    assert out[1].startswith("b 8 ") and "budget" in out[1]
    assert "refused" in out[2] and "budget" in out[2].lower()
    assert out[3].strip() == "left 0"
    assert result.budget["spent"] == result.budget["limit"] == 20
    # the submission could not be paid for: it was evaluated on validation for free, and it won
    assert result.optimized_dspy_program["route"] == POLICY_PROMPT


def test_sub_lm_calls_are_charged_to_the_budget():
    sub = FunctionLM(lambda messages: "short answer")
    result = compile_tickets(
        [
            {"reasoning": "ask", "code": "print(llm_query_batched(['a', 'b', 'c']))\nprint(llm_query('d'))"},
            SUBMIT_POLICY,
        ],
        sub_lm=sub,
        max_iterations=1,
    )
    assert result.budget["spent_by_kind"]["sub_lm_call"] == 4
    assert len(sub.calls) == 4
    assert "short answer" in outputs(result)[0]


class _NoTextSometimes(FunctionLM):
    """A sub LM that answers 'no text' prompts with an output that holds no text (as a provider may, e.g. a reply
    that is only a tool call): the call was made and answered."""

    def __call__(self, prompt=None, *, messages=None, **kwargs):
        if prompt is not None and "no text" in prompt:
            self.calls.append([{"role": "user", "content": prompt}])
            return [None]
        return super().__call__(prompt, messages=messages, **kwargs)


def test_a_failed_prompt_of_a_batch_is_its_own_error_and_every_answered_call_is_charged():
    def reply(messages):
        if "rate limited" in str(messages[-1]["content"]):  # no answer this time: not charged
            return dspy.LMRateLimitError("slow down", model="sub", provider="fake")
        return "short answer"

    sub = _NoTextSometimes(reply)
    result = compile_tickets(
        [
            {
                "reasoning": "ask",
                "code": "r = llm_query_batched(['one', 'no text', 'rate limited', 'two'])\nprint([x[:16] for x in r])",
            },
            SUBMIT_POLICY,
        ],
        sub_lm=sub,
        max_iterations=1,
    )
    out = outputs(result)[0]
    assert out.count("short answer") == 2 and out.count("[ERROR]") == 2  # every prompt has its answer or error
    assert {call[0]["content"] for call in sub.calls} == {"one", "no text", "rate limited", "two"}
    assert result.budget["spent_by_kind"]["sub_lm_call"] == 3  # the two answers and the one without text


@pytest.mark.parametrize("code", ["print(llm_query('why'))", "print(llm_query_batched(['why', 'how']))"])
def test_a_sub_lm_that_cannot_be_used_stops_the_run_after_the_turn_that_met_it(code, tmp_path):
    """Regression: a bad key met by llm_query was an error in the agent's cell and nothing more; a small root LM
    asked again every turn and the run ended as a result."""
    bad_key = FunctionLM(lambda messages: dspy.LMAuthError("Incorrect API key provided", model="gpt-4o"))
    turns = [{"reasoning": "ask", "code": code}, {"reasoning": "again", "code": code}, SUBMIT_POLICY]
    with pytest.raises(OptimizationInterrupted, match="the sub LM is unusable: LMAuthError") as stopped:
        compile_tickets(turns, sub_lm=bad_key, max_iterations=1, run_storage_dir=tmp_path / "run")
    assert "sub_lm=" in str(stopped.value) and str(tmp_path / "run") in str(stopped.value)
    prompts = len(bad_key.calls)
    assert prompts == (1 if "batched" not in code else 2)  # the second turn never ran
    saved = [json.loads(path.read_text()) for path in sorted((tmp_path / "run" / "turns").glob("turn-*.json"))]
    assert len(saved) == 1 and "LMAuthError" in saved[0]["output"]  # the turn the agent saw it in is kept


def test_a_sub_lm_prompt_that_fails_once_does_not_stop_the_run():
    def reply(messages):
        return dspy.LMRateLimitError("slow down", model="sub", provider="fake")

    result = compile_tickets(
        [{"reasoning": "ask", "code": "print(llm_query('why'))"}, SUBMIT_POLICY],
        sub_lm=FunctionLM(reply),
        max_iterations=1,
    )
    assert "LMRateLimitError" in outputs(result)[0]
    assert result.optimized_dspy_program["route"] == POLICY_PROMPT


def test_sub_lm_calls_are_on_disk_before_the_turn_ends(tmp_path):
    """A process killed in the middle of a turn must not forget sub-LM calls it already paid for: the ledger and
    usage.json on disk count each llm_query / llm_query_batched as soon as it is answered, not at the turn's end."""
    seen_on_disk: list[tuple[int, int]] = []

    def sub_reply(messages):
        ledger = json.loads((tmp_path / "ledger.json").read_text())
        usage = json.loads((tmp_path / "usage.json").read_text()) if (tmp_path / "usage.json").exists() else {}
        seen_on_disk.append((ledger["spent_by_kind"].get("sub_lm_call", 0), usage.get("sub", {}).get("calls", 0)))
        return "short answer"

    compile_tickets(
        [
            {
                "reasoning": "ask",
                "code": "print(llm_query_batched(['a', 'b']))\nprint(llm_query('c'))\nprint(llm_query('d'))",
            },
            SUBMIT_POLICY,
        ],
        sub_lm=FunctionLM(sub_reply),
        run_storage_dir=tmp_path,
        max_iterations=1,
    )
    # all in one turn: the batch of 2 is on disk when 'c' is asked, and 'c' when 'd' is
    assert [spent for spent, _ in seen_on_disk] == [0, 0, 2, 3]
    assert [calls for _, calls in seen_on_disk][2:] == [2, 3]


def test_a_root_reply_that_does_not_parse_is_shown_to_the_agent_and_the_run_goes_on():
    result = compile_tickets(
        [
            "this reply has no fields at all",
            SUBMIT_POLICY,
        ]
    )
    first = outputs(result)[0]
    assert "could not be parsed" in first
    assert result.optimized_dspy_program["route"] == POLICY_PROMPT
    assert len(result.agent_trajectory) == 2


def test_a_root_reply_with_a_python_block_but_no_fields_runs_without_a_retry():
    """Regression: a model that answered as in a chat (prose, then a ```python block, no field headers) was asked
    again twice for the same turn, then shown an error; the code it wrote never ran."""
    turns = [
        "Let me check the budget first.\n```python\nprint('left', optimization_status()['budget_left'])\n```",
        SUBMIT_POLICY,
    ]
    root = scripted_agent(turns)
    result = compile_tickets(root)
    first = outputs(result)[0]
    assert "no [[ ## code ## ]] field" in first and "\nleft " in first
    assert result.agent_trajectory[0]["reasoning"] == "Let me check the budget first."
    assert len(root.calls) == 2  # one call a turn: nothing retried
    assert result.optimized_dspy_program["route"] == POLICY_PROMPT


OUT_OF_TURNS = [
    {"reasoning": "look", "code": "print(baseline_train['score'])"},
    {"reasoning": "edit", "code": f"update_prompt('route', {POLICY_PROMPT!r})\nprint('edited')"},
    {"reasoning": "check", "code": "print(optimization_status()['budget_left'])"},
]


def test_the_warning_for_an_unusable_extraction_does_not_carry_the_whole_reply(caplog):
    long_reply = "I cannot decide. " * 400  # 6,800 characters that are no output fields
    compile_tickets([{"reasoning": "look", "code": "print(1)"}, long_reply], rlm_max_iterations=1)
    (warning,) = [r.getMessage() for r in caplog.records if "could not be extracted" in r.getMessage()]
    assert "I cannot decide." in warning and len(warning) < 1_000


def test_out_of_turns_with_an_unusable_extraction_submits_the_current_instructions(tmp_path):
    # After the last turn the scripted root LM answers the extraction with a code turn, which does not parse.
    result = compile_tickets(OUT_OF_TURNS, rlm_max_iterations=3, run_storage_dir=tmp_path / "run")
    assert [turn["iteration"] for turn in result.agent_trajectory] == [1, 2, 3, 4]  # 4: how the run ended
    assert result.agent_trajectory[-1]["code"] == "" and result.agent_trajectory[-1]["final"]
    assert "extraction failed" in result.agent_final_reasoning
    assert result.optimized_dspy_program["route"] == POLICY_PROMPT  # the agent's edit, kept: it wins on val
    assert result.selection["chosen_label"] == "submission"
    assert result.selection["reason"].startswith("the agent's current instructions (its run ended without a SUBMIT)")
    # the finished run is read back as it ended: no agent turn, no extraction asked again, the same reason
    again = compile_tickets(scripted_agent([]), rlm_max_iterations=3, run_storage_dir=tmp_path / "run")
    assert again.selection["reason"] == result.selection["reason"]
    assert again.optimized_dspy_program == result.optimized_dspy_program


def test_out_of_turns_with_a_usable_extraction_submits_what_was_extracted(tmp_path):
    extracted = {
        "reasoning": "the policy",
        "optimized_dspy_program": {"route": POLICY_PROMPT + " Answer with the queue name only."},
    }
    result = compile_tickets([*OUT_OF_TURNS, extracted], rlm_max_iterations=3, run_storage_dir=tmp_path / "run")
    assert result.agent_final_reasoning == "Extract forced final output"
    assert result.selection["reason"].startswith("the output extracted from the agent's turns (it ran out of turns)")
    assert result.optimized_dspy_program["route"] == POLICY_PROMPT + " Answer with the queue name only."
    # read back as it ended: the extraction is not asked again (a second answer could differ)
    root = scripted_agent([])
    again = compile_tickets(root, rlm_max_iterations=3, run_storage_dir=tmp_path / "run")
    assert not root.calls and again.optimized_dspy_program == result.optimized_dspy_program
    assert again.selection["reason"] == result.selection["reason"]


def test_a_reply_only_json_can_parse_is_retried_with_the_same_prompt_before_the_json_fallback():
    json_turn = '{"reasoning": "look", "code": "print(len(step_names))"}'  # no [[ ## ]] fields: ChatAdapter fails
    root = scripted_agent([json_turn, SUBMIT_POLICY])
    result = compile_tickets(root)
    assert outputs(result)[0].strip() == "2"  # parsed in the end, by the JSON fallback
    first_turn = [call for call in root.calls if "=== Step " not in str(call)]
    # three attempts with the very same prompt (a prefix cache reuses it), then the last one's JSON fallback
    assert len(first_turn) == 4
    assert first_turn[0] == first_turn[1] == first_turn[2]
    assert "Respond with a JSON object" not in str(first_turn[0])
    assert "Respond with a JSON object" in str(first_turn[3])


def test_a_root_lm_that_answers_in_json_is_offered_the_json_fallback_at_once_after_its_first_turn():
    """Regression: a model that always answers in JSON cost four root calls every turn (three ChatAdapter attempts
    with the same prompt, then the JSON fallback): about four times the bill of a model that writes the fields."""
    turns = [
        '{"reasoning": "look", "code": "print(len(step_names))"}',
        '{"reasoning": "again", "code": "print(len(step_names) + 1)"}',
        '{"reasoning": "submit", "code": "SUBMIT(optimized_dspy_program=optimization_status()[\'current_prompts\'])"}',
    ]
    root = scripted_agent(turns)
    result = compile_tickets(root)
    assert [o.strip() for o in outputs(result)[:2]] == ["2", "3"] and result.agent_trajectory[-1]["final"]
    assert len(root.calls) == 4 + 2 + 2  # the first turn finds it out; later ones: the chat attempt, then JSON


def test_a_chat_reply_that_parses_on_its_last_attempt_does_not_switch_later_turns_to_the_fallback():
    """A reply that parsed as the chat format on the last attempt says nothing of JSON: later turns keep paying one
    call an attempt (the fallback's call only on the last)."""
    calls = []

    def reply(messages):
        calls.append(1)
        if len(calls) == 3:  # the first turn parses on its third attempt, in the chat format
            return {"reasoning": "look", "code": "print(len(step_names))"}
        return "I think we should look at the data first."

    root = FunctionLM(reply, name="late")
    result = compile_tickets(root, max_iterations=7, rlm_max_iterations=30, rlm_autopilot="off")
    assert outputs(result)[0].strip() == "2"
    assert len(root.calls) == 3 + 3 * (3 + 1)  # then three turns that never parse, as for any model


def test_a_window_smaller_than_the_fixed_prompt_stops_at_once_saying_so():
    """Regression: a root LM whose real window is smaller than the agent's fixed prompt was asked four times with
    requests of the same length (the history compacted to 1% of the limit, the fixed part unchanged), and the run
    stopped with the provider's bare ContextWindowExceededError, which said nothing of what to change."""
    import litellm

    from rlmoptimizer import ConfigurationError

    def small_window(messages):
        return litellm.ContextWindowExceededError(message="maximum context length is 1000 tokens", model="m",
                                                  llm_provider="openai")  # fmt: skip

    root = FunctionLM(small_window, name="small")
    with pytest.raises(ConfigurationError, match=r"its fixed part alone .* takes [\d,]+ characters") as stopped:
        compile_tickets(root, rlm_autopilot="off")
    assert "rlm_autopilot='loop'" in str(stopped.value) and len(root.calls) == 2


def test_half_a_character_in_a_cells_output_is_shown_escaped_and_the_run_goes_on(tmp_path):
    """Regression: a cell that printed a lone surrogate (half of an emoji: an LM's JS-style escape, a string sliced
    in the middle) stopped compile(): the turn's record could not be written as UTF-8, and no provider takes such a
    text in a request. The output is now shown escaped, and the next request is valid."""
    root = scripted_agent(
        [
            {"reasoning": "print", "code": "s = 'rocket \\ud83d\\ude80'[:8]\nprint(s)\nprint('half: \\ud83d')"},
            SUBMIT_POLICY,
        ]
    )
    result = compile_tickets(root, run_storage_dir=tmp_path / "run")
    printed = outputs(result)[0]
    assert "rocket \\ud83d" in printed and "half: \\ud83d" in printed  # what was there, escaped
    assert result.optimized_dspy_program["route"] == POLICY_PROMPT
    second_request = json.dumps(root.calls[1], ensure_ascii=False)
    second_request.encode("utf-8")  # valid Unicode: a provider can receive it
    assert "half: \\\\ud83d" in second_request  # the turn as the agent sees it
    turns = sorted((tmp_path / "run" / "turns").glob("*.json"))
    assert turns and "half: \\\\ud83d" in turns[0].read_text(encoding="utf-8")


def test_a_reply_cut_off_at_max_tokens_is_named_to_the_agent():
    """Regression: a reply the root LM's output limit cut inside a long string was shown only as a SyntaxError, so
    the agent sent the same long cell again."""
    long_text = "Route by policy. " * 40
    turns = [
        {"reasoning": "state it", "code": f"update_prompt('route', {long_text!r}"},  # cut before its end
        {"reasoning": "short", "code": "print(optimization_status()['budget']['left'] > 0)"},
        {"reasoning": "submit", "code": "SUBMIT(optimized_dspy_program=optimization_status()['current_prompts'])"},
    ]
    played = scripted_agent(turns)
    root = FunctionLM(
        played.fn,
        name="cut-root",
        finish_reason=lambda messages, text: "length" if "update_prompt" in text else "stop",
    )
    said = outputs(compile_tickets(root))
    assert "[Error]" in said[0] and "cut off at the root LM's output limit (max_tokens)" in said[0]
    assert "cut off" not in said[1]  # only the reply that was cut


def test_a_reply_cut_off_before_its_code_is_named_in_the_error_turn():
    turns = [
        "[[ ## reasoning ## ]]\nFirst I will look at every failure of the baseline and then write a very long",
        {"reasoning": "submit", "code": "SUBMIT(optimized_dspy_program=optimization_status()['current_prompts'])"},
    ]
    played = scripted_agent(turns)
    root = FunctionLM(
        played.fn, name="cut-root", finish_reason=lambda messages, text: "length" if "[[" in text else "stop"
    )
    said = outputs(compile_tickets(root))
    assert said[0].startswith("[Note] Your reply was cut off") and "could not be parsed" in said[0]


def _prose(messages):
    return "I think we should look at the data first."  # never the turn's fields


def test_a_root_lm_whose_replies_never_parse_is_asked_for_three_turns_then_the_run_ends_saying_why():
    """Regression: a root LM that never wrote the turn's format was asked for every one of rlm_max_iterations turns,
    each retried (802 calls and 8.2M input tokens with the default 200 turns), and the run ended saying nothing of
    why. Now, after three such turns, the root LM is not asked again and the run ends with the current instructions,
    saying why (with "assist" the default loop takes a phase after each such turn, and has submitted by then)."""
    root = FunctionLM(_prose, name="prose")
    result = compile_tickets(root, max_iterations=7, rlm_max_iterations=30, rlm_autopilot="off")
    turns = result.agent_trajectory
    assert len(root.calls) == 3 * (3 + 1)  # three turns: three attempts each, the last with dspy's JSON fallback
    assert all("could not be parsed" in turn["output"] for turn in turns[:3])
    assert len(turns) == 3 + 1 and turns[-1]["final"] and turns[-1]["code"] == ""
    assert "did not parse in 3 turns in a row" in result.agent_final_reasoning
    assert result.selection["chosen_label"] == "baseline"


def test_the_agents_own_turns_count_toward_max_cost_usd_and_stop_it_once_it_is_spent():
    """Regression: only evaluations and sub-LM prompts were checked against the cap: a root LM priced at a tenth of
    the cap a call was asked 242 times for a $0.50 cap ($2.54 spent, cap_reached False)."""
    model = "openai/gpt-4o-mini"
    per_call = litellm.cost_per_token(model=model, prompt_tokens=100_000, completion_tokens=0)[0]
    from dspy.lm15 import Usage

    looking = {"reasoning": "look", "code": "print(len(baseline_train['examples']))"}
    root = FunctionLM(
        lambda messages: looking, name=model, usage=lambda messages, text: Usage(input_tokens=100_000, output_tokens=0)
    )
    result = compile_tickets(root, max_iterations=2, rlm_autopilot="off", max_cost_usd=per_call * 2.5)
    assert len(root.calls) == 3  # the third call spent the cap: no turn after it
    assert result.usage["cap_reached"] is True and result.usage["root"]["cost_usd"] == pytest.approx(3 * per_call)
    assert "the agent was stopped at once, since its turns are LM calls too" in result.agent_final_reasoning
    assert "spending cap reached" in result.selection["reason"]


def test_a_last_turn_that_spends_the_cap_is_not_followed_by_an_extraction_call():
    """The run out of turns asks the root LM once more to extract its outputs: not once that LM spent the cap."""
    model = "openai/gpt-4o-mini"
    per_call = litellm.cost_per_token(model=model, prompt_tokens=100_000, completion_tokens=0)[0]
    from dspy.lm15 import Usage

    looking = {"reasoning": "look", "code": "print(len(baseline_train['examples']))"}
    root = FunctionLM(
        lambda messages: looking, name=model, usage=lambda messages, text: Usage(input_tokens=100_000, output_tokens=0)
    )
    result = compile_tickets(root, rlm_max_iterations=2, rlm_autopilot="off", max_cost_usd=per_call * 1.5)
    assert len(root.calls) == 2  # both turns; the second spent the cap, and no extraction was asked for
    assert "spending cap reached" in result.agent_final_reasoning and "ran out of turns" in result.agent_final_reasoning
    assert result.usage["root"]["cost_usd"] == pytest.approx(2 * per_call)


def test_a_reply_that_does_not_parse_is_not_asked_for_again_once_the_cap_is_spent():
    model = "openai/gpt-4o-mini"
    per_call = litellm.cost_per_token(model=model, prompt_tokens=100_000, completion_tokens=0)[0]
    from dspy.lm15 import Usage

    root = FunctionLM(
        lambda messages: "no fields here",
        name=model,
        usage=lambda messages, text: Usage(input_tokens=100_000, output_tokens=0),
    )
    result = compile_tickets(root, rlm_autopilot="off", max_cost_usd=per_call * 1.5)
    assert len(root.calls) == 2  # the retry that spent the cap, then nothing (a turn has up to 3 attempts)
    assert "parsed after 2 attempt(s)" in result.agent_trajectory[0]["output"]
    assert "spending cap reached" in result.agent_final_reasoning


def test_a_cell_that_prints_megabytes_is_kept_as_its_head_and_tail(tmp_path):
    """Regression: a cell's whole output was kept in the history, the trajectory and the run directory: cells
    printing 30 MB each grew the host by hundreds of MB and the run directory by 29 MB a turn. In "assist" the
    pilot's line after such an output did not cut it a second time (two notes, the second with a wrong length)."""
    result = compile_tickets(
        [
            {"reasoning": "dump", "code": "print('START' + 'x' * 3_000_000 + 'END')"},
            SUBMIT_POLICY,
        ],
        run_storage_dir=tmp_path,
        sub_lm=FunctionLM(lambda messages: json.dumps({"new_instruction": POLICY_PROMPT}), name="proposer"),
        rlm_autopilot="assist",
    )
    output = result.agent_trajectory[0]["output"]
    assert output.startswith("[this output had 3,000,009 characters: its middle 2,900,116 were not kept]\nSTART")
    assert output.count("[this output had") == 1 and output.count("END") == 1
    printed, pilot = output.split("\n[pilot] ", 1)
    assert printed.rstrip().endswith("END") and 99_800 < len(printed) <= 100_000  # the bound, note included
    assert pilot.startswith("this turn spent nothing") and "[this output had" not in pilot
    kept = [path.stat().st_size for path in (tmp_path / "turns").rglob("*") if path.is_file()]
    assert kept and sum(kept) < 1_000_000
    assert result.optimized_dspy_program["route"] == POLICY_PROMPT


def test_a_kept_output_is_kept_again_as_it_is():
    """A resumed run appends its earlier turns again: their outputs, already kept, are not cut a second time."""
    from rlmoptimizer.agent.texts import kept_output as _kept_output

    once = _kept_output("a" * 500_000 + "b" * 500_000, max_output_chars=12_000)
    assert 119_800 < len(once) <= 120_000 and once.startswith("[this output had 1,000,000 characters")
    assert _kept_output(once, max_output_chars=12_000) == once
