"""GEPA's reflective proposal, built on dspy's own ``dspy.teleprompt.gepa.InstructionProposer``: new
instructions for one step from that step's inputs and outputs on selected examples, their expected fields,
scores and metric feedback.

May import: dspy, ``rlmoptimizer.evaluation``, ``.budget``, ``.errors``, ``.fingerprint``, ``.records``,
``.storage`` and ``rlmoptimizer.moves``' ``_dspy``, ``analysis``, ``context`` and ``failures``.
"""

from __future__ import annotations

import contextvars
import json
import random
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import dspy

from rlmoptimizer.budget import SUB_LM_CALL, Reservation
from rlmoptimizer.evaluation.lm_failures import classify_lm_failure, failure_summary
from rlmoptimizer.fingerprint import instructions_digest, sha256_json
from rlmoptimizer.moves._dspy import InstructionProposer
from rlmoptimizer.moves.analysis import AnalysisMoves, group_guidance
from rlmoptimizer.moves.context import (
    MAX_PROPOSALS,
    MAX_REFLECTION_EXAMPLES,
    budget_spent,
    exhausted,
    refuse,
)
from rlmoptimizer.moves.failures import failure_step, reflects_on, unparsed_at
from rlmoptimizer.records import ExampleResult, StepTrace
from rlmoptimizer.storage.answers import AnswerStore
from rlmoptimizer.storage.layout import PROPOSALS


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, sort_keys=True)


def reflective_example(step: str, record: ExampleResult, format_failures: bool = True) -> dict[str, Any] | None:
    """One entry of GEPA's reflective dataset for ``step`` from a stored record, or None when the step did
    not run on that example.

    As ``dspy.GEPA`` builds it: the step's own inputs and generated outputs (its last call, when the program
    called it more than once) and a feedback text. When the metric wrote feedback (for this step, when it takes
    ``pred_name``: GEPA's form; else for the example), that text is the feedback, as ``dspy.GEPA`` gives it (so a
    GEPA run here reflects on what ``dspy.GEPA`` would show the same reflection LM), with the program's final output
    when it is not this step's and the error, if any. When it wrote none, the feedback is what GEPA's default ("This
    trajectory got a score of ...") leaves out: the score, the expected fields, the program's final output when it
    is not this step's, and the error.

    A call of ``step`` whose output did not parse is, with ``format_failures`` (``dspy.GEPA``'s
    ``add_format_failure_as_feedback``), the entry: its inputs, and the parse error (which holds the reply) as
    the feedback; without it, the example's other calls of the step, if any.
    """
    if format_failures and unparsed_at(record) == step:
        return {
            "Inputs": dict(record.failed_call.inputs),
            "Generated Outputs": "Couldn't parse the output as per the expected output format (the feedback holds "
            "the error, with the raw response).",
            "Feedback": f"Your output failed to parse, so the program raised {record.error}",
        }
    calls: list[StepTrace] = [s for s in record.steps if s.step_name == step]
    if not calls:
        return None
    call = calls[-1]
    feedback = call.feedback or record.feedback  # the metric's feedback for this step (pred_name), else the example's
    lines = []
    if not feedback:
        lines.append(f"Score: {record.score:g} ({'passed' if record.passed else 'did not pass'}).")
        if record.expected:
            lines.append(f"Expected (the example's labels): {_json(record.expected)}")
    if record.predicted and record.predicted != call.outputs:
        lines.append(f"The program's final output: {_json(record.predicted)}")
    if record.error:
        where = record.failed_call.step_name if record.failed_call is not None else None
        if where is None:
            lines.append(f"Error: {record.error}")
        elif where == step:
            lines.append(f"Error (raised by a later call of this step): {record.error}")
        else:
            lines.append(f"Error (raised by step {where!r}, after this step ran): {record.error}")
    if feedback:
        lines.append(feedback)
    return {"Inputs": dict(call.inputs), "Generated Outputs": dict(call.outputs), "Feedback": "\n".join(lines)}


