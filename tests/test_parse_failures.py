"""A task LM that answers out of format: compile() in the loop mode, through the real evaluation stack, learns
from the replies that did not parse (dspy.GEPA leaves them out by default, and so do GEPA's runs here)."""

from __future__ import annotations

import json

import dspy
import pytest
from support.tickets import TICKETS

from rlmoptimizer import RLMDocstringOptimizer
from rlmoptimizer.testing import FunctionLM, last_user_text, system_text

FORMAT_RULE = "Answer with the queue field only, under its [[ ## queue ## ]] header."


def task_reply(messages):
    """Right about every ticket, but on the tickets of an odd length it replies in prose (no fields: the adapter
    cannot parse it) unless the instructions state the format."""
    ticket = last_user_text(messages).split("[[ ## ticket ## ]]", 1)[1].split("Respond with", 1)[0].strip()
    queue = dict(TICKETS)[ticket]
    if len(ticket) % 2 and FORMAT_RULE not in system_text(messages):
        return f"This one is for the {queue} team, I think."
    return {"queue": queue}


def proposal_reply(messages):
    """The sub LM: the format rule when it is shown a reply that did not parse, else a text that changes nothing."""
    asked = "\n".join(str(m.get("content", "")) for m in messages)
    text = FORMAT_RULE if "Your output failed to parse" in asked else "Route the ticket to the right queue."
    return json.dumps({"new_instruction": text})


def metric(example, prediction, trace=None):
    return float(example.queue == (prediction.queue or "").strip().lower())


@pytest.mark.parametrize("gepa_reads_them", [False, True])
def test_the_loop_learns_the_output_format_from_the_replies_that_did_not_parse(tmp_path, gepa_reads_them):
    """GEPA's runs leave a step's replies that did not parse out of its reflections, as dspy.GEPA does, so the
    targeted proposal after GEPA finds the format; with dspy.GEPA's add_format_failure_as_feedback=True, GEPA's
    own reflections read them and find it."""
    examples = [dspy.Example(ticket=t, queue=q).with_inputs("ticket") for t, q in TICKETS]
    train, val = examples[:10], examples[10:]
    unparsed = [e for e in val if len(e.ticket) % 2]
    assert 3 <= len(unparsed) < len(val)  # the start fails these, and only these
    task_lm, sub_lm = FunctionLM(task_reply), FunctionLM(proposal_reply)
    optimized = RLMDocstringOptimizer(
        metric,
        max_metric_calls=80,
        rlm_autopilot="loop",
        sub_lm=sub_lm,
        eval_lm=task_lm,
        num_threads=1,
        run_storage_dir=str(tmp_path / "run"),
        add_format_failure_as_feedback=gepa_reads_them,
    ).compile(dspy.Predict("ticket -> queue"), trainset=train, valset=val)
    assert optimized.signature.instructions == FORMAT_RULE
    assert optimized.detailed_results.total_metric_calls <= 80
    selection = optimized.selection
    assert selection["submission_score"] == 1.0 and selection["baseline_score"] == 1 - len(unparsed) / len(val)
    runs = [json.loads(p.read_text()) for p in sorted((tmp_path / "run" / "runs").glob("run-*.json"))]
    found_by_gepa = any(r["label"] == "gepa" and FORMAT_RULE in r["instructions"].values() for r in runs)
    assert found_by_gepa is gepa_reads_them
    # the records keep the call that raised: the program's one step (a bare Predict is step 'self')
    baseline = json.loads((tmp_path / "run" / "runs" / f"{selection['candidates'][0]['run_id']}.json").read_text())
    failed = [r for r in baseline["records"] if r["error"]]
    assert len(failed) == len(unparsed) and all(r["failed_call"]["step_name"] == "self" for r in failed)
    assert all(r["error"].startswith("AdapterParseError") for r in failed)
