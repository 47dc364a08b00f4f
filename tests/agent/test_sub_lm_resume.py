"""What the agent's ``llm_query`` / ``llm_query_batched`` paid for is kept: the cell of a turn an interrupt cut short
runs again on resume and gets its answers back free; an interrupt in a batch charges and keeps the prompts that
were answered."""

from __future__ import annotations

import threading

import pytest
from support.fakes import system_text
from support.optimizing import POLICY_PROMPT, SUBMIT_CURRENT, compile_tickets
from support.tickets import task_lm_reply

from rlmoptimizer.agent.sub_lm import sub_lm_tools
from rlmoptimizer.budget import SUB_LM_CALL, BudgetLedger
from rlmoptimizer.events import NO_OBSERVER
from rlmoptimizer.storage.answers import AnswerStore
from rlmoptimizer.storage.notes import NotesStore
from rlmoptimizer.testing import FunctionLM


def tools(sub, ledger, directory, turn="turn 1", workers=1, max_llm_calls=50):
    return sub_lm_tools(
        sub,
        max_llm_calls=max_llm_calls,
        ledger=ledger,
        usage=None,
        observer=NO_OBSERVER,
        as_sub=lambda fn: fn,
        answers=AnswerStore(directory),
        max_workers=workers,
        scope=lambda: turn,
    )


def test_an_answer_paid_before_an_interrupt_is_replayed_free_in_the_same_order(tmp_path):
    calls = []
    sub = FunctionLM(lambda messages: calls.append(1) or f"answer {len(calls)}", name="sub")
    ledger = BudgetLedger(10)
    first = tools(sub, ledger, tmp_path)
    assert [first["llm_query"]("q"), first["llm_query"]("q")] == ["answer 1", "answer 2"]
    assert ledger.snapshot()["spent_by_kind"][SUB_LM_CALL] == 2

    again = tools(sub, ledger, tmp_path)  # a resumed compile: the same cell asks the same prompts again
    assert [again["llm_query"]("q"), again["llm_query"]("q"), again["llm_query"]("q")] == [
        "answer 1",
        "answer 2",
        "answer 3",  # a third asking is a new question: paid
    ]
    assert len(calls) == 3 and ledger.snapshot()["spent_by_kind"][SUB_LM_CALL] == 3
    # another turn asking the same prompt asks afresh: only the turn an interrupt cut short gets its answers back
    assert tools(sub, ledger, tmp_path, turn="turn 2")["llm_query"]("q") == "answer 4"


def test_an_interrupt_in_a_batch_charges_and_keeps_the_prompts_answered(tmp_path):
    asked = []
    lock = threading.Lock()

    def reply(messages):
        text = str(messages[-1]["content"])
        with lock:
            asked.append(text)
        if text == "p2" and asked.count("p2") == 1:
            raise KeyboardInterrupt  # Ctrl-C while the batch runs (its second prompt)
        return f"re {text}"

    sub = FunctionLM(reply, name="sub")
    ledger = BudgetLedger(10)
    with pytest.raises(KeyboardInterrupt):
        tools(sub, ledger, tmp_path)["llm_query_batched"](["p0", "p1", "p2", "p3"])
    paid = ledger.snapshot()["spent_by_kind"][SUB_LM_CALL]
    answered = [p for p in ("p0", "p1", "p3") if p in asked]
    assert paid == len(answered) >= 2  # every answered prompt is charged (none was before)

    out = tools(sub, ledger, tmp_path)["llm_query_batched"](["p0", "p1", "p2", "p3"])
    assert out == ["re p0", "re p1", "re p2", "re p3"]
    assert sorted(asked) == sorted(["p0", "p1", "p2", "p3", "p2", *[p for p in ("p3",) if p not in answered]])
    assert ledger.snapshot()["spent_by_kind"][SUB_LM_CALL] == 4  # each prompt paid once