def nth_sample(lm: Any, k: int) -> Any:
    """``lm`` for the first sample (``k`` = 0), else a copy whose requests carry dspy's rollout id ``k`` past the
    LM's own: asked the same prompt again, it answers a new sample, not dspy's cached reply to the first."""
    return lm if k == 0 else lm.copy(rollout_id=((lm.kwargs or {}).get("rollout_id") or 0) + k)


class ProposalTooLong(ValueError):
    """A proposal the LM answered (charged) with instructions longer than a step may have: no proposal."""


def ask_proposer(
    proposer: Any,
    lm: Any,
    step: str,
    text: str,
    dataset: list[dict[str, Any]],
    paid: Reservation,
    answered: Callable[[], None],
    too_long: Callable[[str, str], str | None] | None = None,
) -> Any:
    """One proposal of ``proposer`` (dspy's ``InstructionProposer``) for ``step``, now ``text``, from the reflective
    ``dataset``, asked of ``lm``. One unit of ``paid`` is spent when the LM answered, also with a reply that does
    not parse (it was a call), and ``answered()`` then puts the charge on disk at once (every move's sub-LM call
    comes through here: a process killed before the turn ends still has it); what failed is raised."""
    try:
        with dspy.context(lm=lm, trace=[]):  # the caller's dspy.settings.trace stays theirs
            new = proposer({step: text}, {step: dataset}, [step])[step]
    except Exception as exc:
        if classify_lm_failure(exc) is None:  # the LM answered (e.g. a reply that does not parse): a call
            paid.spend(1)
            answered()
        raise
    paid.spend(1)
    answered()
    why = too_long(step, str(new)) if too_long is not None and new is not None else None
    if why:
        raise ProposalTooLong(why)
    return new


def reply_of(error: BaseException) -> str:
    """What a proposal or reflection LM answered that gave no instructions, short: its reply if the error holds it."""
    reply = getattr(error, "lm_response", None)
    if reply is not None:
        text = " ".join(str(reply).split())
        return f"the reply {text[:160]!r}" + (" ..." if len(text) > 160 else "") + " did not parse"
    text = str(error).splitlines()[0] if str(error) else ""
    return f"{type(error).__name__}: {text[:160]}"


class ProposalMoves(AnalysisMoves):
    def _unpaid(self) -> Exception:
        """The refusal of a proposal no sub-LM prompt can be paid for."""
        if exhausted(self.ledger) or self.ledger.counts_toward_limit(SUB_LM_CALL):
            return budget_spent("propose_instructions", self.ledger)
        return refuse(
            f"propose_instructions: a proposal costs 1 sub-LM prompt and the {self.ledger.sub_lm_limit} allowed "
            "besides max_metric_calls are spent",
            "write instructions yourself with update_prompt and compare them, or SUBMIT",
        )

    # -- propose --------------------------------------------------------------------------------------
    def propose_instructions(
        self,
        step: str,
        run_id: str | None = None,
        ids: list[int] | None = None,
        n: int = 1,
        guidance: str = "",
        group: Any = None,
    ) -> dict[str, Any]:
        """GEPA's reflective proposal for ``step``: new instructions written by dspy's InstructionProposer
        from the step's inputs and outputs on the selected examples of a train run, their expected fields,
        scores and metric feedback. With ``group`` (a group of :meth:`analyze_failures`: the value, its dict, or
        the name or index of one of the latest analysis), the examples are a few of the group's and the proposer
        is told the group's causes; the candidates' lineage records the analysis, the group and its example ids
        (``made_for``). Changes nothing; 1 budget unit per proposal LM call that answered."""
        self._check_step(step, "propose_instructions")
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_PROPOSALS:
            raise refuse(
                f"n must be an int from 1 to {MAX_PROPOSALS}, got {n!r}", "pass n=1 (or a few more for alternatives)"
            )
        if guidance is None:
            guidance = ""
        if not isinstance(guidance, str):
            raise refuse(
                f"guidance must be a string, got {type(guidance).__name__}",
                "pass guidance='...' as text or leave it out",
            )
        if self.ledger.left_for(SUB_LM_CALL) == 0 or self.ledger.stop_reason:
            raise self._unpaid()  # before the examples: a refusal of them would send the agent to spend more
        made_for, notes = None, []
        if group is None:
            found = self._source(run_id, "propose_instructions")
            source, records = found.label, self._select_records(found.label, found.records, ids, step)
        else:
            source, records, guidance, made_for, notes = self._for_group(group, step, run_id, ids, guidance)
        dataset, skipped = [], []
        for record in records:
            entry = reflective_example(step, record)
            (dataset.append(entry) if entry is not None else skipped.append(record.example_id))
        elsewhere = sorted({unparsed_at(r) for r in records} - {None, step})
        if not dataset and elsewhere:
            raise refuse(
                f"step {step!r} left no call to reflect on in the selected examples of {source} (ids "
                f"{[r.example_id for r in records]}): the output of step(s) {elsewhere} did not parse there",
                f"propose for {elsewhere[0]!r} instead (its proposals read its replies that did not parse), or pick "
                f"examples where {step!r} ran",
            )
        if not dataset and records and all((r.error or "").startswith("AdapterParseError") for r in records):
            raise refuse(
                f"step {step!r} left no call to reflect on in the selected examples of {source} (ids "
                f"{[r.example_id for r in records]}): their outputs did not parse (AdapterParseError: the evaluation "
                "LM does not answer in the adapter's format)",
                "state the output format in the step's instructions yourself (update_prompt), or pick examples whose "
                "output parsed",
            )
        if not dataset:
            raise refuse(
                f"step {step!r} did not run on the selected examples of {source} (ids {[r.example_id for r in records]})",
                "pick examples where the step ran (see their 'steps'), or another step",
            )
        lm = self._lm()
        current = self._current()[step]
        proposer = InstructionProposer(additional_instructions=guidance.strip() or None)
        with self.ledger.reserve(n, SUB_LM_CALL) as reservation:
            if reservation.granted == 0:
                raise self._unpaid()
            # Each proposal of the compile() is its own sample: a second call on the same failures (the current
            # prompts won the comparison) gets a new text, not dspy's cached answer to the first.
            with self._naming:  # proposals in parallel threads: each its own samples
                first, self.proposal_calls = self.proposal_calls, self.proposal_calls + reservation.granted
            lms = [nth_sample(lm, first + i) for i in range(reservation.granted)]
            outcomes = self._propose_all(proposer, lms, step, current, dataset, reservation, guidance)
            spent = reservation.spent
        texts = [text for text, _, _ in outcomes if text is not None]
        errors = [error for _, error, _ in outcomes if error is not None]
        if not texts:
            unanswered = next((exc for _, _, exc in outcomes if exc is not None), None)
            raise refuse(
                f"the proposal LM gave no usable instructions ({len(errors)} of {len(outcomes)} asked): "
                f"{errors[0] if errors else 'no answer'}",
                "try again, pass guidance or other ids, or write the instructions yourself with update_prompt",
            ) from unanswered  # (a sub LM that gave no answer: the compile counts it, see agent.stop)
        unique = list(dict.fromkeys(texts))
        if reservation.granted < n:
            notes.append(f"budget allowed {reservation.granted} of {n} proposals")
        if len(unique) < len(texts):
            notes.append(f"{len(texts) - len(unique)} proposal(s) repeated another (the proposal LM samples little)")
        if errors:
            notes.append(f"{len(errors)} proposal(s) failed: {errors[0]}")
        if skipped:
            notes.append(f"step {step!r} did not run on example(s) {skipped}; they were left out")
        used = [r.example_id for r in records if r.example_id not in skipped]
        candidate_ids = []
        parent = self.name_of(self._current())
        parent_digest = instructions_digest(self._current())  # which instructions 'current' was, exactly
        for text in unique:
            with self._naming:
                candidate_ids.append(f"proposal-{sum(1 for k in self.proposals if k.startswith('proposal-')) + 1}")
                self.proposals[candidate_ids[-1]] = {step: text}
                self.lineage[candidate_ids[-1]] = {
                    "parents": [parent],
                    "move": "reflective proposal (propose_instructions)",
                    "steps": [step],
                    "reflected_on": used,
                    "from": source,
                    "parent_digests": [parent_digest],
                    **({"made_for": made_for} if made_for else {}),
                }
        checked = list(dict.fromkeys([*(made_for["example_ids"] if made_for else ()), *used]))
        return {
            "step": step,
            "from": source,
            "example_ids": used,
            "check_ids": checked + self._others(checked, unique),
            **({"made_for": made_for} if made_for else {}),
            "texts": unique,
            "candidates": [{step: text} for text in unique],
            "candidate_ids": candidate_ids,
            "budget_spent": spent,
            "budget_left": self.ledger.left,
            "note": "; ".join(notes) or None,
        }

    def _for_group(
        self, group: Any, step: str, run_id: Any, ids: Any, guidance: str
    ) -> tuple[str, list[ExampleResult], str, dict[str, Any], list[str]]:
        """A proposal for a group of an analysis: (where its records come from, a few of the group's failures where
        ``step`` ran, the guidance with the group's causes, its ``made_for`` lineage, notes)."""
        tool = "propose_instructions"
        if ids is not None:
            raise refuse(f"{tool}: pass group= or ids=, not both", "leave ids out: the examples are the group's")
        analysis, chosen = self.failure_group(group, tool)
        source, by_id = self.group_records(analysis, run_id, tool)
        members = [by_id[i] for i in chosen.example_ids if i in by_id]
        if not members:
            raise refuse(
                f"{tool}: {source} hold none of the examples of group {chosen.name!r} ({list(chosen.example_ids)})",
                "leave run_id out (the records the analysis was made from), or analyse again",
            )
        ran = [r for r in members if reflects_on(r, step)] or members
        if len(ran) > MAX_REFLECTION_EXAMPLES:  # a few of them, another sample each call
            rng = random.Random(self.proposal_calls)
            ran = sorted(rng.sample(ran, MAX_REFLECTION_EXAMPLES), key=lambda r: r.example_id)
        notes = []
        if analysis.instructions_digest != instructions_digest(self._current()):
            notes.append(f"{analysis.analysis_id} was made on other instructions than the current ones")
        text = group_guidance(analysis, chosen) + (f"\n\n{guidance.strip()}" if guidance.strip() else "")
        made_for = {"analysis": analysis.analysis_id, "group": chosen.name, "example_ids": list(chosen.example_ids)}
        return source, ran, text, made_for, notes

    def _propose_all(
        self, proposer, lms, step, current, dataset, reservation: Reservation, guidance: str
    ) -> list[tuple[str | None, str | None, BaseException | None]]:
        kept = self._kept_proposals()
        prompt = json.dumps([step, current, dataset, guidance], sort_keys=True, default=repr)

        def one(lm) -> tuple[str | None, str | None, BaseException | None]:
            key, _ = kept.key_for(prompt)  # the n-th asking of this prompt in this compile
            stored = kept.get(key)
            if stored is not None:  # answered before a resume: replayed, not paid again
                return stored, None, None
            try:
                text = ask_proposer(proposer, lm, step, current, dataset, reservation, self._answered, self.too_long)
            except Exception as exc:  # the LM answered with nothing usable (its reply shown), or did not answer
                if classify_lm_failure(exc) is None:
                    return None, reply_of(exc), None
                return None, failure_summary(exc), exc  # (no answer: the error goes with the refusal)
            kept.put(key, text)
            return text, None, None

        if len(lms) == 1:
            return [one(lms[0])]
        with ThreadPoolExecutor(max_workers=len(lms), thread_name_prefix="rlmoptimizer-propose") as pool:
            futures = [pool.submit(contextvars.copy_context().run, one, lm) for lm in lms]
            return [f.result() for f in futures]

    def _kept_proposals(self) -> AnswerStore:
        """The proposal LM's answers, kept in the run directory: the same proposal asked again after a resume (the
        turn that asked it was cut off) is replayed, not paid again."""
        with self._naming:  # opened once: a second store would count the same prompt's askings again from 0
            if self.kept_proposals is None:
                directory = getattr(getattr(self.runs, "store", None), "directory", None)
                self.kept_proposals = AnswerStore(directory, name=PROPOSALS)
            return self.kept_proposals

    def _others(self, used: list[int], texts: list[str]) -> list[int]:
        """A random sample of other train ids, as many as ``used`` (at least 5): the check that a proposal
        fixing these failures breaks nothing else. Drawn from the proposal itself (its examples and texts): the same
        proposal replayed after a resume draws the same ids, whose stored records are then reused, not paid again
        (a count of stored runs, which the killed process had changed, drew others)."""
        rest = [i for i in range(len(self.runs.splits["train"])) if i not in set(used)]
        rng = random.Random(int(sha256_json([sorted(used), texts])[:16], 16))
        return sorted(rng.sample(rest, min(len(rest), max(5, len(used)))))

    def _select_records(
        self, source: str, by_id: dict[int, ExampleResult], ids: list[int] | None, step: str
    ) -> list[ExampleResult]:
        """The examples to reflect on: ``ids``, or a sample of the failures ``step`` ran on (a failure that raised
        before it, or took another branch, leaves it nothing to reflect on; when every failure did, the refusal names
        their errors, unless some are the step's own output that did not parse, which the caller refuses with what
        can help)."""
        if ids is None:
            failed = [r for r in by_id.values() if not r.passed]
            if not failed:
                raise refuse(
                    f"{source} show no failures to learn from",
                    "evaluate new examples first (evaluate_program(sample='random', limit=10, seed=1)), pass "
                    "ids=[...] of examples to reflect on, or run_id= of a run with failures",
                )
            ran = [r for r in failed if reflects_on(r, step)]
            order = list(self._current())
            unparsed = [  # (kept before the call that raised was: no inputs to reflect on)
                r for r in failed if (r.error or "").startswith("AdapterParseError") and failure_step(r, order) == step
            ]
            if not ran and unparsed:
                return unparsed[:MAX_REFLECTION_EXAMPLES]  # the step's own output did not parse: refused below
            if not ran:
                errors = Counter((r.error or "a wrong output").split(":", 1)[0] for r in failed)
                raise refuse(
                    f"step {step!r} ran on none of the {len(failed)} failure(s) of {source} "
                    f"({', '.join(f'{error} on {n}' for error, n in errors.most_common(3))}), which no instructions "
                    f"of {step!r} can change",
                    "pass ids=[...] of other examples to reflect on; an example that raises is the program's or its "
                    "LM's to fix",
                )
            failed = ran
            if len(failed) > MAX_REFLECTION_EXAMPLES:  # another sample each call: the next proposal learns from others
                rng = random.Random(self.proposal_calls)
                failed = sorted(rng.sample(failed, MAX_REFLECTION_EXAMPLES), key=lambda r: r.example_id)
            return failed
        wanted = self._example_ids("train", ids, "propose_instructions")
        missing = [i for i in wanted if i not in by_id]
        if missing:
            raise refuse(
                f"example(s) {missing} were not evaluated in {source}",
                f"pick ids from {sorted(by_id)}, or pass run_id= of a run that evaluated them",
            )
        return [by_id[i] for i in wanted]