def test_an_interrupt_while_a_batch_is_still_being_submitted_charges_and_keeps_the_prompts_that_started(
    tmp_path, monkeypatch
):
    """Regression: the answers were charged by callbacks attached after every prompt was submitted; a Ctrl-C while
    the pool was still starting its threads left the prompts already running paid but neither charged nor kept,
    and the resume paid them again."""
    from concurrent.futures import ThreadPoolExecutor

    from rlmoptimizer.agent import sub_lm

    asked = []
    lock = threading.Lock()
    sub = FunctionLM(lambda messages: _asked(asked, lock, messages), name="sub")

    class Pool(ThreadPoolExecutor):
        submitted = 0

        def submit(self, *args, **kwargs):
            if Pool.submitted == 2:  # the third prompt is never submitted: Ctrl-C
                raise KeyboardInterrupt
            Pool.submitted += 1
            return super().submit(*args, **kwargs)

    monkeypatch.setattr(sub_lm, "ThreadPoolExecutor", Pool)
    ledger = BudgetLedger(10)
    with pytest.raises(KeyboardInterrupt):
        tools(sub, ledger, tmp_path, workers=4)["llm_query_batched"](["p0", "p1", "p2"])
    assert sorted(asked) == ["p0", "p1"] and ledger.snapshot()["spent_by_kind"][SUB_LM_CALL] == 2
    monkeypatch.setattr(sub_lm, "ThreadPoolExecutor", ThreadPoolExecutor)
    out = tools(sub, ledger, tmp_path, workers=4)["llm_query_batched"](["p0", "p1", "p2"])
    assert out == ["re p0", "re p1", "re p2"]
    assert sorted(asked) == ["p0", "p1", "p2"] and ledger.snapshot()["spent_by_kind"][SUB_LM_CALL] == 3


def _asked(asked: list, lock: threading.Lock, messages) -> str:
    text = str(messages[-1]["content"])
    with lock:
        asked.append(text)
    return f"re {text}"


def test_a_note_kept_already_is_not_kept_twice(tmp_path):
    notes = NotesStore(tmp_path)
    notes.add("the policy words matter")
    assert "note 1 kept already" in notes.add("the policy words matter ")
    assert [n["text"] for n in NotesStore(tmp_path).all()] == ["the policy words matter"]


@pytest.mark.slow
def test_a_turn_cut_short_by_ctrl_c_pays_its_llm_query_once_over_the_resume(tmp_path):
    """Regression: the resumed turn ran its cell again and paid llm_query a second time (and kept its note twice)."""
    sub_calls = []
    sub = FunctionLM(lambda messages: sub_calls.append(1) or "a short answer", name="sub")
    turns = [
        {
            "reasoning": "ask, note and evaluate",
            "code": "a = llm_query('Summarize the routing policy in one line.')\nadd_note('the policy words matter')\n"
            f"update_prompt('route', {POLICY_PROMPT!r})\nprint(evaluate_program(split='val')['score'])",
        },
        SUBMIT_CURRENT,
    ]
    seen = {"n": 0}

    def interrupted(messages):
        if POLICY_PROMPT[:40] in system_text(messages):  # the turn's validation run, after llm_query was paid
            seen["n"] += 1
            if seen["n"] == 3:
                raise KeyboardInterrupt
        return task_lm_reply(messages)

    directory = tmp_path / "run"
    with pytest.raises(BaseException):  # noqa: B017 (OptimizationInterrupted)
        compile_tickets(turns, eval_lm=FunctionLM(interrupted), sub_lm=sub, run_storage_dir=directory, num_threads=1)
    assert len(sub_calls) == 1
    result = compile_tickets(turns, sub_lm=sub, run_storage_dir=directory, num_threads=1)
    assert len(sub_calls) == 1 and result.budget["spent_by_kind"]["sub_lm_call"] == 1
    assert len(NotesStore(directory).all()) == 1


def test_a_second_ctrl_c_while_a_batch_waits_for_its_running_prompts_loses_no_paid_answer(tmp_path):
    """Regression: the first Ctrl-C waited for the prompts still running before charging what was answered, and a
    second one during that wait left every answered prompt unpaid and unkept (paid again on resume)."""
    import os
    import signal
    import time

    inside = threading.Event()

    def interrupt_when_inside(signum, frame):
        if inside.is_set():  # (outside the call a stray signal is ignored, so the test process never stops)
            raise KeyboardInterrupt

    def reply(messages):
        text = str(messages[-1]["content"])
        if text == "p0":  # the user presses Ctrl-C, then again while the batch waits for p3
            time.sleep(0.2)
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.3)
            os.kill(os.getpid(), signal.SIGINT)
        elif text == "p3":
            time.sleep(2.0)
        return f"re {text}"

    ledger = BudgetLedger(10)
    previous = signal.signal(signal.SIGINT, interrupt_when_inside)
    batch = tools(FunctionLM(reply, name="sub"), ledger, tmp_path, workers=4)["llm_query_batched"]
    try:
        inside.set()
        with pytest.raises(KeyboardInterrupt):
            batch(["p0", "p1", "p2", "p3"])
    finally:
        inside.clear()
        deadline = time.time() + 10
        while ledger.snapshot()["spent_by_kind"].get(SUB_LM_CALL, 0) < 4 and time.time() < deadline:
            time.sleep(0.1)  # p3 still running after the second Ctrl-C: its answer is paid when it comes
        signal.signal(signal.SIGINT, previous)
    assert ledger.snapshot()["spent_by_kind"][SUB_LM_CALL] == 4 and len(AnswerStore(tmp_path)) == 4


def test_prompts_the_spending_cap_cannot_pay_are_refused_by_their_own_size_before_they_are_sent(tmp_path):
    """Regression: a prompt was priced at the role's average so far (nothing before the first), so a first batch of
    30 prompts of 100k tokens cost 150x max_cost_usd, and a long prompt after a short one 5x."""
    from dspy.lm15 import Usage

    from rlmoptimizer.usage import SUB, UsageMeter, price_of_call

    model = "openai/gpt-4o-mini"
    sent = []

    def reply(messages):
        sent.append(len(str(messages[-1]["content"])))
        return "ok"

    sub = FunctionLM(
        reply, name=model, usage=lambda messages, text: Usage(input_tokens=len(str(messages[-1]["content"])) // 4)
    )
    one_short = float(price_of_call(model, 250, 0))
    meter = UsageMeter(max_cost_usd=one_short * 40)
    ledger = BudgetLedger(100)
    query = sub_lm_tools(
        sub,
        max_llm_calls=50,
        ledger=ledger,
        usage=meter,
        observer=NO_OBSERVER,
        as_sub=lambda lm: meter.in_role(SUB, lm),
        answers=AnswerStore(tmp_path),
    )
    with pytest.raises(RuntimeError, match=r"the spending cap: 30 prompt\(s\) of 1,200,000 characters would cost"):
        query["llm_query_batched"](["x" * 40_000] * 30)
    assert sent == [] and ledger.spent == 0 and not meter.cap_reached  # nothing sent or charged; smaller ones may go
    assert query["llm_query"]("x" * 1_000) == "ok"
    with pytest.raises(RuntimeError, match="nothing was sent or charged"):
        query["llm_query"]("x" * 1_000_000)  # the average so far (one short prompt) would have let it through
    assert query["llm_query_batched"](["y" * 1_000] * 3) == ["ok"] * 3
    assert sent == [1_000] * 4 and ledger.spent == 4


def test_prompts_the_sub_lm_gave_no_answer_to_count_against_neither_the_budget_nor_the_call_ceiling(tmp_path):
    """Regression: rlm_max_llm_calls counted every prompt sent, answered or not, while the budget counted only the
    answered ones: after 150 prompts of which 50 failed, 60 more were refused as 150 + 60 > 200."""
    import dspy

    def reply(messages):  # down for the prompts that say so, even after dspy's retries
        if "down" in str(messages):
            return dspy.LMServerError("503 Service Unavailable", model="sub", status=503)
        return "an answer"

    ledger = BudgetLedger(100)
    query = tools(FunctionLM(reply, name="sub"), ledger, tmp_path, max_llm_calls=6)
    answers = query["llm_query_batched"](["p0", "p1", "down 2", "p3", "p4", "down 5"])
    assert sum(a.startswith("[ERROR]") for a in answers) == 2
    assert ledger.snapshot()["spent_by_kind"][SUB_LM_CALL] == 4
    with pytest.raises(dspy.LMServerError):
        query["llm_query"]("down, alone")  # no answer: not counted either
    assert query["llm_query"]("two more") and query["llm_query"]("fits")  # 4 + 2 answered: within 6
    assert ledger.snapshot()["spent_by_kind"][SUB_LM_CALL] == 6
    with pytest.raises(RuntimeError, match=r"LLM call limit exceeded: 6 \+ 1 > 6"):
        query["llm_query"]("one too many")
